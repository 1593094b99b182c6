"""train_bench.py — training benchmark: onyx vs PyTorch eager, torch.compile, ORT Training.

Five models: bert-mini, gpt2-tiny, vit-tiny, bert-base and gpt2-small (bench_models.py).

Usage (normally through bench/run.sh, which builds the binaries first and picks the Python):
  build/venv/bin/python bench/train_bench.py [--models bert-mini,...] [--peers onyx,torch,compile,ortt]
      [--warmup 3,bert-base=2,gpt2-small=2] [--steps 10,bert-base=5,gpt2-small=5]
      [--curve-steps 50,gpt2-tiny=20,bert-base=0,gpt2-small=0 | --no-curves]
      [--onyx-threads 0,1] [--torch-threads 2,1] [--compile-threads best] [--ortt-threads 2,1]
      [--no-grad-check] [--ortt-python build/venv-ortt/bin/python]
      [--onyx build/onyx] [--onyx-bench build/onyx_bench] [--workdir DIR] [--keep] [--out bench]

Peers (--peers, default all four):
  onyx     `onyx [--threads N] train CONFIG` on the exported ONNX file.
  torch    PyTorch eager (the torch of this Python, 2.13) on the same nn.Module.
  compile  the same module through torch.compile (inductor, default mode; the optimizer step and
           gradient clipping stay eager). Compilation happens in the first step(s): the warmup steps
           are excluded from the steady state and reported apart (compile = first step's seconds,
           warmup = all W warmup steps' seconds). Each run compiles cold: TORCHINDUCTOR_CACHE_DIR is
           a fresh folder per run, so no run reuses another's kernels.
  ortt     ONNX Runtime Training 1.19.2 (build/venv-ortt) on the SAME ONNX file onyx trains:
           bench/ortt_train.py (generate_artifacts, then onnxruntime.training.api CheckpointState /
           Module / Optimizer); see its docstring for how loss, AdamW and clipping are set up.

For each model (bench_models.ALL_SPECS), in one run:
  1. Build the PyTorch model (fixed seed, dropout 0), export it to ONNX with the TorchScript exporter
     (torch.onnx.export(..., dynamo=False), opset 17, TrainingMode.TRAINING, no constant folding,
     loss inside the graph as the only output `loss`, dynamic batch axes), save its initial weights
     (init.safetensors: the same tensors as the ONNX initializers; checked) and a synthetic dataset
     (fixed seed) of max(W+S, curve steps) batches. (bench/make_exports.py and the tests use the same
     prepare() at opset 14, the default of prepare().)
  2. Every peer trains from those weights on those batches, in order, with the same math: AdamW
     lr 1e-4 (constant), betas (0.9, 0.999), eps 1e-8, weight decay 0, gradient clipping at global
     norm 1.0, one optimizer step per batch. Weight decay is 0 for every peer because ORT Training's
     AdamW node has one weight_decay for all parameters (no groups), while onyx always exempts
     biases and norms (the Hugging Face rule) and torch would follow onyx: 0 is the one setting all
     four apply identically. Clipping is on everywhere (ORT: onnxblock's ClipGradNorm).
     Each peer runs at each of its thread settings (onyx --threads 0 = all cores, 1;
     torch.set_num_threads 2, 1; ORT SessionOptions.intra_op_num_threads 2, 1; torch.compile at the
     thread setting fastest for eager, or --compile-threads), one subprocess per run; a peer's
     fastest setting (by median step time) is reported. On a loaded 2-core machine the 1-thread
     runs often win: the 2-thread ones suffer far more from a second busy process.
  3. Loss curves: every peer's per-step losses against PyTorch eager's (onyx's when torch is not in
     --peers), same init and batches: max relative difference |peer - ref| / |ref| over the steps,
     flagged per peer, pass at <= 1e-3.
  4. Gradient check (onyx and ortt both in --peers, unless --no-grad-check): one batch (the first),
     from the initial weights, `onyx grad model.onnx --inputs batch0.safetensors --loss loss
     --no-dropout` against ORT Training's gradients of the same file (bench/ortt_train.py grad:
     Module forward+backward, then CheckpointState.parameters[name].grad): two independent autodiffs.
     Per tensor max|onyx - ort| / max|ort|; the worst per model must be <= 1e-4. A tensor whose
     gradient is zero in exact arithmetic (the attention key bias: softmax cancels it) holds
     rounding noise on both sides (|g| < 1e-6 of the model's largest gradient): it is checked to be
     that small on both sides and listed apart instead of taking a ratio of two noises. A failed or
     missing check makes the script exit 1, after the results are written.
  5. GFLOP/s: FLOPs per step / median step time, against the sgemm ceiling
     `onyx_bench --benchmark_filter='sgemm/onednn/2048x768x768$'` measured in this run (before and
     after the models; the higher of the two is the ceiling). onyx: the FLOPs its optimized graph
     executes (`onyx plan`); the other peers: the analytic count (bench_models.py docstring).

Timing method. Every measurement is its own subprocess (nothing is shared between runs).
  onyx: the log has no per-step time, so the harness timestamps each log line as it arrives: with
        logging_steps 1 and stdout a pipe, onyx prints (and flushes) one JSON line per optimizer step,
        right after the step. The parent blocks in readline() (no polling, no CPU taken from the
        child) and records time.perf_counter() per line; step i's time is t_i - t_{i-1}. This excludes
        process start, ONNX loading, autodiff and the dataset load, and is checked against the
        trainer's own train_runtime (reported in results.json).
  torch, compile, ortt: time.perf_counter() around each step (batch slicing, zero_grad / lazy reset,
        forward, backward, clipping, optimizer step, reading the loss as a Python float).
  All: steady state = the median of the per-step times after the first W (warmup) steps of the run;
  samples/s = batch / median step time.
Peak RSS: ru_maxrss of each benchmark process alone (os.wait4 in a tiny launcher process; see
_LAUNCHER for why the process that imports torch must not be the direct parent), so runs do not
contaminate one another (RUSAGE_CHILDREN in one parent would give the max over all children so far).
For torch.compile it includes what compiling took (inductor's compile workers are other processes
and are not counted).
Run length: the loss-curve comparison reuses the timing runs: each peer's first setting runs
max(W+S, curve steps) steps, the other settings W+S steps. Curve steps default to 50, 20 for
gpt2-tiny (its steps cost ~7x the others'), and 0 (= the W+S timing steps) for the full-size models,
whose steps cost seconds; W+S defaults to 3+10, 2+5 for bert-base and gpt2-small. With --no-curves
every run is W+S steps and the curves cover those steps.

Outputs: bench/RESULTS.md (regenerated), bench/results.png (samples/s per peer and model, and the
loss-curve differences), bench/results.json (raw data). If a peer fails for a model, its row
records the failure message and the benchmark goes on.
"""
import argparse
import datetime
import inspect
import json
import re
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def repo_rel(path):
    """A path as the report shows it: relative to the repository (no machine paths in reports)."""
    rel = os.path.relpath(os.path.abspath(path), os.path.dirname(HERE))
    return path if rel.startswith("..") else rel
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "tests", "parity"))
import st_io  # noqa: E402

PEERS = ["onyx", "torch", "compile", "ortt"]
PEER_LABEL = {"onyx": "onyx", "torch": "PyTorch eager", "compile": "torch.compile",
              "ortt": "ORT Training"}
PEER_ALIASES = {"eager": "torch", "torch-eager": "torch", "torch.compile": "compile",
                "torch-compile": "compile", "inductor": "compile", "ort": "ortt",
                "ort-training": "ortt", "onnxruntime": "ortt"}
LR, WD, MAX_GRAD_NORM, BETAS, EPS = 1e-4, 0.0, 1.0, (0.9, 0.999), 1e-8
BENCH_OPSET = 17  # the TorchScript exporter's opset for the benchmark file (tests use 14)
CURVE_RTOL = 1e-3
GRAD_RTOL = 1e-4
GRAD_ZERO = 1e-6  # |g| below this fraction of the model's largest gradient: zero up to rounding
# Multi-threaded runs of onyx_bench carry a "/real_time" suffix (UseRealTime), single-threaded ones
# do not: 'sgemm/onednn/2048x768x768$' alone matches nothing on a multi-core machine.
SGEMM_FILTER = "sgemm/onednn/2048x768x768(/real_time)?$"
DEFAULT_WARMUP = "3,bert-base=2,gpt2-small=2"
DEFAULT_STEPS = "10,bert-base=5,gpt2-small=5"
DEFAULT_CURVES = "50,gpt2-tiny=20,bert-base=0,gpt2-small=0"


# ------------------------------------------------------------------------------------------------
# Subprocess helpers


# Peak RSS needs a small launcher. On Linux a child's ru_maxrss starts at its parent's RSS at fork
# time (the high-water mark of the forked address space survives execve), so a benchmark process
# started straight from this (torch-importing, several hundred MiB) process would report at least
# the parent's size. The launcher, a bare `python3 -I -S` of ~8 MiB, spawns the benchmark process
# and reports that grandchild's own ru_maxrss (os.wait4). Its floor (~8 MiB) is far below any
# benchmark process's real peak, so the value reported is the real peak.
_LAUNCHER = r"""
import os, sys
pid = os.posix_spawnp(sys.argv[2], sys.argv[2:], os.environ)
_, st, ru = os.wait4(pid, 0)
code = os.waitstatus_to_exitcode(st)
with open(sys.argv[1], "w") as f:
    f.write("%d %d\n" % (ru.ru_maxrss, code))
sys.exit(code if code >= 0 else 128 - code)
"""


