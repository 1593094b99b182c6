#!/usr/bin/env python3
"""adamw_torch.py — torch.optim.AdamW step time on the ~100M-parameter layout of bench_adamw.cc.

Same tensor sizes, same weight-decay groups (HF rule: no decay for biases and norms), same
hyperparameters. Runs foreach=False and foreach=True under torch.set_num_threads(1) and (2),
prints ms/step (median of the timed steps) and GB/s at 28 bytes/param for each, and the best.
Compare with:  onyx_bench --benchmark_filter=adamw

    build/venv/bin/python bench/adamw_torch.py [--steps 5]
"""
import argparse
import statistics
import time

import torch


def bench_tensors():
    """The list of bench_adamw.cc's bench_tensors(): keep the two in step."""
    H, layers, positions, target = 768, 8, 1024, 100_000_000
    blocks = []
    for l in range(layers):
        p = f"h.{l}."
        blocks += [
            (p + "ln_1.weight", (H,)), (p + "ln_1.bias", (H,)),
            (p + "attn.c_attn.weight", (H, 3 * H)), (p + "attn.c_attn.bias", (3 * H,)),
            (p + "attn.c_proj.weight", (H, H)), (p + "attn.c_proj.bias", (H,)),
            (p + "ln_2.weight", (H,)), (p + "ln_2.bias", (H,)),
            (p + "mlp.c_fc.weight", (H, 4 * H)), (p + "mlp.c_fc.bias", (4 * H,)),
            (p + "mlp.c_proj.weight", (4 * H, H)), (p + "mlp.c_proj.bias", (H,)),
        ]
    blocks += [("ln_f.weight", (H,)), ("ln_f.bias", (H,))]
    rest = positions * H + sum(torch.Size(s).numel() for _, s in blocks)
    vocab = (target - rest) // H
    return [("wte.weight", (vocab, H)), ("wpe.weight", (positions, H))] + blocks


def decays(name):
    n = name.lower()
    return not any(k in n for k in ("bias", "layernorm", "layer_norm", "ln_", "norm"))


def time_adamw(tensors, foreach, threads, steps):
    torch.set_num_threads(threads)
    gen = torch.Generator().manual_seed(0)
    params = []
    for _, shape in tensors:
        p = torch.empty(shape).uniform_(-0.05, 0.05, generator=gen)
        p.grad = torch.empty(shape).uniform_(-0.01, 0.01, generator=gen)
        params.append(p)
    groups = [
        {"params": [p for (n, _), p in zip(tensors, params) if decays(n)], "weight_decay": 0.01},
        {"params": [p for (n, _), p in zip(tensors, params) if not decays(n)], "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=1e-3, foreach=foreach)
    with torch.no_grad():
        opt.step()  # warm-up: allocates the moment buffers
        opt.step()
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            opt.step()
            times.append(time.perf_counter() - t0)
    del opt, params, groups
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=5, help="timed steps per setting (median)")
    args = ap.parse_args()
    tensors = bench_tensors()
    numel = sum(torch.Size(s).numel() for _, s in tensors)
    print(f"torch {torch.__version__}: {len(tensors)} tensors, {numel} params, "
          f"{args.steps} timed steps per setting")
    results = {}
    for threads in (1, 2):
        for foreach in (False, True):
            t = time_adamw(tensors, foreach, threads, args.steps)
            results[(foreach, threads)] = t
            print(f"torch AdamW foreach={str(foreach):5s} threads={threads}: "
                  f"{t * 1e3:8.1f} ms/step  {28 * numel / t / 1e9:6.2f} GB/s", flush=True)
    (foreach, threads), t = min(results.items(), key=lambda kv: kv[1])
    print(f"best: foreach={foreach} threads={threads}: {t * 1e3:.1f} ms/step "
          f"({28 * numel / t / 1e9:.2f} GB/s)")


if __name__ == "__main__":
    main()
