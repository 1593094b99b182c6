"""llama_bench.py — a ~110M-parameter Llama, full fine-tuning and LoRA: onyx against PyTorch 2.13
eager (+ PEFT 0.21 for LoRA), side by side in one run.

  build/venv/bin/python bench/llama_bench.py [--steps 5] [--warmup 2] [--seq 128] [--batch 4]
      [--threads 0] [--out build/bench-llama]

The model: LlamaConfig(hidden 768, 12 layers, 12 heads over 4 key/value heads, intermediate 2048,
vocab 32000, untied lm_head) — 110M parameters — random init (Transformers'), saved with
save_pretrained; the data: random tokens (labels = input_ids). Every peer runs AdamW lr 1e-4,
weight decay 0, clipping at 1.0, one step per batch, the same batches in order:
  onyx full     `onyx train FOLDER` (all parameters)
  onyx LoRA     the same with `lora: {r: 16, lora_alpha: 32, target_modules: [q_proj, k_proj,
                v_proj, o_proj]}`
  onyx LoRA bf16 base   and with `model_init_kwargs: {dtype: bfloat16}`: the frozen linear
                weights (lm_head too) stored in bf16, multiplied with bf16 inputs and float32
                accumulation; activations, adapters and the optimizer float32
  torch full    LlamaForCausalLM (sdpa attention, Transformers' default) in eager mode
  torch LoRA    peft.get_peft_model with the same LoraConfig
  torch LoRA bf16 base  the base loaded with dtype=torch.bfloat16 (what TRL's model_init_kwargs
                does), PEFT's adapters float32 (its autocast_adapter_dtype default): bf16
                activations through the whole model
Also the bf16 GEMM ceiling of this run: oneDNN bf16 matmul (bf16 in, float32 out) against
float32 sgemm on the 512×768×2048 shape of the MLP (`onyx_bench` if built, else skipped).
onyx's steady step time is the difference of train_runtime between a run of warmup + steps
optimizer steps and one of warmup steps (graph building and start-up cancel out); PyTorch's is the
median of the steps after the warmup ones. Peak RSS is GNU time's maximum resident set size of
each process. Prints a Markdown table and writes OUT/llama_results.json.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import train_bench as tb  # noqa: E402
ONYX = os.environ.get("ONYX", os.path.join(ROOT, "build", "onyx"))
LORA = {"r": 16, "lora_alpha": 32, "lora_dropout": 0.0,
        "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}


def timed(cmd, env=None):
    """Runs cmd under GNU time; returns (stdout, stderr, peak RSS MiB)."""
    p = subprocess.run(["/usr/bin/time", "-f", "MAXRSS %M"] + cmd, capture_output=True,
                       text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd[:4])}... exited {p.returncode}: {p.stderr[-1500:]}")
    m = re.search(r"MAXRSS (\d+)", p.stderr)
    return p.stdout, p.stderr, int(m[1]) / 1024.0 if m else float("nan")


TORCH_SCRIPT = r"""
import json, statistics, sys, time, torch, transformers as tr
from safetensors.numpy import load_file
folder, data, steps, warmup, threads, lora = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6] == "1"
if threads > 0: torch.set_num_threads(threads)
bf16 = len(sys.argv) > 9 and sys.argv[9] == "1"
m = tr.LlamaForCausalLM.from_pretrained(folder, dtype=torch.bfloat16 if bf16 else torch.float32)
if lora:
    import peft
    m = peft.get_peft_model(m, peft.LoraConfig(**json.loads(sys.argv[7]), bias="none", task_type="CAUSAL_LM"))
m.train()
d = load_file(data)
params = [p for p in m.parameters() if p.requires_grad]
opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.0)
B = int(sys.argv[8])
times, losses = [], []
for s in range(warmup + steps):
    batch = {k: torch.tensor(v[s * B:(s + 1) * B]) for k, v in d.items()}
    t0 = time.perf_counter()
    loss = m(**batch).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step(); opt.zero_grad(set_to_none=True)
    times.append(time.perf_counter() - t0); losses.append(loss.item())