def run_child(cmd, env=None, stdout_path=None, stderr_path=None, on_line=None, timeout=3600):
    """Runs cmd through the launcher; calls on_line(line, perf_counter()) for each stdout line as it
    arrives. Returns (exit code, peak RSS in MiB of cmd's process alone, wall seconds). stderr goes
    to stderr_path. On timeout the launcher's process group (cmd included) is killed."""
    out_f = open(stdout_path, "w") if stdout_path else None
    err_f = open(stderr_path, "w") if stderr_path else subprocess.DEVNULL
    fd, rss_path = tempfile.mkstemp(prefix="onyx-bench-rss-")
    os.close(fd)
    t0 = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-I", "-S", "-c", _LAUNCHER, rss_path] + list(cmd),
                         env=env, stdout=subprocess.PIPE, stderr=err_f, text=True, bufsize=1,
                         start_new_session=True)
    timed_out = []

    def kill():  # the process group this call created: launcher + benchmark process
        timed_out.append(True)
        try:
            os.killpg(p.pid, 9)
        except ProcessLookupError:
            pass

    watchdog = threading.Timer(timeout, kill)
    watchdog.start()
    try:
        for line in p.stdout:
            now = time.perf_counter()
            if out_f:
                out_f.write(line)
            if on_line:
                on_line(line, now)
    finally:
        p.stdout.close()
        rc = p.wait()
        watchdog.cancel()
        if out_f:
            out_f.close()
        if stderr_path:
            err_f.close()
    rss = 0.0
    try:
        with open(rss_path) as f:
            kb, code = f.read().split()
        rss, rc = int(kb) / 1024.0, int(code)
    except (OSError, ValueError):
        pass  # launcher killed (timeout): rc is the launcher's status
    os.remove(rss_path)
    if timed_out and stderr_path:
        with open(stderr_path, "a") as f:
            f.write(f"error: killed after the {timeout} s timeout\n")
    return rc, rss, time.perf_counter() - t0


def exit_text(what, rc, stderr_path):
    """'<what> exited N: <last error line>', or 'killed by signal N' (9: e.g. the OOM killer)."""
    if rc < 0:
        import signal
        name = signal.Signals(-rc).name if -rc in signal.Signals._value2member_map_ else str(-rc)
        hint = " (out of memory? the kernel's OOM killer sends SIGKILL)" if rc == -9 else ""
        return f"{what} killed by {name}{hint}; last stderr line: {last_error_line(stderr_path)}"
    return f"{what} exited {rc}: {last_error_line(stderr_path)}"


def last_error_line(path):
    try:
        with open(path) as f:
            lines = [ln.strip() for ln in f if ln.strip()]
    except OSError:
        return "(no stderr)"
    errs = [ln for ln in lines if "error" in ln.lower()]
    return (errs[-1] if errs else lines[-1] if lines else "(no output)")[:400]


def machine_info():
    model = "?"
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        for ln in out.splitlines():
            if ln.startswith("Model name:"):
                model = ln.split(":", 1)[1].strip()
    except OSError:
        pass
    return {"nproc": os.cpu_count(), "cpu": model, "platform": platform.platform(),
            "python": platform.python_version()}


def build_type(binary):
    cache = os.path.join(os.path.dirname(os.path.abspath(binary)), "CMakeCache.txt")
    try:
        with open(cache) as f:
            for ln in f:
                if ln.startswith("CMAKE_BUILD_TYPE:"):
                    return ln.split("=", 1)[1].strip() or "(empty)"
    except OSError:
        pass
    return "?"


def steady_stats(times, warmup):
    steady = times[warmup:]
    return {"median_step_s": statistics.median(steady), "mean_step_s": statistics.mean(steady),
            "n_timed": len(steady)}


# ------------------------------------------------------------------------------------------------
# sgemm ceiling


def sgemm_ceiling(onyx_bench, one_thread=False):
    """GFLOP/s of onyx_bench's oneDNN sgemm 2048x768x768 at its default threads (all cores, wall
    time), or with OMP_NUM_THREADS=1 (onyx_bench then times by the thread's CPU time)."""
    if not os.access(onyx_bench, os.X_OK):
        return None, f"onyx_bench not found at {onyx_bench}"
    env = dict(os.environ, OMP_NUM_THREADS="1") if one_thread else None
    p = subprocess.run([onyx_bench, f"--benchmark_filter={SGEMM_FILTER}", "--benchmark_format=json"],
                       capture_output=True, text=True, timeout=600, env=env)
    if p.returncode != 0:
        return None, f"onyx_bench exited {p.returncode}: {p.stderr.strip()[-300:]}"
    if not p.stdout.strip():
        return None, f"onyx_bench printed nothing: {p.stderr.strip()[-300:]}"
    try:
        js = json.loads(p.stdout)
        rows = [b for b in js["benchmarks"] if "GFLOPS" in b]
        return max(b["GFLOPS"] for b in rows) / 1e9, None
    except (ValueError, KeyError) as e:
        return None, f"cannot parse onyx_bench output: {e}"


def gemm_ceilings(onyx_bench, bench_filter="gemm_ceiling/", env=None):
    """GFLOP/s of onyx_bench's gemm_ceiling/ rows (oneDNN float32 sgemm, bf16 matmul and bf16
    prepacked on 512x768x2048) by name ({'f32': ..., 'bf16': ..., 'bf16_prepacked': ...}), or {}
    without onyx_bench. Read from its JSON: the console's unit moves from G/s to T/s on AMX."""
    if not os.access(onyx_bench, os.X_OK):
        return {}
    p = subprocess.run([onyx_bench, f"--benchmark_filter={bench_filter}", "--benchmark_format=json"],
                       capture_output=True, text=True, timeout=600, env=env)
    try:
        rows = json.loads(p.stdout)["benchmarks"]
    except (ValueError, KeyError):
        return {}
    return {b["name"].split("/")[1]: b["GFLOPS"] / 1e9 for b in rows if "GFLOPS" in b}


# ------------------------------------------------------------------------------------------------
# Preparation: export, initial weights, dataset


def export_kwargs(torch):
    """torch >= 2.9 defaults torch.onnx.export to dynamo=True: ask for the TorchScript exporter."""
    return {"dynamo": False} if "dynamo" in inspect.signature(torch.onnx.export).parameters else {}


def prepare(name, spec, mdir, n_batches, opset=14):
    """Exports spec's model to mdir/model.onnx (TorchScript exporter at `opset`; 14 is what the test
    suite's exports use, the benchmark passes BENCH_OPSET) with mdir/init.safetensors and
    mdir/train.safetensors (n_batches batches)."""
    import onnx
    import torch
    from onnx import numpy_helper
    torch.set_num_threads(1)
    os.makedirs(mdir, exist_ok=True)
    torch.manual_seed(spec["seed"])
    model = spec["ctor"]().train()
    b = spec["batch"]
    data = spec["data"](n_batches * b, np.random.default_rng(1000 + spec["seed"]))
    st_io.save(os.path.join(mdir, "train.safetensors"), data)
    sd = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    st_io.save(os.path.join(mdir, "init.safetensors"), sd)
    n_params = sum(p.numel() for p in model.parameters())
    if spec.get("hf_folder"):  # onyx trains the Hugging Face folder (write_onyx_config)
        model.m.save_pretrained(os.path.join(mdir, "hf"))
        return {"params": n_params, "flops_per_step": spec["flops"](b), "hf_folder": True}
    example = tuple(torch.from_numpy(data[k][:b]) for k in spec["inputs"])
    path = os.path.join(mdir, "model.onnx")
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, example, path, input_names=spec["inputs"], output_names=["loss"],
                          dynamic_axes=spec["axes"], opset_version=opset,
                          training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                          **export_kwargs(torch))
    # The ONNX initializers must be the torch initial weights (same names, same values).
    m = onnx.load(path)
    inits = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    aliases = {}  # data pointer -> state_dict names (tied weights share one)
    for k, v in model.state_dict().items():
        aliases.setdefault(v.data_ptr(), []).append(k)
    missing = [names for names in aliases.values() if not any(k in inits for k in names)]
    bad = [n for n, a in inits.items() if n in sd and not np.array_equal(a, sd[n])]
    if missing or bad:
        raise RuntimeError(f"{name}: ONNX initializers differ from the torch weights "
                           f"(missing {missing[:4]}, different {bad[:4]})")
    opsets = {o.domain or "ai.onnx": o.version for o in m.opset_import}
    return {"params": n_params, "onnx_mb": os.path.getsize(path) / 2**20,
            "flops_per_step": spec["flops"](b), "opset": opsets.get("ai.onnx"),
            "onnx_ir_version": m.ir_version, "onnx_nodes": len(m.graph.node)}


# ------------------------------------------------------------------------------------------------
# onyx


