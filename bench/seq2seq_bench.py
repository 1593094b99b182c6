"""seq2seq_bench.py — a training step of encoder–decoders (issue #40): a Whisper-base-shaped and a
T5-small-shaped model, onyx against PyTorch 2.13 eager and torch.compile, side by side in one run.

  build/venv/bin/python bench/seq2seq_bench.py [--models whisper,t5] [--steps 3] [--warmup 2]
      [--threads 0] [--out build/bench-seq2seq] [--bf16]

The models (random init, Transformers', saved with save_pretrained; dropout as configured there):
  whisper-base  WhisperConfig(d_model 512, 6 + 6 layers, 8 heads, ffn 2048, 80 mel bins, 1500
                encoder positions = 30 s of audio, vocab 51865) — 72M parameters; batch 4 of
                (80, 3000) log-mel features and 32-token labels
  t5-small      T5Config(d_model 512, d_kv 64, d_ff 2048, 6 + 6 layers, 8 heads, vocab 32128,
                relu) — 60M parameters; batch 8 of 128 input tokens and 64-token labels
Every peer runs AdamW lr 1e-4, weight decay 0, clipping at 1.0, one step per batch, the same
batches in order. onyx's steady step time is the difference of train_runtime between a run of
warmup + steps optimizer steps and one of warmup steps (graph building cancels out); PyTorch's
is the median of the steps after the warmup ones (for torch.compile, after its compilation in
the warmup steps). Peak RSS: GNU time's maximum resident set size. Also the float32 GEMM ceiling
of this run (onyx_bench gemm_ceiling/f32: 512×768 · 768×2048) to read the rates against, and
what it allows: the step's FLOPs (PyTorch's FlopCounterMode) at that rate, the least time any
implementation could take.
Prints a Markdown table and writes OUT/seq2seq_results.json. With --bf16 each model also runs in
mixed precision: onyx with bf16: true against PyTorch's CPU autocast to bfloat16 around the
forward (Transformers' Trainer with --bf16 on the CPU), eager and compiled, with the bf16 GEMM
ceiling beside.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import train_bench as tb  # noqa: E402
ONYX = os.environ.get("ONYX", os.path.join(ROOT, "build", "onyx"))

TORCH_SCRIPT = r"""
import json, statistics, sys, time, torch, transformers as tr
from safetensors.numpy import load_file
folder, data, steps, warmup, threads, compiled, B = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6] == "1", int(sys.argv[7])
bf16 = sys.argv[8:] == ["bf16"]
if threads > 0: torch.set_num_threads(threads)
m = tr.AutoModelForSeq2SeqLM.from_pretrained(folder) if "whisper" not in folder else tr.WhisperForConditionalGeneration.from_pretrained(folder)
m.train()
d = load_file(data)
params = [p for p in m.parameters() if p.requires_grad]
opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.0)
fwd = torch.compile(m) if compiled else m
times, losses = [], []
for s in range(warmup + steps):
    batch = {k: torch.tensor(v[s * B:(s + 1) * B]) for k, v in d.items()}
    t0 = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        loss = fwd(**batch).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step(); opt.zero_grad(set_to_none=True)
    times.append(time.perf_counter() - t0); losses.append(loss.item())
flops = 0
if not compiled and not bf16:  # one more step's forward and backward, its FLOPs counted by PyTorch
    from torch.utils.flop_counter import FlopCounterMode
    batch = {k: torch.tensor(v[:B]) for k, v in d.items()}
    with FlopCounterMode(display=False) as fc:
        fwd(**batch).loss.backward()
    opt.zero_grad(set_to_none=True)
    flops = fc.get_total_flops()
