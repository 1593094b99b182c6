"""generate_bench.py — decoding time per token against the prefix length: `onyx generate` (KV
cache, src/generate/generate.cc) and Transformers' generate (DynamicCache, PyTorch 2.13 eager) on
the same ~110M-parameter Llama, side by side in one run.

  build/venv/bin/python bench/generate_bench.py [--prefixes 32,256,1024] [--new 64] [--batch 1]
      [--threads 0] [--out build/bench-generate]

The model: LlamaConfig(hidden 768, 12 layers, 12 heads over 4 key/value heads, intermediate 2048,
vocab 32000, untied lm_head, max_position_embeddings 2048), random init, saved with
save_pretrained; prompts of random tokens, greedy decoding, eos off. For each prefix length:
  onyx     the mean of its per-step times (`--timings`: every decoding step after the first token,
           graph building for a new cache block included)
  torch    (time of generate(N new) - time of generate(1 new)) / (N - 1): the prefill cancels
  no-cache PyTorch with use_cache=False for 4 tokens (re-running the prefix each step), to show
           what the cache saves
"flat" is time/token at the longest prefix over the shortest (1.0 = flat). The greedy tokens of
onyx and PyTorch are compared too (they must be equal). Prints a Markdown table and writes
OUT/generate_results.json.
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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ONYX = os.environ.get("ONYX", os.path.join(ROOT, "build", "onyx"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--prefixes", default="32,256,1024")
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--out", default=os.path.join(ROOT, "build", "bench-generate"))
    a = ap.parse_args()
    threads = a.threads or os.cpu_count()
    torch.set_num_threads(threads)
    os.makedirs(a.out, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="onyx-bench-gen-")
    cfg = tr.LlamaConfig(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                         num_key_value_heads=4, intermediate_size=2048, vocab_size=32000,
                         max_position_embeddings=2048, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = tr.LlamaForCausalLM(cfg).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    model.config.eos_token_id = None
    folder = os.path.join(tmp, "llama")
    model.save_pretrained(folder)
    params = sum(p.numel() for p in model.parameters())
    print(f"Llama {params / 1e6:.0f}M parameters, batch {a.batch}, {a.new} new tokens, "
          f"{threads} threads", flush=True)

    rows = []
    for L in [int(x) for x in a.prefixes.split(",")]:
        g = torch.Generator().manual_seed(L)
        prompts = torch.randint(3, cfg.vocab_size, (a.batch, L), generator=g)
        pf = os.path.join(tmp, f"p{L}.jsonl")
        with open(pf, "w") as f:
            for row in prompts.tolist():
                f.write(json.dumps({"prompt_ids": row}) + "\n")
        of = os.path.join(tmp, f"o{L}.jsonl")
        p = subprocess.run([ONYX, "--threads", str(threads), "generate", folder, "--prompts", pf,
                            "--max_new_tokens", str(a.new), "--batch_size", str(a.batch),
                            "--output", of, "--timings"], capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"onyx generate exited {p.returncode}: {p.stderr[-1500:]}")
        m = re.search(r"prefill ([\d.]+) ms; (\d+) decoding steps, ([\d.]+) ms/step", p.stderr)
        onyx_prefill, onyx_ms = float(m[1]), float(m[3])
        with open(of) as f:
            onyx_tokens = [json.loads(l)["completion_ids"] for l in f]

        mask = torch.ones_like(prompts)

        def hf(n, cache=True):
            t = time.perf_counter()
            with torch.no_grad():
                out = model.generate(input_ids=prompts, attention_mask=mask, max_new_tokens=n,
                                     min_new_tokens=n, do_sample=False, use_cache=cache)
            return time.perf_counter() - t, out[:, L:].tolist()

        hf(2)  # warm-up
        t1, _ = hf(1)
        tn, hf_tokens = hf(a.new)
        torch_ms = (tn - t1) / (a.new - 1) * 1e3
        t1n, _ = hf(1, cache=False)
        t4n, _ = hf(4, cache=False)
        nocache_ms = (t4n - t1n) / 3 * 1e3
        same = onyx_tokens == hf_tokens
        rows.append({"prefix": L, "onyx_ms_per_token": onyx_ms, "onyx_prefill_ms": onyx_prefill,
                     "torch_ms_per_token": torch_ms, "torch_prefill_ms": t1 * 1e3,
                     "torch_nocache_ms_per_token": nocache_ms, "tokens_equal": same})
        print(f"prefix {L}: onyx {onyx_ms:.1f} ms/token (prefill {onyx_prefill:.0f} ms), torch "
              f"{torch_ms:.1f} ms/token (prefill {t1 * 1e3:.0f} ms), torch no cache "
              f"{nocache_ms:.0f} ms/token; tokens equal: {same}", flush=True)

    print("\n| prefix | onyx ms/token | PyTorch ms/token | PyTorch no cache | onyx / PyTorch speed |")
    print("|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['prefix']} | {r['onyx_ms_per_token']:.1f} | {r['torch_ms_per_token']:.1f} | "
              f"{r['torch_nocache_ms_per_token']:.0f} | "
              f"{r['torch_ms_per_token'] / r['onyx_ms_per_token']:.2f}x |")
    flat_o = rows[-1]["onyx_ms_per_token"] / rows[0]["onyx_ms_per_token"]
    flat_t = rows[-1]["torch_ms_per_token"] / rows[0]["torch_ms_per_token"]
    print(f"\nflat (time/token at prefix {rows[-1]['prefix']} / at {rows[0]['prefix']}): onyx "
          f"{flat_o:.2f}, PyTorch {flat_t:.2f}; all tokens equal: "
          f"{all(r['tokens_equal'] for r in rows)}")
    with open(os.path.join(a.out, "generate_results.json"), "w") as f:
        json.dump({"rows": rows, "flat_onyx": flat_o, "flat_torch": flat_t,
                   "threads": threads, "batch": a.batch, "new": a.new}, f, indent=1)


if __name__ == "__main__":
    main()