def write_onyx_config(name, spec, mdir, steps, tag, extra=None):
    out_dir = os.path.join(mdir, tag + "_out")
    shutil.rmtree(out_dir, ignore_errors=True)
    cfg = {
        "model": os.path.join(mdir, "model.onnx"), "loss": "loss",
        "train_data": os.path.join(mdir, "train.safetensors"), "output_dir": out_dir,
        "max_steps": steps, "per_device_train_batch_size": spec["batch"],
        "learning_rate": LR, "weight_decay": WD, "adam_beta1": BETAS[0], "adam_beta2": BETAS[1],
        "adam_epsilon": EPS, "lr_scheduler_type": "constant", "max_grad_norm": MAX_GRAD_NORM,
        "optim": "adamw_fused", "train_sampling_strategy": "sequential", "logging_steps": 1,
        "save_strategy": "no", "eval_strategy": "no", "disable_tqdm": True, "seed": 42,
    }
    if spec.get("hf_folder"):  # a Hugging Face folder: its own loss (bench_models.py llama)
        cfg["model"] = os.path.join(mdir, "hf")
        del cfg["loss"]
    cfg.update(extra or {})  # e.g. {"bf16": True} (bench/bf16_bench.py)
    cfg_path = os.path.join(mdir, tag + "_config.json")  # JSON is valid YAML
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=1)
    return cfg_path, out_dir


def run_plan(onyx, name, spec, mdir, extra=None):
    """`onyx plan` of the benchmark config, without and with gradient_checkpointing: the fusions
    applied (with counts), FLOPs per step and the planned memory."""
    cfg_path, _ = write_onyx_config(name, spec, mdir, 1, "plan", extra)
    res = {}
    for key, extra in (("plain", []), ("checkpointing", ["--gradient_checkpointing", "true"])):
        p = subprocess.run([onyx, "plan", cfg_path] + extra, capture_output=True, text=True,
                           timeout=900)
        if p.returncode != 0:
            res[key] = {"error": (p.stderr.strip().splitlines() or ["exit %d" % p.returncode])[-1]}
            continue
        # the report names no machine path: the temporary model folder is written as <tmp>
        r = {"text": p.stdout.replace(os.path.dirname(mdir.rstrip("/")), "<tmp>")}
        m = re.search(r"^fusions applied:(.*)$", p.stdout, re.M)
        r["fusions"] = {mm.group(1): int(mm.group(2))
                        for mm in re.finditer(r"(\w+) x(\d+)", m.group(1) if m else "")}
        m = re.search(r"^FLOPs per step: ([\d.]+) GFLOP", p.stdout, re.M)
        r["gflop"] = float(m.group(1)) if m else None
        for field, pat in (("activations_mib", r"activations \([^)]*\)\s+([\d.]+) MiB"),
                           ("total_mib", r"^\s+total\s+([\d.]+) MiB")):
            m = re.search(pat, p.stdout, re.M)
            r[field] = float(m.group(1)) if m else None
        res[key] = r
    return res


def run_onyx(onyx, name, spec, mdir, steps, warmup, threads=0, extra=None, tag_suffix=""):
    """threads 0: onyx's default (all cores); N > 0: `onyx --threads N train ...`; extra: config
    keys added (tag_suffix names its files apart)."""
    tag = f"onyx_t{threads}{tag_suffix}"
    cfg_path, out_dir = write_onyx_config(name, spec, mdir, steps, tag, extra)
    stamps = []  # (step, perf_counter) of each per-step log line

    def on_line(line, now):
        line = line.strip()
        if line.startswith("{"):
            try:
                e = json.loads(line)
            except ValueError:
                return
            if "loss" in e and "step" in e:
                stamps.append((int(e["step"]), now))

    cmd = [onyx] + (["--threads", str(threads)] if threads > 0 else []) + ["train", cfg_path]
    err_path = os.path.join(mdir, tag + ".stderr")
    rc, rss, wall = run_child(cmd, stdout_path=os.path.join(mdir, tag + ".stdout"),
                              stderr_path=err_path, on_line=on_line)
    res = {"peer": "onyx", "threads": threads, "setting": f"threads {threads or 'default'}",
           "rc": rc, "peak_rss_mb": rss, "wall_s": wall, "steps": steps}
    if rc != 0:
        res["error"] = exit_text("onyx train", rc, err_path)
        return res
    losses, final = {}, {}
    with open(os.path.join(out_dir, "log_history.jsonl")) as f:
        for ln in f:
            e = json.loads(ln)
            if "loss" in e:
                losses[int(e["step"])] = e["loss"]
            if "train_runtime" in e:
                final = e
    res["losses"] = [losses.get(i + 1) for i in range(steps)]
    res["train_runtime"] = final.get("train_runtime")
    if len(stamps) != steps or [s for s, _ in stamps] != list(range(1, steps + 1)):
        res["error"] = f"expected one log line per step 1..{steps}, got steps {[s for s, _ in stamps][:20]}"
        return res
    times = [stamps[i][1] - stamps[i - 1][1] for i in range(1, steps)]  # step i+1's time
    res["step_times"] = [None] + times
    steady = times[warmup - 1:] if warmup >= 1 else times
    res["median_step_s"] = statistics.median(steady)
    res["mean_step_s"] = (stamps[-1][1] - stamps[warmup - 1][1]) / (steps - warmup) if warmup >= 1 \
        else statistics.mean(times)
    res["n_timed"] = len(steady)
    return res


# ------------------------------------------------------------------------------------------------
# PyTorch eager and torch.compile (worker runs in its own process: `train_bench.py _torch_worker`)