print(json.dumps({"step_s": statistics.median(times[warmup:]), "losses": losses, "flops": flops}))
"""


def timed(cmd, env):
    """Runs cmd under GNU time; returns (stdout, peak RSS MiB)."""
    p = subprocess.run(["/usr/bin/time", "-f", "MAXRSS %M"] + cmd, capture_output=True, text=True,
                       env=env)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd[:4])}... exited {p.returncode}: {p.stderr[-1500:]}")
    m = re.search(r"MAXRSS (\d+)", p.stderr)
    return p.stdout, int(m[1]) / 1024.0 if m else float("nan")


def make_model(kind, tmp, total, rng):
    """(folder, data file, batch size, parameters, shape text) of a Whisper-base or T5-small."""
    import numpy as np
    import torch
    import transformers as tr
    from safetensors.numpy import save_file
    torch.manual_seed(0)
    if kind == "whisper":
        cfg = tr.WhisperConfig(d_model=512, encoder_layers=6, decoder_layers=6,
                               encoder_attention_heads=8, decoder_attention_heads=8,
                               encoder_ffn_dim=2048, decoder_ffn_dim=2048)
        model, B = tr.WhisperForConditionalGeneration(cfg), 4
        data = {"input_features": rng.normal(0, 1, (B * total, 80, 3000)).astype(np.float32),
                "labels": rng.integers(0, 50000, (B * total, 32)).astype(np.int64)}
        shape = "batch 4 × 30 s of audio (80 × 3000 features), 32-token labels"
    else:
        cfg = tr.T5Config(d_model=512, d_kv=64, d_ff=2048, num_layers=6, num_heads=8,
                          decoder_start_token_id=0)
        model, B = tr.T5ForConditionalGeneration(cfg), 8
        ids = rng.integers(2, 32000, (B * total, 128)).astype(np.int64)
        data = {"input_ids": ids, "attention_mask": np.ones_like(ids),
                "labels": rng.integers(2, 32000, (B * total, 64)).astype(np.int64)}
        shape = "batch 8 × 128 input tokens, 64-token labels"
    folder = os.path.join(tmp, kind)
    model.save_pretrained(folder)
    n = sum(p.numel() for p in model.parameters())
    path = os.path.join(tmp, kind + "-data.safetensors")
    save_file(data, path)
    return folder, path, B, n, shape


def onyx_step(folder, data, B, steps, warmup, threads, env, tmp, bf16=False):
    """onyx's steady s/step (difference of two runs), its losses and peak RSS; `bf16`: the run
    config's bf16 (mixed precision)."""
    runs = {}
    for n in (warmup, warmup + steps):
        out = os.path.join(tmp, f"onyx-{os.path.basename(folder)}-{n}{'-bf16' if bf16 else ''}")
        c = {"model": folder, "train_data": data, "output_dir": out, "max_steps": n,
             "per_device_train_batch_size": B, "learning_rate": 1e-4, "weight_decay": 0.0,
             "max_grad_norm": 1.0, "lr_scheduler_type": "constant", "logging_steps": 1,
             "save_strategy": "no", "disable_tqdm": True, "train_sampling_strategy": "sequential"}
        if bf16:
            c["bf16"] = True
        with open(out + ".yaml", "w") as f:
            for k, v in c.items():
                f.write(f"{k}: {json.dumps(v)}\n")
        _, rss = timed([ONYX, "--threads", str(threads), "train", out + ".yaml"], env)
        with open(os.path.join(out, "log_history.jsonl")) as f:
            logs = [json.loads(line) for line in f if line.strip()]
        runs[n] = (logs[-1]["train_runtime"], [e["loss"] for e in logs if "loss" in e], rss)
    step = (runs[warmup + steps][0] - runs[warmup][0]) / steps
    return step, runs[warmup + steps][1], runs[warmup + steps][2]


def peer_rows(kind, folder, data, B, a, threads, env, tmp, torch_script, bf16=False):
    """onyx, PyTorch eager and torch.compile on the same model and batches: one row each
    (peer, step_s, rss_mib, losses). `torch_script` takes folder, data, steps, warmup, threads,
    compiled (0/1), batch size (and with `bf16` a last "bf16": CPU autocast to bfloat16) and
    prints {"step_s", "losses"} as its last line; onyx then trains with bf16: true."""
    rows, tag = [], " bf16" if bf16 else ""
    step, losses, rss = onyx_step(folder, data, B, a.steps, a.warmup, threads, env, tmp, bf16)
    rows.append({"peer": "onyx" + tag, "step_s": step, "rss_mib": rss, "losses": losses})
    print(f"{kind} onyx{tag}: {step:.3f} s/step", flush=True)
    for name, compiled in (("torch eager", "0"), ("torch.compile", "1")):
        name += " autocast" if bf16 else ""
        out, rss = timed([sys.executable, "-c", torch_script, folder, data, str(a.steps),
                          str(a.warmup), str(threads), compiled, str(B)] + (["bf16"] if bf16 else []),
                         env)
        r = json.loads(out.strip().splitlines()[-1])
        rows.append({"peer": name, "step_s": r["step_s"], "rss_mib": rss, "losses": r["losses"],
                     "flops": r.get("flops", 0)})
        print(f"{kind} {name}: {r['step_s']:.3f} s/step", flush=True)
    return rows


def gemm_ceiling(env):
    """The float32 GEMM ceiling of this run: {'f32': GFLOP/s} (train_bench.gemm_ceilings)."""
    return tb.gemm_ceilings(os.path.join(ROOT, "build", "onyx_bench"), "gemm_ceiling/f32", env)