print(json.dumps({"step_s": statistics.median(times[warmup:]), "losses": losses,
                  "trainable": sum(p.numel() for p in params)}))
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--threads", type=int, default=0, help="0: all cores")
    ap.add_argument("--out", default=os.path.join(ROOT, "build", "bench-llama"))
    args = ap.parse_args()
    import numpy as np
    import torch
    import transformers as tr
    from safetensors.numpy import save_file
    os.makedirs(args.out, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="llama-", dir=args.out)
    cfg = tr.LlamaConfig(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                         num_key_value_heads=4, intermediate_size=2048, vocab_size=32000,
                         max_position_embeddings=1024, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = tr.LlamaForCausalLM(cfg)
    n_params = sum(p.numel() for p in model.parameters())
    folder = os.path.join(tmp, "model")
    model.save_pretrained(folder)
    del model
    total = args.warmup + args.steps
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 32000, (args.batch * total, args.seq)).astype(np.int64)
    data = os.path.join(tmp, "train.safetensors")
    save_file({"input_ids": ids, "attention_mask": np.ones_like(ids), "labels": ids}, data)
    threads = args.threads or os.cpu_count()
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    rows = []

    def onyx_run(name, lora, steps, bf16=False):
        out = os.path.join(tmp, f"{name}-{steps}")
        c = {"model": folder, "train_data": data, "output_dir": out, "max_steps": steps,
             "per_device_train_batch_size": args.batch, "learning_rate": 1e-4,
             "weight_decay": 0.0, "max_grad_norm": 1.0, "lr_scheduler_type": "constant",
             "logging_steps": 1, "save_strategy": "no", "disable_tqdm": True,
             "train_sampling_strategy": "sequential"}
        if lora:
            c["lora"] = LORA
        if bf16:
            c["model_init_kwargs"] = {"dtype": "bfloat16"}
        path = out + ".yaml"
        with open(path, "w") as f:
            for k, v in c.items():
                f.write(f"{k}: {json.dumps(v)}\n")
        _, _, rss = timed([ONYX, "--threads", str(threads), "train", path], env)
        with open(os.path.join(out, "log_history.jsonl")) as f:
            logs = [json.loads(l) for l in f if l.strip()]
        return logs[-1]["train_runtime"], [l["loss"] for l in logs if "loss" in l], rss

    for name, lora, bf16 in (("onyx full", False, False), ("onyx LoRA", True, False),
                             ("onyx LoRA bf16 base", True, True)):
        t_w, _, _ = onyx_run(name.replace(" ", "-"), lora, args.warmup, bf16)
        t_all, losses, rss = onyx_run(name.replace(" ", "-"), lora, total, bf16)
        rows.append({"peer": name, "step_s": (t_all - t_w) / args.steps, "rss_mib": rss,
                     "first_loss": losses[0], "last_loss": losses[-1]})
        print(f"{name}: {rows[-1]['step_s']:.3f} s/step", flush=True)
    for name, lora, bf16 in (("torch full", False, False), ("torch + PEFT LoRA", True, False),
                             ("torch + PEFT LoRA bf16 base", True, True)):
        out, _, rss = timed([sys.executable, "-c", TORCH_SCRIPT, folder, data, str(args.steps),
                             str(args.warmup), str(threads), "1" if lora else "0",
                             json.dumps(LORA), str(args.batch), "1" if bf16 else "0"], env)
        r = json.loads(out.strip().splitlines()[-1])
        rows.append({"peer": name, "step_s": r["step_s"], "rss_mib": rss,
                     "first_loss": r["losses"][0], "last_loss": r["losses"][-1]})
        print(f"{name}: {r['step_s']:.3f} s/step", flush=True)
    tokens = args.batch * args.seq
    print(f"\nLlama {n_params / 1e6:.0f}M parameters (hidden 768, 12 layers, GQA 12:4), batch "
          f"{args.batch} × seq {args.seq}, {threads} threads, {args.steps} steady steps\n")
    print("| peer | s/step | tokens/s | peak RSS (MiB) | loss step 1 → last |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['peer']} | {r['step_s']:.3f} | {tokens / r['step_s']:.0f} | "
              f"{r['rss_mib']:.0f} | {r['first_loss']:.4f} → {r['last_loss']:.4f} |")
    full = rows[3]["step_s"] / rows[0]["step_s"]
    lora = rows[4]["step_s"] / rows[1]["step_s"]
    lora16 = rows[5]["step_s"] / rows[2]["step_s"]
    print(f"\nonyx vs PyTorch: full fine-tune {full:.2f}×, LoRA {lora:.2f}×, LoRA with a bf16 base "
          f"{lora16:.2f}× (> 1: onyx faster); onyx LoRA bf16 base vs onyx LoRA "
          f"{rows[1]['step_s'] / rows[2]['step_s']:.2f}×, vs PyTorch float32 LoRA "
          f"{rows[4]['step_s'] / rows[2]['step_s']:.2f}×; LoRA peak memory "
          f"{rows[1]['rss_mib'] / rows[0]['rss_mib']:.2f}× of full (onyx; "
          f"{rows[2]['rss_mib'] / rows[0]['rss_mib']:.2f}× with the bf16 base), "
          f"{rows[4]['rss_mib'] / rows[3]['rss_mib']:.2f}× (PyTorch; "
          f"{rows[5]['rss_mib'] / rows[3]['rss_mib']:.2f}×)")
    ceiling = tb.gemm_ceilings(os.path.join(ROOT, "build", "onyx_bench"), env=env)
    if ceiling:
        print("GEMM ceiling this run (512×768 · 768×2048, GFLOP/s): " +
              ", ".join(f"{k} {v:.0f}" for k, v in ceiling.items()))
    with open(os.path.join(args.out, "llama_results.json"), "w") as f:
        json.dump({"params": n_params, "batch": args.batch, "seq": args.seq, "threads": threads,
                   "rows": rows, "speedup_full": full, "speedup_lora": lora,
                   "speedup_lora_bf16_base": lora16, "gemm_ceiling_gflops": ceiling}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
