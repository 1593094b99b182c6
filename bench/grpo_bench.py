"""grpo_bench.py — GRPO's two costs on the CPU, onyx against TRL 1.16 + PyTorch 2.13 eager, side
by side in one run on the same model, tokenizer and prompts:

  rollout  a generation batch — P prompts × G completions of exactly N new tokens (sampling,
           temperature 1, top_k 0, eos suppressed by min_new_tokens so both do the same work):
           `onyx generate --timings` (prefill + decoding steps: onyx's KV-cache generator, the one
           onyx's GRPO samples with) against Transformers' generate (what TRL's GRPOTrainer calls
           without vLLM); completions per second
  step     a whole GRPO optimizer step (sampling, a length reward, the loss and its gradient,
           AdamW): onyx.GRPOTrainer against trl.GRPOTrainer with the same GRPOConfig (float32,
           no gradient checkpointing, beta 0.04: the reference pass included); seconds per step
           over S steps after one warm-up step

The model: a random LlamaConfig(hidden 256, 4 layers, 8 heads over 4 key/value heads,
intermediate 688) with GPT-2's tokenizer (../shared/data/gpt2-tokenizer, vocab 50257). The
hardware ceiling in the same run: PyTorch's float32 GEMM GFLOP/s on (1024 × 1024) · (1024 × 1024).

  build/venv/bin/python bench/grpo_bench.py [--prompts 4] [--generations 8] [--new 32]
      [--steps 3] [--threads 0] [--out build/bench-grpo]

Prints a Markdown table and writes OUT/grpo_results.json.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

import torch
import transformers as tr

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ONYX = os.environ.get("ONYX", os.path.join(REPO, "build", "onyx"))
TOKENIZER = os.path.join(os.path.dirname(REPO), "shared", "data", "gpt2-tokenizer")
WORDS = ["river", "stone", "cloud", "light", "bread", "glass", "paper", "metal", "music", "garden",
         "window", "forest", "winter", "candle", "bridge", "island"]


def make_model(tmp):
    tok = tr.GPT2TokenizerFast(os.path.join(TOKENIZER, "vocab.json"),
                               os.path.join(TOKENIZER, "merges.txt"))
    tok.pad_token = tok.eos_token
    tok_dir = os.path.join(tmp, "model")
    cfg = tr.LlamaConfig(vocab_size=len(tok), hidden_size=256, intermediate_size=688,
                         num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
                         max_position_embeddings=512, bos_token_id=tok.eos_token_id,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    tr.LlamaForCausalLM(cfg).save_pretrained(tok_dir)
    tok.save_pretrained(tok_dir)
    return tok, tok_dir


def rollout_onyx(model_dir, prompts, G, N, tmp):
    path = os.path.join(tmp, "prompts.jsonl")
    with open(path, "w") as f:
        for p in prompts:
            for _ in range(G):
                f.write(json.dumps({"prompt": p}) + "\n")
    p = subprocess.run([ONYX, "generate", model_dir, "--prompts", path, "--batch_size",
                        str(len(prompts) * G), "--max_new_tokens", str(N), "--min_new_tokens",
                        str(N), "--do_sample", "--top_k", "0", "--temperature", "1.0", "--timings",
                        "--output", os.path.join(tmp, "out.jsonl")], capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"onyx generate failed: {p.stderr[-800:]}")
    m = re.search(r"prefill ([\d.]+) ms; (\d+) decoding steps, ([\d.]+) ms/step", p.stderr)
    return (float(m[1]) + int(m[2]) * float(m[3])) / 1e3


def rollout_torch(model_dir, tok, prompts, G, N):
    model = tr.AutoModelForCausalLM.from_pretrained(model_dir).eval()
    tok.padding_side = "left"
    batch = tok([p for p in prompts for _ in range(G)], return_tensors="pt", padding=True)
    kw = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=N,
              min_new_tokens=N, pad_token_id=tok.eos_token_id)
    with torch.no_grad():
        model.generate(**batch, **dict(kw, max_new_tokens=2, min_new_tokens=2))  # warm-up
        t0 = time.perf_counter()
        out = model.generate(**batch, **kw)
        secs = time.perf_counter() - t0
    assert out.shape[1] - batch["input_ids"].shape[1] == N
    return secs


def reward_len(completion_ids, **kwargs):
    return [-abs(len(c) - 16) / 16.0 for c in completion_ids]


def grpo_args(cls, out, P, G, N, steps, **extra):
    return cls(output_dir=out, report_to=[], per_device_train_batch_size=P * G, num_generations=G,
               max_completion_length=N, max_steps=steps + 1, learning_rate=1e-5, logging_steps=1,
               save_strategy="no", disable_tqdm=True, seed=0, bf16=False,
               gradient_checkpointing=False, beta=0.04, shuffle_dataset=False, **extra)


class StepClock:
    """Seconds per optimizer step after the first (on_step_end times)."""
    def __init__(self):
        self.times = []

    def on_step_end(self, args, state, control, **kwargs):
        self.times.append(time.perf_counter())

    def per_step(self):
        d = [b - a for a, b in zip(self.times, self.times[1:])]
        return sum(d) / len(d)


def step_trl(model_dir, tok, rows, P, G, N, steps, tmp):
    import datasets
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    clock = StepClock()
    cb = type("Clock", (TrainerCallback,), {"on_step_end": clock.on_step_end})()
    args = grpo_args(GRPOConfig, os.path.join(tmp, "trl"), P, G, N, steps, use_cpu=True)
    model = tr.AutoModelForCausalLM.from_pretrained(model_dir)
    t = GRPOTrainer(model=model, reward_funcs=reward_len, args=args, processing_class=tok,
                    train_dataset=datasets.Dataset.from_list(rows), callbacks=[cb])
    t.generation_config.min_new_tokens = N  # the same work as onyx's below: N tokens each
    t.train()
    return clock.per_step()


def step_onyx(model_dir, tok, rows, P, G, N, steps, tmp):
    sys.path.insert(0, os.path.join(REPO, "tests", "python"))
    import test_package
    test_package.build_package()
    sys.path.insert(0, test_package.TARGET)
    import onyx
    clock = StepClock()
    cb = type("Clock", (onyx.TrainerCallback,), {"on_step_end": clock.on_step_end})()
    args = grpo_args(onyx.GRPOConfig, os.path.join(tmp, "onyx"), P, G, N, steps)
    t = onyx.GRPOTrainer(model=model_dir, reward_funcs=reward_len, args=args,
                         processing_class=tok, train_dataset=rows, callbacks=[cb])
    t.train()
    return clock.per_step()


def gemm_gflops():
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    a @ b
    t0 = time.perf_counter()
    for _ in range(20):
        a @ b
    return 20 * 2 * 1024 ** 3 / (time.perf_counter() - t0) / 1e9


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--generations", type=int, default=8)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--out", default=os.path.join(REPO, "build", "bench-grpo"))
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
        os.environ["OMP_NUM_THREADS"] = str(a.threads)
    os.makedirs(a.out, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="onyx-grpo-bench-")
    tok, model_dir = make_model(tmp)
    P, G, N = a.prompts, a.generations, a.new
    prompts = [f"Question: what is a {w}? Answer:" for w in WORDS[:P]]
    rows = [{"prompt": p} for p in prompts] * (a.steps + 1)
    res = {"prompts": P, "generations": G, "new_tokens": N, "threads": torch.get_num_threads(),
           "gemm_gflops": gemm_gflops()}
    res["rollout_onyx_s"] = rollout_onyx(model_dir, prompts, G, N, tmp)
    res["rollout_torch_s"] = rollout_torch(model_dir, tok, prompts, G, N)
    res["step_onyx_s"] = step_onyx(model_dir, tok, rows, P, G, N, a.steps, tmp)
    res["step_trl_s"] = step_trl(model_dir, tok, rows, P, G, N, a.steps, tmp)
    n = P * G
    print(f"| {n} completions × {N} tokens | onyx | TRL / PyTorch | onyx speed-up |")
    print("|---|---|---|---|")
    print(f"| rollout (completions/s) | {n / res['rollout_onyx_s']:.1f} | "
          f"{n / res['rollout_torch_s']:.1f} | {res['rollout_torch_s'] / res['rollout_onyx_s']:.2f}× |")
    print(f"| GRPO step (s) | {res['step_onyx_s']:.2f} | {res['step_trl_s']:.2f} | "
          f"{res['step_trl_s'] / res['step_onyx_s']:.2f}× |")
    print(f"ceiling: PyTorch float32 GEMM {res['gemm_gflops']:.0f} GFLOP/s on "
          f"{res['threads']} threads")
    with open(os.path.join(a.out, "grpo_results.json"), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