def torch_worker(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("--model")
    ap.add_argument("--mdir")
    ap.add_argument("--steps", type=int)
    ap.add_argument("--threads", type=int)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--autocast", action="store_true", help="forward under CPU autocast bf16")
    ap.add_argument("--result")
    a = ap.parse_args(argv)
    import torch
    import bench_models
    torch.set_num_threads(a.threads)
    spec = bench_models.BF16_SPECS[a.model]  # (the worker serves bf16_bench.py too)
    model = spec["ctor"]()
    init = st_io.load(os.path.join(a.mdir, "init.safetensors"))
    model.load_state_dict({k: torch.from_numpy(v) for k, v in init.items()})
    del init
    model.train()
    data = st_io.load(os.path.join(a.mdir, "train.safetensors"))
    # WD is 0 (see the docstring); the groups keep onyx's no-decay rule should it ever be > 0.
    opt = torch.optim.AdamW(bench_models.param_groups(model, WD), lr=LR, betas=BETAS, eps=EPS,
                            weight_decay=WD)
    params = list(model.parameters())
    fwd = torch.compile(model) if a.compile else model  # inductor, default mode
    b = spec["batch"]
    times, losses = [], []
    for i in range(a.steps):
        t0 = time.perf_counter()
        batch = [torch.from_numpy(data[k][i * b:(i + 1) * b]) for k in spec["inputs"]]
        opt.zero_grad(set_to_none=True)
        if a.autocast:  # PyTorch's CPU mixed precision: bf16 matmuls, float32 master weights
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = fwd(*batch)
        else:
            loss = fwd(*batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, MAX_GRAD_NORM)
        opt.step()
        lv = loss.item()
        times.append(time.perf_counter() - t0)
        losses.append(lv)
    out = {"times": times, "losses": losses, "torch": torch.__version__,
           "num_threads": torch.get_num_threads()}
    if a.compile:
        try:
            from torch._dynamo.utils import counters
            out["dynamo"] = {"unique_graphs": int(counters["stats"]["unique_graphs"]),
                             "graph_breaks": int(sum(counters["graph_break"].values()))}
        except Exception as e:  # informational only
            out["dynamo"] = {"error": str(e)}
    with open(a.result, "w") as f:
        json.dump(out, f)


def run_torch(name, mdir, steps, warmup, threads, compile_=False, autocast=False):
    tag = f"{'compile' if compile_ else 'torch'}_t{threads}{'_bf16' if autocast else ''}"
    result = os.path.join(mdir, tag + ".json")
    env = dict(os.environ)
    if compile_:  # a cold compile for every run: a fresh inductor cache
        cache = os.path.join(mdir, tag + "_inductor_cache")
        shutil.rmtree(cache, ignore_errors=True)
        env["TORCHINDUCTOR_CACHE_DIR"] = cache
    cmd = [sys.executable, os.path.abspath(__file__), "_torch_worker", "--model", name, "--mdir", mdir,
           "--steps", str(steps), "--threads", str(threads), "--result", result]
    if compile_:
        cmd.append("--compile")
    if autocast:
        cmd.append("--autocast")
    err = os.path.join(mdir, tag + ".stderr")
    rc, rss, wall = run_child(cmd, env=env, stderr_path=err)
    res = {"peer": "compile" if compile_ else "torch", "threads": threads,
           "setting": f"threads {threads}", "rc": rc, "peak_rss_mb": rss, "wall_s": wall,
           "steps": steps}
    if rc != 0:
        res["error"] = exit_text("torch.compile worker" if compile_ else "torch worker", rc, err)
        return res
    with open(result) as f:
        r = json.load(f)
    res.update(losses=r["losses"], step_times=r["times"], **steady_stats(r["times"], warmup))
    if compile_:
        res["compile_s"] = r["times"][0]  # the first step compiles forward and backward
        res["warmup_s"] = sum(r["times"][:warmup])
        res["dynamo"] = r.get("dynamo")
    return res


# ------------------------------------------------------------------------------------------------
# ONNX Runtime Training (bench/ortt_train.py in build/venv-ortt)


ORTT_SCRIPT = os.path.join(HERE, "ortt_train.py")


def ortt_artifacts(py, mdir):
    """generate_artifacts for mdir/model.onnx into mdir/ortt (once per model, shared by all runs)."""
    art = os.path.join(mdir, "ortt")
    shutil.rmtree(art, ignore_errors=True)
    err = os.path.join(mdir, "ortt_artifacts.stderr")
    t0 = time.perf_counter()
    with open(err, "w") as ef:
        p = subprocess.run([py, ORTT_SCRIPT, "artifacts", os.path.join(mdir, "model.onnx"), art,
                            "--max-grad-norm", str(MAX_GRAD_NORM), "--weight-decay", str(WD),
                            "--beta1", str(BETAS[0]), "--beta2", str(BETAS[1]), "--eps", str(EPS)],
                           stdout=subprocess.PIPE, stderr=ef, text=True, timeout=1800)
    res = {"wall_s": time.perf_counter() - t0, "dir": art}
    if p.returncode != 0:
        res["error"] = exit_text("ortt_train.py artifacts", p.returncode, err)
        return res
    try:
        with open(os.path.join(art, "artifacts.json")) as f:
            info = json.load(f)
        res.update({k: v for k, v in info.items() if k != "params"}, n_params=len(info["params"]))
    except (OSError, ValueError, KeyError) as e:
        res["error"] = f"ortt_train.py artifacts wrote no artifacts.json: {e}"
    return res


def run_ortt(py, name, spec, mdir, steps, warmup, threads):
    tag = f"ortt_t{threads}"
    result = os.path.join(mdir, tag + ".json")
    cmd = [py, ORTT_SCRIPT, "train", os.path.join(mdir, "ortt"),
           "--data", os.path.join(mdir, "train.safetensors"), "--inputs", ",".join(spec["inputs"]),
           "--batch", str(spec["batch"]), "--steps", str(steps), "--threads", str(threads),
           "--lr", repr(LR), "--result", result]
    err = os.path.join(mdir, tag + ".stderr")
    rc, rss, wall = run_child(cmd, stderr_path=err)
    res = {"peer": "ortt", "threads": threads, "setting": f"intra_op threads {threads}", "rc": rc,
           "peak_rss_mb": rss, "wall_s": wall, "steps": steps}
    if rc != 0:
        res["error"] = exit_text("ortt_train.py train", rc, err)
        return res
    with open(result) as f:
        r = json.load(f)
    res.update(losses=r["losses"], step_times=r["times"], setup_s=r.get("setup_s"),
               ort=r.get("ort"), **steady_stats(r["times"], warmup))
    return res


# ------------------------------------------------------------------------------------------------
# Gradient check: onyx grad vs ORT Training on the same file


def grad_check(onyx, py, name, spec, mdir):
    data = st_io.load(os.path.join(mdir, "train.safetensors"))
    b = spec["batch"]
    inp = os.path.join(mdir, "batch0.safetensors")
    st_io.save(inp, {k: data[k][:b] for k in spec["inputs"]})
    del data
    res = {}
    og, rg = os.path.join(mdir, "grad_onyx.safetensors"), os.path.join(mdir, "grad_ortt.safetensors")
    t0 = time.perf_counter()
    p = subprocess.run([onyx, "grad", os.path.join(mdir, "model.onnx"), "--inputs", inp,
                        "--output", og, "--loss", "loss", "--no-dropout"],
                       capture_output=True, text=True, timeout=1800)
    res["onyx_s"] = time.perf_counter() - t0
    res["onyx_stdout"] = p.stdout.strip()[-300:]
    if p.returncode != 0:
        res["error"] = f"onyx grad exited {p.returncode}: " + (p.stderr.strip().splitlines()
                                                               or ["(no stderr)"])[-1][:300]
        return res
    t0 = time.perf_counter()
    err = os.path.join(mdir, "ortt_grad.stderr")
    with open(err, "w") as ef:
        p = subprocess.run([py, ORTT_SCRIPT, "grad", os.path.join(mdir, "ortt"), "--data", inp,
                            "--inputs", ",".join(spec["inputs"]), "--batch", str(b),
                            "--threads", "1", "--output", rg],
                           stdout=subprocess.PIPE, stderr=ef, text=True, timeout=1800)
    res["ortt_s"] = time.perf_counter() - t0
    if p.returncode != 0:
        res["error"] = exit_text("ortt_train.py grad", p.returncode, err)
        return res
    a, r = st_io.load(og), st_io.load(rg)
    res.update(compare_grads(a, r))
    return res


def compare_grads(a, r):
    """a: onyx's gradients, r: ORT's (the reference), both {name: array} with `loss`."""
    names = sorted(k for k in r if k != "loss")
    res = {"loss_onyx": float(np.asarray(a.get("loss", np.nan)).reshape(-1)[0]),
           "loss_ortt": float(np.asarray(r["loss"]).reshape(-1)[0])}
    res["loss_rel"] = abs(res["loss_onyx"] - res["loss_ortt"]) / abs(res["loss_ortt"])
    only_r = [k for k in names if k not in a]
    only_a = sorted(k for k in a if k != "loss" and k not in r)
    scale = max(float(np.abs(r[k]).max()) if r[k].size else 0.0 for k in names) if names else 0.0
    per, zero, problems = {}, {}, []
    for k in names:
        if k not in a:
            continue
        x, y = np.asarray(a[k], np.float64), np.asarray(r[k], np.float64)
        if x.shape != y.shape:
            problems.append(f"{k}: shape {list(x.shape)} vs {list(y.shape)}")
            continue
        mb, ma, diff = float(np.abs(y).max()), float(np.abs(x).max()), float(np.abs(x - y).max())
        if mb < GRAD_ZERO * scale:  # zero in exact arithmetic: rounding noise on both sides
            zero[k] = {"max_onyx": ma, "max_ortt": mb}
            if ma >= GRAD_ZERO * scale:
                problems.append(f"{k}: ORT's gradient is ~0 (max {mb:.2e}), onyx's is not "
                                f"(max {ma:.2e})")
            continue
        per[k] = diff / mb
    worst = max(per, key=per.get) if per else None
    res.update(n_compared=len(per), n_zero=len(zero), zero=zero, scale=scale,
               worst_tensor=worst, worst_rel=per[worst] if worst else None,
               per_tensor=per, missing_in_onyx=only_r, extra_in_onyx=only_a)
    if only_r or only_a:
        problems.append(f"tensor sets differ: missing in onyx {only_r[:4]}, extra {only_a[:4]}")
    if worst is None:
        problems.append("no tensor compared")
    elif per[worst] > GRAD_RTOL:
        problems.append(f"{worst}: rel err {per[worst]:.2e} > {GRAD_RTOL:g}")
    res["problems"] = problems
    res["pass"] = not problems
    return res


# ------------------------------------------------------------------------------------------------
# One model


def per_model(table, name):
    return table.get(name, table[""])


def best_of(runs):
    ok = [r for r in runs if "error" not in r]
    return min(ok, key=lambda r: r["median_step_s"]) if ok else None


def bench_model(name, spec, args, workdir, log):
    mdir = os.path.join(workdir, name)
    warmup, steps = per_model(args.warmup, name), per_model(args.steps, name)
    timed = warmup + steps
    curve = max(timed, per_model(args.curve_steps, name)) if args.curves else timed
    row = {"model": name, "desc": spec["desc"], "batch": spec["batch"], "warmup": warmup,
           "steps": steps, "curve_len": curve, "runs": {}}
    t0 = time.time()
    row.update(prepare(name, spec, mdir, curve, opset=BENCH_OPSET))
    log(f"[{name}] exported ({row['params'] / 1e6:.2f}M params, {row['onnx_mb']:.0f} MB ONNX, opset "
        f"{row['opset']}, {row['flops_per_step'] / 1e9:.1f} GFLOP/step) in {time.time() - t0:.0f}s")
    b = spec["batch"]

    def report_run(r, t_start):
        what = f"[{name}] {PEER_LABEL[r['peer']]} {r['setting']}"
        if "error" in r:
            log(f"{what} FAILED: {r['error']}")
        else:
            extra = (f", compile {r['compile_s']:.0f}s (warmup {r['warmup_s']:.0f}s)"
                     if "compile_s" in r else "")
            log(f"{what}: {r['median_step_s']:.3f} s/step median over {r['n_timed']} steps, "
                f"peak RSS {r['peak_rss_mb']:.0f} MiB{extra} ({time.time() - t_start:.0f}s)")

    def run_settings(settings, run_one):
        """run_one(steps, threads) at each thread setting; the first runs the curve's length."""
        runs = []
        for i, th in enumerate(settings):
            t_start = time.time()
            runs.append(run_one(curve if i == 0 else timed, th))
            report_run(runs[-1], t_start)
        return runs

    if "onyx" in args.peers:
        row["plan"] = run_plan(args.onyx, name, spec, mdir)
        pl, pc = row["plan"].get("plain", {}), row["plan"].get("checkpointing", {})
        if "error" in pl:
            log(f"[{name}] onyx plan FAILED: {pl['error']}")
        else:
            log(f"[{name}] onyx plan: fusions {pl['fusions']}; {pl['gflop']} GFLOP/step; "
                f"activations {pl['activations_mib']} MiB, with gradient_checkpointing "
                f"{pc.get('activations_mib')} MiB")
        row["runs"]["onyx"] = run_settings(
            args.onyx_threads, lambda n, th: run_onyx(args.onyx, name, spec, mdir, n, warmup, th))

    if "torch" in args.peers:
        row["runs"]["torch"] = run_settings(
            args.torch_threads, lambda n, th: run_torch(name, mdir, n, warmup, th))

    if "compile" in args.peers:
        settings = args.compile_threads
        if settings == "best":
            eager = best_of(row["runs"].get("torch", []))
            settings = [eager["threads"] if eager else args.torch_threads[0]]
        row["runs"]["compile"] = run_settings(
            settings, lambda n, th: run_torch(name, mdir, n, warmup, th, compile_=True))

    if "ortt" in args.peers:
        art = ortt_artifacts(args.ortt_python, mdir)
        row["ortt_artifacts"] = art
        if "error" in art:
            log(f"[{name}] ORT Training generate_artifacts FAILED: {art['error']}")
            row["runs"]["ortt"] = [{"peer": "ortt", "threads": th, "setting": f"intra_op threads {th}",
                                    "error": "generate_artifacts failed: " + art["error"]}
                                   for th in args.ortt_threads]
        else:
            log(f"[{name}] ORT Training artifacts in {art['wall_s']:.0f}s (exposed optional outputs "
                f"{art.get('exposed_outputs')}; clip node {art.get('clip_node')}, adam_mode "
                f"{art.get('adam_mode')})")
            row["runs"]["ortt"] = run_settings(
                args.ortt_threads,
                lambda n, th: run_ortt(args.ortt_python, name, spec, mdir, n, warmup, th))

    if args.grad_check and "onyx" in args.peers and "ortt" in args.peers:
        t0 = time.time()
        if "error" in row.get("ortt_artifacts", {}):
            g = {"error": "no ORT Training artifacts: " + row["ortt_artifacts"]["error"]}
        else:
            g = grad_check(args.onyx, args.ortt_python, name, spec, mdir)
        row["grad"] = g
        if "error" in g:
            log(f"[{name}] gradient check FAILED to run: {g['error']}")
        else:
            log(f"[{name}] gradients onyx vs ORT Training: {g['n_compared']} tensors, worst rel err "
                f"{g['worst_rel']:.2e} ({g['worst_tensor']}), {g['n_zero']} zero up to rounding; "
                f"loss {g['loss_onyx']:.6f} vs {g['loss_ortt']:.6f}: "
                f"{'ok' if g['pass'] else 'FAIL: ' + '; '.join(g['problems'])} "
                f"({time.time() - t0:.0f}s)")

    # Per peer: the fastest setting.
    gf_onyx = row.get("plan", {}).get("plain", {}).get("gflop")
    row["best"] = {}
    for peer, runs in row["runs"].items():
        best = best_of(runs)
        if not best:
            continue
        flops = gf_onyx * 1e9 if (peer == "onyx" and gf_onyx) else row["flops_per_step"]
        row["best"][peer] = {"setting": best["setting"], "threads": best["threads"],
                             "median_step_s": best["median_step_s"], "sps": b / best["median_step_s"],
                             "peak_rss_mb": best["peak_rss_mb"],
                             "gflops": flops / best["median_step_s"] / 1e9,
                             "flops_counted": "executed (onyx plan)" if flops != row["flops_per_step"]
                             else "analytic"}
        if peer == "compile":
            row["best"][peer].update(compile_s=best["compile_s"], warmup_s=best["warmup_s"])
    ob = row["best"].get("onyx")
    others = {p: v for p, v in row["best"].items() if p != "onyx"}
    if ob and others:
        fastest = max(others, key=lambda p: others[p]["sps"])
        smallest = min(others, key=lambda p: others[p]["peak_rss_mb"])
        row["ratios"] = {"fastest_peer": fastest, "speed": ob["sps"] / others[fastest]["sps"],
                         "smallest_peer": smallest,
                         "rss": ob["peak_rss_mb"] / others[smallest]["peak_rss_mb"],
                         "per_peer": {p: {"speed": ob["sps"] / v["sps"],
                                          "rss": ob["peak_rss_mb"] / v["peak_rss_mb"]}
                                      for p, v in others.items()}}

    # Loss curves: each peer's longest successful run against the reference's.
    longest = {}
    for peer, runs in row["runs"].items():
        ok = [r for r in runs if "error" not in r and r.get("losses")]
        if ok:
            longest[peer] = max(ok, key=lambda r: r["steps"])
    ref_peer = "torch" if "torch" in longest else ("onyx" if "onyx" in longest else None)
    row["curves"] = {"ref": ref_peer, "peers": {}}
    if ref_peer:
        ref = longest[ref_peer]["losses"]
        for peer, run in longest.items():
            if peer == ref_peer:
                continue
            ol = run["losses"]
            n = min(len(ol), len(ref))
            rel = [abs(ol[i] - ref[i]) / abs(ref[i]) for i in range(n)]
            worst = int(np.argmax(rel))
            row["curves"]["peers"][peer] = {"steps": n, "max_rel": max(rel), "at_step": worst + 1,
                                            "rel": rel, "pass": max(rel) <= CURVE_RTOL,
                                            "first": ol[0], "last": ol[n - 1],
                                            "setting": run["setting"]}
            log(f"[{name}] loss curve {PEER_LABEL[peer]} vs {PEER_LABEL[ref_peer]} over {n} steps: "
                f"max rel diff {max(rel):.2e} at step {worst + 1} "
                f"{'ok' if max(rel) <= CURVE_RTOL else 'FAIL (> 1e-3)'}")
        row["curves"].update(ref_losses=ref, ref_setting=longest[ref_peer]["setting"])
    return row


# ------------------------------------------------------------------------------------------------
# Report


def fmt(x, spec="{:.1f}"):
    return "—" if x is None else spec.format(x)


def esc(s):
    return str(s).replace("|", "\\|").replace("\n", " ")


def summary_table(rows):
    head = ("| model | onyx samples/s | fastest peer samples/s | speed onyx / fastest peer | "
            "onyx peak RSS MiB | smallest peer RSS MiB | RSS onyx / smallest peer | "
            "loss curves (max rel diff vs torch eager) | gradients onyx vs ORT (worst rel err) |")
    lines = [head, "|" + "|".join(["---"] * 9) + "|"]
    for r in rows:
        ob, ra = r.get("best", {}).get("onyx"), r.get("ratios")
        if ob:
            onyx_cell = f"{ob['sps']:.2f} ({ob['setting']})"
        elif "onyx" not in r.get("runs", {}) and not r.get("error"):
            onyx_cell = "not run"
        else:
            errs = [x.get("error", "") for x in r.get("runs", {}).get("onyx", [])] or \
                [r.get("error", "not run")]
            onyx_cell = "**FAILED**: " + esc(errs[0])[:300]
        if ra:
            f, s = ra["fastest_peer"], ra["smallest_peer"]
            fb, sb = r["best"][f], r["best"][s]
            fast_cell = f"{fb['sps']:.2f} ({PEER_LABEL[f]}, {fb['setting']})"
            small_cell = f"{sb['peak_rss_mb']:.0f} ({PEER_LABEL[s]})"
            sp, rs = f"{ra['speed']:.2f}", f"{ra['rss']:.2f}"
        else:
            fast_cell = small_cell = sp = rs = "—"
        cv = r.get("curves", {}).get("peers", {})
        curve_cell = "; ".join(f"{PEER_LABEL[p]} {c['max_rel']:.1e} ({c['steps']}) "
                               f"{'ok' if c['pass'] else '**> 1e-3**'}" for p, c in cv.items()) or "—"
        g = r.get("grad")
        if not g:
            grad_cell = "not run"
        elif "error" in g:
            grad_cell = "**FAILED**: " + esc(g["error"])[:200]
        else:
            grad_cell = (f"{g['worst_rel']:.1e} ({g['n_compared']} tensors) "
                         + ("ok" if g["pass"] else "**FAIL**: " + esc("; ".join(g["problems"]))[:200]))
        lines.append(f"| {r['model']} | {onyx_cell} | {fast_cell} | {sp} | "
                     f"{fmt(ob and ob['peak_rss_mb'], '{:.0f}')} | {small_cell} | {rs} | "
                     f"{curve_cell} | {grad_cell} |")
    return "\n".join(lines)


def peer_table(rows, ceiling):
    head = ("| model | peer | best setting | samples/s | ms/step | speed onyx / peer | peak RSS MiB | "
            "RSS onyx / peer | GFLOP/s | % of sgemm ceiling | loss curve vs torch eager | "
            "compile + warmup s |")
    lines = [head, "|" + "|".join(["---"] * 12) + "|"]
    for r in rows:
        ob = r.get("best", {}).get("onyx")
        for peer in PEERS:
            runs = r.get("runs", {}).get(peer)
            if runs is None:
                continue
            bb = r.get("best", {}).get(peer)
            if not bb:
                err = "; ".join(esc(x.get("error", "")) for x in runs)[:300]
                lines.append(f"| {r['model']} | {PEER_LABEL[peer]} | **FAILED**: {err} | | | | | | | "
                             f"| | |")
                continue
            c = r.get("curves", {}).get("peers", {}).get(peer)
            if r.get("curves", {}).get("ref") == peer:
                curve_cell = "reference"
            elif c:
                curve_cell = f"{c['max_rel']:.1e} ({c['steps']}) {'ok' if c['pass'] else '**> 1e-3**'}"
            else:
                curve_cell = "—"
            pct = 100 * bb["gflops"] / ceiling if ceiling else None
            sp = fmt(ob and ob["sps"] / bb["sps"], "{:.2f}") if peer != "onyx" else "1"
            rs = fmt(ob and ob["peak_rss_mb"] / bb["peak_rss_mb"], "{:.2f}") if peer != "onyx" else "1"
            comp = (f"{bb['compile_s']:.1f} + {bb['warmup_s'] - bb['compile_s']:.1f}"
                    if "compile_s" in bb else "")
            star = "*" if peer == "onyx" and bb["flops_counted"] != "analytic" else ""
            lines.append(f"| {r['model']} | {PEER_LABEL[peer]} | {bb['setting']} | {bb['sps']:.2f} | "
                         f"{bb['median_step_s'] * 1e3:.0f} | {sp} | {bb['peak_rss_mb']:.0f} | {rs} | "
                         f"{bb['gflops']:.1f}{star} | "
                         f"{fmt(pct, '{:.0f}%')} | {curve_cell} | {comp} |")
    return "\n".join(lines)


def grad_table(rows):
    md = ["| model | tensors compared | worst rel err max\\|onyx−ORT\\| / max\\|ORT\\| (tensor) | "
          "zero up to rounding (both sides) | loss onyx / ORT | result |",
          "|---|---|---|---|---|---|"]
    for r in rows:
        g = r.get("grad")
        if not g:
            continue
        if "error" in g:
            md.append(f"| {r['model']} | | **could not run**: {esc(g['error'])[:300]} | | | **FAIL** |")
            continue
        groups = {}  # layer indices folded: bert.layers.*.attn.k.bias x12
        for k in g["zero"]:
            pat = re.sub(r"\.\d+\.", ".*.", k)
            groups[pat] = groups.get(pat, 0) + 1
        zero = ", ".join(f"{k} ×{n}" if n > 1 else k for k, n in sorted(groups.items()))
        if len(zero) > 200:
            zero = zero[:200] + "…"
        zcell = (f"{g['n_zero']}: {zero} (max \\|g\\| {max(max(v.values()) for v in g['zero'].values()):.1e}"
                 f" vs largest {g['scale']:.1e})" if g["zero"] else "0")
        md.append(f"| {r['model']} | {g['n_compared']} | {g['worst_rel']:.2e} ({g['worst_tensor']}) | "
                  f"{zcell} | {g['loss_onyx']:.6f} / {g['loss_ortt']:.6f} | "
                  + ("ok" if g["pass"] else "**FAIL**: " + esc("; ".join(g["problems"]))) + " |")
    return "\n".join(md)


def detail(rows):
    out = []
    for r in rows:
        out.append(f"### {r['model']} — {r['desc']}")
        if r.get("error"):
            out.append(f"- **harness error**: `{r['error']}`")
            out.append("")
            continue
        out.append(f"{r['params'] / 1e6:.2f}M parameters, {r['flops_per_step'] / 1e9:.1f} GFLOP per "
                   f"training step (analytic); ONNX {r['onnx_mb']:.0f} MB, opset {r['opset']}, "
                   f"{r['onnx_nodes']} nodes; {r['warmup']} warmup + {r['steps']} measured steps, "
                   f"first runs {r['curve_len']} steps.")
        for peer in PEERS:
            for o in r.get("runs", {}).get(peer, []):
                what = f"- {PEER_LABEL[peer]} {o['setting']}: "
                if "median_step_s" in o:
                    s = (what + f"median {o['median_step_s'] * 1e3:.0f} ms/step over {o['n_timed']} "
                         f"steps (mean {o['mean_step_s'] * 1e3:.0f} ms; run of {o['steps']} steps, "
                         f"process wall {o['wall_s']:.1f} s")
                    if o.get("train_runtime") is not None:
                        s += f", trainer's train_runtime {o['train_runtime']:.1f} s"
                    if "compile_s" in o:
                        s += (f", first step (compile) {o['compile_s']:.1f} s, all {r['warmup']} warmup "
                              f"steps {o['warmup_s']:.1f} s")
                        d = o.get("dynamo") or {}
                        if "unique_graphs" in d:
                            s += f", {d['unique_graphs']} graph(s), {d['graph_breaks']} graph break(s)"
                    if o.get("setup_s") is not None:
                        s += f", session setup {o['setup_s']:.1f} s"
                    out.append(s + f"), peak RSS {o['peak_rss_mb']:.0f} MiB")
                else:
                    out.append(what + f"**failed**: `{o.get('error')}` (peak RSS "
                               f"{o.get('peak_rss_mb', 0):.0f} MiB, {o.get('wall_s', 0):.0f} s)")
        a = r.get("ortt_artifacts")
        if a and "error" not in a:
            out.append(f"- ORT Training generate_artifacts: {a['wall_s']:.1f} s, {a.get('n_params')} "
                       f"trainable tensors, optional outputs named for ORT's gradient builders "
                       f"{a.get('exposed_outputs')}")
        cv = r.get("curves", {})
        for peer, c in cv.get("peers", {}).items():
            out.append(f"- loss curve {PEER_LABEL[peer]} ({c['setting']}) vs {PEER_LABEL[cv['ref']]} "
                       f"({cv['ref_setting']}): {c['steps']} steps, max rel diff {c['max_rel']:.2e} at "
                       f"step {c['at_step']}; first/last loss {c['first']:.5f}/{c['last']:.5f} vs "
                       f"{cv['ref_losses'][0]:.5f}/{cv['ref_losses'][c['steps'] - 1]:.5f}")
        g = r.get("grad")
        if g and "error" not in g:
            out.append(f"- gradients: onyx grad {g['onyx_s']:.1f} s, ORT {g['ortt_s']:.1f} s (process "
                       f"walls); loss rel diff {g['loss_rel']:.1e}")
        out.append("")
    return "\n".join(out)


def plot(rows, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib missing: no plot"
    names = [r["model"] for r in rows]
    peers = [p for p in PEERS if any(p in r.get("runs", {}) for r in rows)]
    colors = {"onyx": "#d62728", "torch": "#1f77b4", "compile": "#9467bd", "ortt": "#2ca02c"}
    fig = plt.figure(figsize=(12, 7.5))
    gs = fig.add_gridspec(2, max(1, len(rows)), height_ratios=[1.6, 1])
    ax = fig.add_subplot(gs[0, :])
    x = np.arange(len(names))
    w = 0.8 / max(1, len(peers))
    for j, p in enumerate(peers):
        vals = [r.get("best", {}).get(p, {}).get("sps", 0) for r in rows]
        bars = ax.bar(x - 0.4 + w * (j + 0.5), [v or np.nan for v in vals], w, label=PEER_LABEL[p],
                      color=colors[p])
        for bar, v, r in zip(bars, vals, rows):
            ran = p in r.get("runs", {})
            txt = f"{v:.3g}" if v else ("failed" if ran else "")
            ax.annotate(txt, (bar.get_x() + bar.get_width() / 2, v if v else 1e-2), ha="center",
                        va="bottom", fontsize=7, rotation=90 if len(peers) > 3 else 0)
    ax.set_yscale("log")
    ax.set_xticks(x, names)
    ax.set_ylabel("samples/s (best thread setting; log scale)")
    ax.set_title("Training throughput, same model, weights and batches — "
                 + datetime.date.today().isoformat())
    ax.legend(fontsize=8, ncol=len(peers), loc="upper right")
    top = max([r.get("best", {}).get(p, {}).get("sps", 0) for r in rows for p in peers] + [1])
    ax.set_ylim(top=top * 4)
    for i, r in enumerate(rows):
        a2 = fig.add_subplot(gs[1, i])
        cv = r.get("curves", {})
        for p, c in cv.get("peers", {}).items():
            a2.semilogy(np.arange(1, c["steps"] + 1), np.maximum(c["rel"], 1e-9), ".-", ms=3,
                        color=colors[p], label=PEER_LABEL[p])
        a2.axhline(CURVE_RTOL, color="gray", ls="--", lw=1)
        a2.set_ylim(1e-9, 1e-2)
        a2.set_title(r["model"], fontsize=9)
        a2.set_xlabel("step", fontsize=8)
        a2.tick_params(labelsize=7)
        a2.xaxis.get_major_locator().set_params(integer=True)
        if i == 0:  # colours as in the bars above
            ref = PEER_LABEL.get(cv.get("ref"), "ref")
            a2.set_ylabel(f"loss: |peer − {ref}| / {ref}", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return None


def plans(rows):
    md = ["| model | fusions applied (count) | GFLOP/step (graph) | planned activations MiB | "
          "with gradient_checkpointing MiB | cut | planned step total MiB |",
          "|---|---|---|---|---|---|---|"]
    for r in rows:
        p = r.get("plan")
        if p is None:
            continue
        a, c = p.get("plain", {}), p.get("checkpointing", {})
        if not a or "error" in a:
            md.append(f"| {r['model']} | {esc(a.get('error', 'not run'))} | | | | | |")
            continue
        cut = (1 - c["activations_mib"] / a["activations_mib"]) if c.get("activations_mib") and \
            a.get("activations_mib") else None
        md.append(f"| {r['model']} | " + ", ".join(f"{k} {v}" for k, v in sorted(a["fusions"].items()))
                  + f" | {fmt(a['gflop'], '{:.2f}')} | {fmt(a['activations_mib'])} | "
                  f"{fmt(c.get('activations_mib'))} | {fmt(cut and 100 * cut, '{:.0f}%')} | "
                  f"{fmt(a['total_mib'])} |")
    md.append("")
    md.append("Planned activations: the size of the activation arena the memory plan lays out for one "
              "training step (offsets from lifetimes, in-place and views); the total adds parameters, "
              "gradients and AdamW's two moment buffers.")
    return "\n".join(md)


def write_report(path, rows, meta):
    ceiling = meta["sgemm_ceiling"]
    steps = ", ".join(f"{r['model']} {r['warmup']}+{r['steps']}"
                      + (f" (first runs {r['curve_len']})" if r.get("curve_len", 0) >
                         r.get("warmup", 0) + r.get("steps", 0) else "")
                      for r in rows if "warmup" in r)
    md = [
        "# Training benchmark: onyx vs PyTorch eager, torch.compile and ONNX Runtime Training",
        "",
        "Regenerated by `bash bench/run.sh` (bench/train_bench.py, bench/ortt_train.py); do not edit by "
        "hand. Raw data: results.json; chart: results.png.",
        "",
        f"- date: {meta['date']}; total {meta['total_s'] / 60:.1f} min",
        f"- machine: {meta['machine']['nproc']} CPUs, {meta['machine']['cpu']} "
        f"({meta['machine']['platform']}); load average at start {meta['load_start']}, "
        f"at end {meta['load_end']}",
        f"- peers: {', '.join(PEER_LABEL[p] for p in meta['peers'])}",
        f"- onyx: {meta['onyx']} (CMAKE_BUILD_TYPE {meta['build_type']}), --threads "
        f"{', '.join(str(t or 'default (all cores)') for t in meta['onyx_threads'])}",
        f"- PyTorch {meta['torch']} (Python {meta['machine']['python']}), torch.set_num_threads "
        f"{', '.join(map(str, meta['torch_threads']))}; torch.compile (inductor, default mode) at "
        + (("the fastest eager setting" if meta["compile_threads"] == "best"
            else "threads " + ", ".join(map(str, meta["compile_threads"]))))
        + f"; ONNX Runtime Training {meta.get('ortt_version') or '?'} ({meta['ortt_python']}), "
        f"intra_op_num_threads {', '.join(map(str, meta['ortt_threads']))}",
        f"- ONNX file (what onyx and ORT Training train): torch.onnx.export(..., dynamo=False) — the "
        f"TorchScript exporter — opset {BENCH_OPSET}, TrainingMode.TRAINING, do_constant_folding=False, "
        f"loss as the only output",
        f"- steps (warmup + measured): {steps}",
        f"- sgemm ceiling (`onyx_bench --benchmark_filter='{SGEMM_FILTER}'`, this run): "
        + (f"{ceiling:.1f} GFLOP/s" if ceiling else "n/a")
        + f" (before the models: {fmt(meta['sgemm_before'])}, after: {fmt(meta['sgemm_after'])}; "
          "the higher is used); one thread (OMP_NUM_THREADS=1, per CPU-second): "
        + fmt(meta.get("sgemm_one_thread"))
        + (f" — {meta['sgemm_error']}" if meta.get("sgemm_error") else ""),
        "",
        "## Summary",
        "",
        summary_table(rows),
        "",
        "Speed > 1: onyx faster than the fastest other peer. RSS < 1: onyx smaller than the smallest. "
        "Loss curves: |peer − torch eager| / |torch eager| per step, same initial weights and batches, "
        f"pass at ≤ {CURVE_RTOL:g}. Gradients: one batch, per tensor, pass at ≤ {GRAD_RTOL:g}.",
        "",
        "## Every peer",
        "",
        peer_table(rows, ceiling),
        "",
        "\\* onyx's GFLOP/s count the FLOPs its optimized graph executes (`onyx plan`); the other peers' "
        "the analytic count. compile + warmup: torch.compile's first step (it compiles forward and "
        "backward) + the other warmup steps, seconds, not in the steady state.",
        "",
        "## Gradients: onyx vs ONNX Runtime Training on the same ONNX file",
        "",
        grad_table(rows) if any(r.get("grad") for r in rows) else "Not run (needs the onyx and ortt "
        "peers; --no-grad-check turns it off).",
        "",
        "One batch (the first of the dataset) from the initial weights: `onyx grad model.onnx --inputs "
        "batch0.safetensors --loss loss --no-dropout` against ORT Training's gradient buffers after one "
        "forward + backward (Module on the generate_artifacts training model; "
        "CheckpointState.parameters[name].grad). Two independent autodiffs of the same graph. A tensor "
        f"whose gradient is zero in exact arithmetic (|g| < {GRAD_ZERO:g} of the model's largest on both "
        "sides: the attention key biases, which softmax cancels) is listed apart: a ratio of two "
        "rounding noises says nothing.",
        "",
        "## Method",
        "- Same model, batch and numerics for every peer: the ONNX model is exported from the PyTorch "
        f"module (opset {BENCH_OPSET}, TrainingMode.TRAINING, dropout 0); all start from the same weights "
        "and see the same synthetic batches in the same order; AdamW lr 1e-4 (constant), betas "
        "(0.9, 0.999), eps 1e-8, **weight decay 0**, **gradient clipping at global norm 1.0** for every "
        "peer.",
        "- Weight decay is 0 everywhere because ONNX Runtime Training's AdamWOptimizer node takes one "
        "weight_decay for the whole parameter sequence (no parameter groups): it would decay biases and "
        "LayerNorm weights, which onyx's trainer always exempts (the Hugging Face rule). 0 is the one "
        "setting the four peers apply identically.",
        "- ONNX Runtime Training: generate_artifacts(loss=None) keeps the graph's own scalar `loss` (no "
        "loss block added: the same cross entropy onyx differentiates), every float initializer "
        "trainable; onnxblock.optim.AdamW with clip_grad=ClipGradNorm(1.0) (InplaceClipGradNorm: "
        "scale by max_norm / (norm + 1e-6) when below 1, as torch.nn.utils.clip_grad_norm_ and onyx "
        "do). Its AdamWOptimizer node is switched to adam_mode 0 (torch.optim.AdamW's update: "
        "denominator sqrt(v)/sqrt(1−β2^t) + eps); onnxblock's default, adam_mode 1, is Hugging Face's "
        "legacy AdamW (denominator sqrt(v) + eps, step lr·sqrt(1−β2^t)/(1−β1^t)), which moves the loss "
        "curve ~1e-4 away from torch's in a few steps. ORT's gradient builders need optional outputs "
        "the TorchScript exporter leaves off (LayerNormalization's Mean/InvStdDev, "
        "SoftmaxCrossEntropyLoss's log_prob): bench/ortt_train.py names them in the copy it gives "
        "generate_artifacts; no value changes. The optimizer model gets the base model's IR version "
        "(onnx 1.23 writes IR 14; onnxruntime 1.19 reads at most 10).",
        "- torch.compile: torch.compile(model) (inductor, default mode) for forward + backward; "
        "clip_grad_norm_ and the AdamW step stay eager. Each run compiles cold (a fresh "
        "TORCHINDUCTOR_CACHE_DIR). Its first step compiles: compile seconds = that step's time; the W "
        "warmup steps are excluded from the steady state as for every peer.",
        "- Thread settings: every peer runs at each of its settings in its own process; the fastest "
        "(median step time) is reported. onyx --threads default (all cores) and 1; PyTorch "
        "torch.set_num_threads 2 and 1 (this torch's BLAS is MKL, with oneDNN; the only OpenBLAS in "
        "the process is numpy's, so OPENBLAS_NUM_THREADS no longer matters — bert-mini at 1 thread: "
        "0.620 vs 0.628 s/step at OPENBLAS_NUM_THREADS 1 vs 2 — and is not varied); ORT "
        "SessionOptions.intra_op_num_threads 2 and 1 "
        "(inter_op 1).",
        "- Step time: median over the steps after warmup. onyx: time between consecutive per-step log "
        "lines (logging_steps 1), read as they arrive on a pipe; the Python peers: perf_counter around "
        "each step (batch slicing, zero_grad / lazy_reset_grad, forward, backward, clipping, optimizer "
        "step, the loss as a float). samples/s = batch / median step time.",
        "- Peak RSS: ru_maxrss of each benchmark process alone, in MiB (measured through a small "
        "launcher: a child's ru_maxrss starts at its parent's RSS at fork, so the harness itself "
        "must not be the direct parent). torch.compile's includes compiling.",
        "- GFLOP/s: FLOPs per step / median step time. Analytic FLOPs = 6 × Σ(matmul weight numel × "
        "rows it multiplies) + 12 × L × B × T² × C (attention), see bench/bench_models.py. onyx: the "
        "FLOPs its optimized graph executes (`onyx plan`), which differ from the analytic count: token "
        "pruning skips the last layer's work on tokens a [CLS] read-out never uses (BERT, ViT), "
        "and the fused attention recomputes its scores in backward instead of storing them.",
        "- The machine is shared: timings are noisy; compare ratios measured in the same run.",
        "",
        "## What onyx does to each model (`onyx plan`, printed before anything runs)",
        "",
        plans(rows),
        "",
        "## Details",
        "",
        detail(rows),
    ]
    with open(path, "w") as f:
        f.write("\n".join(md) + "\n")


# ------------------------------------------------------------------------------------------------


def parse_per_model(text, what, ap):
    """'N' for every model, 'MODEL=N' for one: {'' : default, model: n}."""
    table = {}
    try:
        for part in text.split(","):
            if not part.strip():
                continue
            k, _, v = part.strip().rpartition("=")
            table[k] = int(v)
    except ValueError:
        ap.error(f"{what}: expected N or MODEL=N entries, got {text!r}")
    if "" not in table:
        ap.error(f"{what}: needs a plain N (the value for every other model), got {text!r}")
    return table


def int_list(text):
    return [int(x) for x in text.split(",") if x.strip()]


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "_torch_worker":
        return torch_worker(sys.argv[2:])
    import bench_models
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(bench_models.ALL_SPECS))
    ap.add_argument("--peers", default=",".join(PEERS),
                    help="comma list of onyx, torch (eager), compile (torch.compile), ortt (ONNX "
                         "Runtime Training); default all")
    ap.add_argument("--warmup", default=DEFAULT_WARMUP,
                    help=f"warmup steps (W), not timed: N or MODEL=N entries (default {DEFAULT_WARMUP})")
    ap.add_argument("--steps", default=DEFAULT_STEPS,
                    help=f"measured steps (S): N or MODEL=N entries (default {DEFAULT_STEPS})")
    ap.add_argument("--curves", dest="curves", action="store_true", default=True,
                    help="loss-curve comparison over --curve-steps (default on)")
    ap.add_argument("--no-curves", dest="curves", action="store_false",
                    help="compare losses only over the W+S timing steps")
    ap.add_argument("--curve-steps", default=DEFAULT_CURVES,
                    help="loss-curve length of each peer's first run: N for every model, MODEL=N for "
                         f"one, 0 = the timing steps (default {DEFAULT_CURVES})")
    ap.add_argument("--onyx-threads", default="0,1",
                    help="comma list of onyx --threads settings, 0 = onyx's default (all cores); "
                         "the fastest is reported; the first runs the loss-curve length (default 0,1)")
    ap.add_argument("--torch-threads", default="2,1",
                    help="torch.set_num_threads settings; the first runs the loss-curve length "
                         "(default 2,1)")
    ap.add_argument("--compile-threads", default="best",
                    help="torch.compile thread settings: a comma list, or 'best' = the fastest eager "
                         "setting of the same model (default best)")
    ap.add_argument("--ortt-threads", default="2,1",
                    help="ORT SessionOptions.intra_op_num_threads settings; the first runs the "
                         "loss-curve length (default 2,1)")
    ap.add_argument("--ortt-python", default=os.path.join(REPO, "build", "venv-ortt", "bin", "python"),
                    help="the Python with onnxruntime-training (default build/venv-ortt/bin/python)")
    ap.add_argument("--grad-check", dest="grad_check", action="store_true", default=True,
                    help="onyx vs ORT Training gradients on one batch (default on)")
    ap.add_argument("--no-grad-check", dest="grad_check", action="store_false")
    ap.add_argument("--onyx", default=os.path.join(REPO, "build", "onyx"))
    ap.add_argument("--onyx-bench", default=None, help="default: onyx_bench next to --onyx")
    ap.add_argument("--workdir", default=None, help="default: a temporary directory")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--out", default=HERE, help="where RESULTS.md, results.png, results.json go")
    args = ap.parse_args()
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    peers = []
    for p in args.peers.split(","):
        p = PEER_ALIASES.get(p.strip().lower(), p.strip().lower())
        if p and p not in PEERS:
            ap.error(f"unknown peer {p!r}; known: {', '.join(PEERS)}")
        if p and p not in peers:
            peers.append(p)
    if not peers:
        ap.error("--peers: none given")
    args.peers = [p for p in PEERS if p in peers]
    args.warmup = parse_per_model(args.warmup, "--warmup", ap)
    args.steps = parse_per_model(args.steps, "--steps", ap)
    args.curve_steps = parse_per_model(args.curve_steps, "--curve-steps", ap)
    if min(args.warmup.values()) < 1 or min(args.steps.values()) < 1:
        ap.error("--warmup and --steps must be >= 1")
    args.onyx_threads = int_list(args.onyx_threads) or [0]
    args.torch_threads = int_list(args.torch_threads) or [1]
    args.ortt_threads = int_list(args.ortt_threads) or [1]
    if args.compile_threads.strip() != "best":
        args.compile_threads = int_list(args.compile_threads) or [1]
    else:
        args.compile_threads = "best"
    unknown = [n for n in names if n not in bench_models.ALL_SPECS]
    if unknown:
        ap.error(f"unknown model(s) {unknown}; known: {list(bench_models.ALL_SPECS)}")
    if "onyx" in args.peers and not os.access(args.onyx, os.X_OK):
        ap.error(f"onyx binary not found at {args.onyx}")
    if "ortt" in args.peers and not os.access(args.ortt_python, os.X_OK):
        ap.error(f"no ONNX Runtime Training Python at {args.ortt_python} (run scripts/setup.sh, or "
                 "pass --ortt-python, or leave ortt out of --peers)")
    onyx_bench = args.onyx_bench or os.path.join(os.path.dirname(os.path.abspath(args.onyx)),
                                                 "onyx_bench")
    workdir = args.workdir or tempfile.mkdtemp(prefix="onyx-train-bench-")
    os.makedirs(workdir, exist_ok=True)
    t_start = time.time()

    def log(msg):
        print(f"[{time.time() - t_start:6.0f}s] {msg}", flush=True)

    import torch
    meta = {"date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"), "machine": machine_info(),
            "load_start": " ".join(f"{x:.1f}" for x in os.getloadavg()), "onyx": repo_rel(args.onyx),
            "build_type": build_type(args.onyx), "torch": torch.__version__, "peers": args.peers,
            "curves": args.curves, "onyx_threads": args.onyx_threads,
            "torch_threads": args.torch_threads, "compile_threads": args.compile_threads,
            "ortt_threads": args.ortt_threads, "ortt_python": repo_rel(args.ortt_python),
            "exporter": f"torch.onnx.export(dynamo=False) TorchScript, opset {BENCH_OPSET}",
            "lr": LR, "weight_decay": WD, "max_grad_norm": MAX_GRAD_NORM, "betas": BETAS, "eps": EPS,
            "models": names}
    if "ortt" in args.peers:
        p = subprocess.run([args.ortt_python, "-c", "import onnxruntime; print(onnxruntime.__version__)"],
                           capture_output=True, text=True)
        meta["ortt_version"] = p.stdout.strip() or None
    log(f"machine: {meta['machine']['nproc']} CPUs, {meta['machine']['cpu']}; load {meta['load_start']}; "
        f"workdir {workdir}; peers {', '.join(args.peers)}")
    before, err = sgemm_ceiling(onyx_bench)
    log(f"sgemm ceiling (before): {fmt(before)} GFLOP/s" + (f" ({err})" if err else ""))
    rows = []
    try:
        for n in names:
            try:
                rows.append(bench_model(n, bench_models.ALL_SPECS[n], args, workdir, log))
            except Exception as e:  # the harness's own failure for this model: record, go on
                log(f"[{n}] harness error: {type(e).__name__}: {e}")
                rows.append({"model": n, "desc": bench_models.ALL_SPECS[n]["desc"], "params": 0,
                             "flops_per_step": 0, "batch": bench_models.ALL_SPECS[n]["batch"],
                             "error": f"harness: {type(e).__name__}: {e}"})
        after, err2 = sgemm_ceiling(onyx_bench)
        log(f"sgemm ceiling (after): {fmt(after)} GFLOP/s" + (f" ({err2})" if err2 else ""))
        one, _ = sgemm_ceiling(onyx_bench, one_thread=True)
        log(f"sgemm, one thread (CPU time): {fmt(one)} GFLOP/s")
        meta["sgemm_one_thread"] = one
        vals = [v for v in (before, after) if v]
        meta.update(sgemm_before=before, sgemm_after=after, sgemm_ceiling=max(vals) if vals else None,
                    sgemm_error=err or err2,
                    load_end=" ".join(f"{x:.1f}" for x in os.getloadavg()),
                    total_s=time.time() - t_start)
        os.makedirs(args.out, exist_ok=True)
        write_report(os.path.join(args.out, "RESULTS.md"), rows, meta)
        perr = plot(rows, os.path.join(args.out, "results.png"))
        with open(os.path.join(args.out, "results.json"), "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
        print()
        print(summary_table(rows))
        print()
        print(peer_table(rows, meta["sgemm_ceiling"]))
        print()
        if any(r.get("grad") for r in rows):
            print(grad_table(rows))
            print()
        if perr:
            print(perr)
        log(f"done in {time.time() - t_start:.0f}s; wrote {args.out}/RESULTS.md, results.png, results.json")
    finally:
        if not args.keep and not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    bad = [r["model"] for r in rows if r.get("grad") and not r["grad"].get("pass")]
    if bad:
        print(f"error: gradient check failed (onyx vs ORT Training, > {GRAD_RTOL:g} or not run) for: "
              + ", ".join(bad), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
