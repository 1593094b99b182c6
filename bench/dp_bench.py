"""dp_bench.py — data-parallel scaling of `onyx train` under mpirun, side by side in one run.

bash bench/data_parallel.sh [--model bert-mini|gpt2-tiny] [--steps N] [--out DIR]

For one model (bench_models.py's sizes, built by onyx from a config: random weights, synthetic
tokens) and one global batch, each configuration trains twice, `--steps` and `--steps + 10`
optimizer steps; the difference of the two train_runtime values is the time of 10 steady steps
(graph building and start-up cancel out):
  1 rank × 1 thread, gradient_accumulation_steps 2      (the baseline: one core)
  1 rank × 2 threads, gradient_accumulation_steps 2     (the same two cores, threads instead)
  2 ranks × 1 thread, DDP, reduction overlapped with backward
  2 ranks × 1 thread, DDP, ONYX_DDP_OVERLAP=0 (reduction after backward)
  2 ranks × 1 thread, ZeRO-1
  the ceiling: two independent one-thread runs at once (taskset, one core each), each doing one
    rank's share (batch per_device, GA 1) with no communication — what this machine's cores and
    memory give two processes, so the data-parallel runs' gap to it is the cost of data
    parallelism itself
Each rank is bound to its own core (mpirun --bind-to core). Reported: samples/s, the speed-up over
the one-core baseline against the measured ceiling, the time the steps waited for gradient
reductions after backward, and the share of that wait the overlap removes (DDP overlapped vs not). Also checks that every configuration ends with the baseline's weights (bit for bit for
2 ranks vs GA 2). Writes DIR/dp_results.json and prints a Markdown table.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

import numpy as np
from safetensors.numpy import save_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ONYX = os.environ.get("ONYX", os.path.join(ROOT, "build", "onyx"))
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_btl_vader_single_copy_mechanism="none")

MODELS = {
    "bert-mini": dict(
        model={"arch": "bert", "task": "sequence-classification",
               "config": {"vocab_size": 30522, "hidden_size": 256, "num_hidden_layers": 4,
                          "num_attention_heads": 4, "intermediate_size": 1024,
                          "max_position_embeddings": 128, "num_labels": 2,
                          "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}},
        seq=128, batch=16, labels="cls"),
    "gpt2-tiny": dict(
        model={"arch": "gpt2", "task": "causal-lm",
               "config": {"vocab_size": 50257, "n_embd": 256, "n_layer": 4, "n_head": 4,
                          "n_positions": 256, "resid_pdrop": 0.0, "embd_pdrop": 0.0,
                          "attn_pdrop": 0.0}},
        seq=256, batch=8, labels="lm"),
}


def make_data(path, spec, n):
    rng = np.random.default_rng(0)
    vocab = spec["model"]["config"].get("vocab_size", 30522)
    ids = rng.integers(0, vocab, (n, spec["seq"])).astype(np.int64)
    t = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    if spec["labels"] == "cls":
        t["token_type_ids"] = np.zeros_like(ids)
        t["labels"] = rng.integers(0, 2, (n,)).astype(np.int64)
    else:
        t["labels"] = ids.copy()
    save_file(t, path)


def train(tmp, name, spec, data, steps, ranks, threads, ga, zero=0, overlap=True):
    out = os.path.join(tmp, f"{name}-{steps}")
    cfg = dict(model=spec["model"], train_data=data, output_dir=out, max_steps=steps,
               per_device_train_batch_size=spec["batch"], gradient_accumulation_steps=ga,
               learning_rate=1e-4, logging_steps=1000, save_strategy="no", disable_tqdm=True,
               train_sampling_strategy="sequential", zero_stage=zero)
    path = os.path.join(tmp, f"{name}-{steps}.yaml")
    with open(path, "w") as f:
        for k, v in cfg.items():
            f.write(f"{k}: {json.dumps(v)}\n")
    env = dict(ENV, OMP_NUM_THREADS=str(threads))
    if not overlap:
        env["ONYX_DDP_OVERLAP"] = "0"
    if ranks == 1:
        cmd = [ONYX, "--threads", str(threads), "train", path]
    else:
        cmd = ["mpirun", "-np", str(ranks), "--bind-to", "core", "--map-by", "core",
               "-x", f"OMP_NUM_THREADS={threads}", ONYX, "train", path]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"{name}: exited {p.returncode}: {p.stderr[-800:]}")
    with open(os.path.join(out, "log_history.jsonl")) as f:
        last = [json.loads(l) for l in f if l.strip()][-1]
    m = re.search(r"\((\d+) buckets; (?:([\d.e-]+) s in the communication thread, ([\d.e-]+) s of "
                  r"it waited for after backward|([\d.e-]+) s, not overlapped)", p.stdout)
    comm = wait = None
    if m:
        comm = float(m[2]) if m[2] else float(m[4])
        wait = float(m[3]) if m[3] else float(m[4])
    return last["train_runtime"], comm, wait, os.path.join(out, "model.safetensors")


def concurrent_pair(tmp, spec, data, steps):
    """The machine's ceiling for two ranks: two independent one-thread trainings at once, each on
    its own core, each with one rank's share of the work (batch per_device, GA 1), no
    communication. Returns (train_runtime of each)."""
    procs = []
    for core in (0, 1):
        out = os.path.join(tmp, f"pair{core}-{steps}")
        cfg = dict(model=spec["model"], train_data=data, output_dir=out, max_steps=steps,
                   per_device_train_batch_size=spec["batch"], learning_rate=1e-4,
                   logging_steps=1000, save_strategy="no", disable_tqdm=True,
                   train_sampling_strategy="sequential")
        path = out + ".yaml"
        with open(path, "w") as f:
            for k, v in cfg.items():
                f.write(f"{k}: {json.dumps(v)}\n")
        procs.append((out, subprocess.Popen(["taskset", "-c", str(core % os.cpu_count()), ONYX,
                                             "--threads", "1", "train", path],
                                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                            text=True, env=dict(ENV, OMP_NUM_THREADS="1"))))
    times = []
    for out, p in procs:
        _, err = p.communicate()
        if p.returncode != 0:
            sys.exit(f"concurrent run: {err[-500:]}")
        with open(os.path.join(out, "log_history.jsonl")) as f:
            times.append([json.loads(l) for l in f if l.strip()][-1]["train_runtime"])
    return times


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="bert-mini", choices=sorted(MODELS))
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(ROOT, "build", "bench-dp"))
    args = ap.parse_args()
    spec = MODELS[args.model]
    cores = os.cpu_count()
    os.makedirs(args.out, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="onyx-dp-bench-", dir=args.out)
    extra = 10
    global_batch = 2 * spec["batch"]
    data = os.path.join(tmp, "train.safetensors")
    make_data(data, spec, global_batch * (args.steps + extra))
    configs = [
        ("1 rank × 1 thread, GA 2", 1, 1, 2, 0, True),
        ("1 rank × 2 threads, GA 2", 1, 2, 2, 0, True),
        ("2 ranks × 1 thread, DDP, overlapped", 2, 1, 1, 0, True),
        ("2 ranks × 1 thread, DDP, not overlapped", 2, 1, 1, 0, False),
        ("2 ranks × 1 thread, ZeRO-1, overlapped", 2, 1, 1, 1, True),
    ]
    rows = []
    base_weights = None
    for i, (label, ranks, threads, ga, zero, overlap) in enumerate(configs):
        name = f"c{i}"
        t_short, comm0, wait0, _ = train(tmp, name, spec, data, args.steps, ranks, threads, ga,
                                         zero, overlap)
        t_long, comm, wait, weights = train(tmp, name, spec, data, args.steps + extra, ranks,
                                            threads, ga, zero, overlap)
        dt = t_long - t_short
        if comm is not None:  # the 10 steady steps' share
            comm, wait = comm - comm0, wait - wait0
        sps = extra * global_batch / dt
        with open(weights, "rb") as f:
            w = f.read()
        if base_weights is None:
            base_weights = w
        rows.append(dict(config=label, ranks=ranks, threads=threads, samples_per_s=sps,
                         step_s=dt / extra, comm_s=comm, waited_s=wait,
                         same_weights_as_baseline=(w == base_weights) if ranks > 1 or threads == 1 else None))
        print(f"{label}: {sps:.1f} samples/s", flush=True)
    short = concurrent_pair(tmp, spec, data, args.steps)
    long = concurrent_pair(tmp, spec, data, args.steps + extra)
    pair_dt = max(l - s for l, s in zip(long, short))
    ceiling = extra * global_batch / pair_dt
    rows.append(dict(config="ceiling: 2 independent 1-thread runs at once, no communication",
                     ranks=2, threads=1, samples_per_s=ceiling, step_s=pair_dt / extra,
                     comm_s=None, waited_s=None, same_weights_as_baseline=None))
    print(f"ceiling (2 independent runs at once): {ceiling:.1f} samples/s", flush=True)
    base = rows[0]["samples_per_s"]
    print(f"\n{args.model}, global batch {global_batch} (per rank {spec['batch']}), "
          f"{extra} steady steps; {cores} cores: {cores}.00× one core in principle, "
          f"{ceiling / base:.2f}× measured (two independent runs at once)\n")
    print("| configuration | samples/s | × 1 core | reductions waited for after backward (s) | "
          "weights = baseline |")
    print("|---|---|---|---|---|")
    for r in rows:
        same = {True: "bit for bit", False: "no", None: "(not compared)"}[
            r["same_weights_as_baseline"]]
        print(f"| {r['config']} | {r['samples_per_s']:.1f} | {r['samples_per_s'] / base:.2f}× | "
              f"{'' if r['waited_s'] is None else format(r['waited_s'], '.3f')} | {same} |")
    on, off = rows[2]["waited_s"], rows[3]["waited_s"]
    hidden = 1 - on / off if off else 0.0
    print(f"\nDDP: overlapping the reduction with backward cut the time waited for it after backward "
          f"from {off:.3f} s to {on:.3f} s per {extra} steps: {hidden:.0%} of it hidden behind "
          f"backward (the rest includes waiting for the slower rank)")
    with open(os.path.join(args.out, "dp_results.json"), "w") as f:
        json.dump(dict(model=args.model, global_batch=global_batch, cores=cores, rows=rows,
                       ddp_reduction_hidden=hidden), f, indent=2)
    bad = [r["config"] for r in rows if r["same_weights_as_baseline"] is False]
    if bad:
        print(f"weights differ from the baseline: {bad}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