def print_ceiling_bound(rows, ceiling):
    """What the GEMM ceiling allows: the step's FLOPs (PyTorch's FlopCounterMode over one eager
    step: matmuls, convolutions and the attention kernels it knows) at the ceiling's rate, and the
    largest speed-up over the better PyTorch peer any implementation could reach on this machine."""
    flops = max((row.get("flops", 0) for row in rows), default=0)
    rate = max(ceiling.values(), default=0)
    if not flops or not rate:
        return
    bound = flops / (rate * 1e9)
    best = min(row["step_s"] for row in rows if row["peer"] != "onyx")
    onyx = next(row["step_s"] for row in rows if row["peer"] == "onyx")
    print(f"step FLOPs (FlopCounterMode): {flops / 1e9:.0f} GFLOP; at the GEMM ceiling "
          f"({rate:.0f} GFLOP/s) at least {bound:.2f} s/step, so no implementation exceeds "
          f"{best / bound:.2f}× the better PyTorch peer here; onyx runs at "
          f"{flops / 1e9 / onyx:.0f} GFLOP/s ({bound / onyx:.0%} of the ceiling)")


def bench_setup(name, models, more=()):
    """The benches' command line (--models, --steps, --warmup, --threads, --out, and `more`:
    (flag, add_argument keywords) pairs) and what it sets up: (args, a temporary folder under
    --out, threads, the environment for the peers)."""
    ap = argparse.ArgumentParser()
    for flag, kw in more:
        ap.add_argument(flag, **kw)
    ap.add_argument("--models", default=models)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0, help="0: all cores")
    ap.add_argument("--out", default=os.path.join(ROOT, "build", "bench-" + name))
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=name + "-", dir=a.out)
    threads = a.threads or os.cpu_count()
    return a, tmp, threads, dict(os.environ, OMP_NUM_THREADS=str(threads))


def main():
    a, tmp, threads, env = bench_setup("seq2seq", "whisper,t5",
                                       [("--bf16", dict(action="store_true"))])
    import numpy as np
    results = {}
    for kind in a.models.split(","):
        folder, data, B, n, shape = make_model(kind, tmp, a.warmup + a.steps,
                                               np.random.default_rng(0))
        rows = peer_rows(kind, folder, data, B, a, threads, env, tmp, TORCH_SCRIPT)
        best = min(rows[1]["step_s"], rows[2]["step_s"])
        results[kind] = {"params": n, "shape": shape, "rows": rows,
                         "speedup_vs_best_torch": best / rows[0]["step_s"]}
        if a.bf16:
            half = peer_rows(kind, folder, data, B, a, threads, env, tmp, TORCH_SCRIPT, bf16=True)
            results[kind].update(
                bf16_rows=half, bf16_over_fp32=rows[0]["step_s"] / half[0]["step_s"],
                bf16_speedup_vs_best_torch=min(half[1]["step_s"], half[2]["step_s"]) /
                half[0]["step_s"])
    ceiling = tb.gemm_ceilings(os.path.join(ROOT, "build", "onyx_bench"),
                               "gemm_ceiling/(f32|bf16)/", env) if a.bf16 else gemm_ceiling(env)
    for kind, r in results.items():
        print(f"\n{kind}: {r['params'] / 1e6:.0f}M parameters, {r['shape']}, {threads} threads, "
              f"{a.steps} steady steps\n")
        print("| peer | s/step | peak RSS (MiB) | loss step 1 → last |")
        print("|---|---|---|---|")
        for row in r["rows"] + r.get("bf16_rows", []):
            print(f"| {row['peer']} | {row['step_s']:.3f} | {row['rss_mib']:.0f} | "
                  f"{row['losses'][0]:.4f} → {row['losses'][-1]:.4f} |")
        print(f"\nonyx vs the better of PyTorch eager and torch.compile: "
              f"{r['speedup_vs_best_torch']:.2f}× (> 1: onyx faster)")
        if "bf16_rows" in r:
            print(f"onyx bf16 vs the better PyTorch autocast peer: "
                  f"{r['bf16_speedup_vs_best_torch']:.2f}×; onyx bf16 over onyx float32: "
                  f"{r['bf16_over_fp32']:.2f}×")
        print_ceiling_bound(r["rows"], {k: v for k, v in ceiling.items() if k == "f32"})
    if ceiling:
        print("\nGEMM ceilings this run (GFLOP/s): " +
              ", ".join(f"{k} {v:.0f}" for k, v in ceiling.items()))
    with open(os.path.join(a.out, "seq2seq_results.json"), "w") as f:
        json.dump({"threads": threads, "models": results, "gemm_ceiling_gflops": ceiling}, f,
                  indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
