"""PyTorch on the GPU, the side onyx's CUDA backend is measured against (issue #37): the bf16 GEMM
ceiling (torch.matmul at 8192^3) and training steps of GPT-2 124M (bf16 autocast, seq 1024) and
BERT-base (seq 128), eager and under torch.compile, with Transformers' models from their configs
(random init: no download) and fused AdamW as Transformers' Trainer uses on CUDA. Reports
tokens/s, MFU against the ceiling measured in the same run (6·N + 12·L·d·T FLOPs per token, as
llm.c counts them) and peak device memory; writes --out as JSON. Run by scripts/device_check.sh."""
import argparse
import json
import time

import torch


def gemm_ceiling(n=8192, reps=10):
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    torch.cuda.synchronize()
    return 2 * n**3 * reps / (time.perf_counter() - t0) / 1e12


def make_model(name):
    import transformers as tf

    if name == "gpt2":
        cfg = tf.GPT2Config()
        return tf.GPT2LMHeadModel(cfg), cfg.n_layer, cfg.n_embd, 1024, 8
    cfg = tf.BertConfig()
    return tf.BertForMaskedLM(cfg), cfg.num_hidden_layers, cfg.hidden_size, 128, 32


def train(name, compiled, steps, warmup):
    torch.manual_seed(0)
    model, layers, width, seq, batch = make_model(name)
    model = model.cuda().train()
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    fwd = torch.compile(model) if compiled else model
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (batch, seq), device="cuda")
    torch.cuda.reset_peak_memory_stats()

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fwd(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    t_compile = time.perf_counter()
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    t_compile = time.perf_counter() - t_compile
    t0 = time.perf_counter()
    for _ in range(steps):
        loss = step()
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / steps
    tokens = batch * seq
    flops_per_token = 6 * params + 12 * layers * width * seq
    return {
        "model": name, "compiled": compiled, "batch": batch, "seq": seq, "params": params,
        "step_s": dt, "tokens_per_s": tokens / dt, "flops_per_token": flops_per_token,
        "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30,
        "warmup_s": t_compile, "loss": float(loss),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--models", default="gpt2,bert")
    ap.add_argument("--no-compile", action="store_true")
    a = ap.parse_args()
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    res["bf16_gemm_tflops"] = gemm_ceiling()
    print(f"{res['device']}  torch {res['torch']}  bf16 GEMM 8192^3: {res['bf16_gemm_tflops']:.0f} TFLOP/s", flush=True)
    runs = []
    for name in a.models.split(","):
        for compiled in ([False] if a.no_compile else [False, True]):
            r = train(name, compiled, a.steps, warmup=3)
            r["mfu"] = r["tokens_per_s"] * r["flops_per_token"] / (res["bf16_gemm_tflops"] * 1e12)
            runs.append(r)
            print(f"{name:5s} {'compile' if compiled else 'eager  '} b{r['batch']} s{r['seq']}: "
                  f"{r['tokens_per_s']:9.0f} tok/s  {r['step_s']*1e3:7.1f} ms/step  MFU {r['mfu']*100:5.1f}%  "
                  f"peak {r['peak_mem_gib']:.2f} GiB  (warm-up {r['warmup_s']:.0f} s)", flush=True)
            torch.cuda.empty_cache()
            res["runs"] = runs
            with open(a.out, "w") as f:  # after each run: a time limit keeps what finished
                json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
