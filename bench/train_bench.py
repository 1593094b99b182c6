"""train_bench.py — end-to-end training benchmark: onyx vs PyTorch on bert-mini, gpt2-tiny, vit-tiny.

Usage (normally through bench/run.sh, which builds the binaries first):
  /usr/bin/python3 bench/train_bench.py [--models bert-mini,gpt2-tiny,vit-tiny] [--warmup 3]
      [--steps 10] [--curve-steps 50,gpt2-tiny=20 | --no-curves] [--onyx-threads 0,1]
      [--onyx build/onyx] [--onyx-bench build/onyx_bench] [--workdir DIR] [--keep] [--out bench]

For each model (bench_models.py), in one run:
  1. Build the PyTorch model (fixed seed, dropout 0), export it to ONNX (opset 14, TrainingMode.TRAINING,
     no constant folding, loss inside the graph as the only output `loss`, dynamic batch axes),
     save its initial weights (init.safetensors: the same tensors as the ONNX initializers; checked)
     and a synthetic dataset (fixed seed) of max(W+S, curve steps) batches.
  2. onyx: `onyx [--threads N] train` at each --onyx-threads setting (default: onyx's default, all
     cores, and 1 thread; the fastest is reported, as for PyTorch: on a loaded 2-core machine the
     2-thread runs suffer far more than the 1-thread ones) with AdamW (adamw_fused) lr 1e-4, weight_decay 0.01, betas (0.9, 0.999),
     eps 1e-8, constant LR, max_grad_norm 1.0, sequential sampling, logging_steps 1, save_strategy no.
  3. PyTorch: the same module, initial weights and batches; torch.optim.AdamW with the same
     hyper-parameters and param groups (onyx's rule: no decay on biases, LayerNorm-like names and
     rank <= 1 tensors), clip_grad_norm_(1.0); one subprocess per thread setting
     {torch.set_num_threads 1, 2} x {OPENBLAS_NUM_THREADS 2, 1} (the variable must be set before
     torch is imported). The fastest setting (by median step time) is reported.
  4. Loss curves: onyx's per-step losses (log_history.jsonl) against PyTorch's, same init and batches;
     max relative difference |onyx - torch| / |torch| over the steps, pass when <= 1e-3.
  5. GFLOP/s: analytic FLOPs per step (bench_models.py docstring) / median step time, against the
     sgemm ceiling `onyx_bench --benchmark_filter='sgemm/onednn/2048x768x768$'` measured in this run
     (before and after the models; the higher of the two is the ceiling).

Timing method. Every measurement is its own subprocess (nothing is shared between runs).
  onyx: the log has no per-step time, so the harness timestamps each log line as it arrives: with
        logging_steps 1 and stdout a pipe, onyx prints (and flushes) one JSON line per optimizer step,
        right after the step. The parent blocks in readline() (no polling, no CPU taken from the
        child) and records time.perf_counter() per line; step i's time is t_i - t_{i-1}. This excludes
        process start, ONNX loading, autodiff and the dataset load, and is checked against the
        trainer's own train_runtime (reported in results.json).
  torch: time.perf_counter() around each step (batch slicing, zero_grad, forward, backward,
        clip_grad_norm_, optimizer.step, loss.item()).
  Both: steady state = the median of the per-step times after the first W (warmup) steps of the run;
  samples/s = batch / median step time.
Peak RSS: ru_maxrss of each benchmark process alone (os.wait4 in a tiny launcher process; see
_LAUNCHER for why the process that imports torch must not be the direct parent), so runs do not
contaminate one another (RUSAGE_CHILDREN in one parent would give the max over all children so far).
Run length: the loss-curve comparison reuses the timing runs: the first onyx setting and the first
PyTorch setting run max(W+S, curve steps) steps, the other settings W+S steps. Curve steps default
to 50, 20 for gpt2-tiny (its steps cost ~7x the others'; 50 would push a default run well past
15 minutes on 2 cores). With --no-curves, or curve
steps <= W+S, every run is W+S steps and the curves cover those steps.

Outputs: bench/RESULTS.md (regenerated), bench/results.png (ratios), bench/results.json (raw data).
If `onyx train` fails for a model, its row records the failure message and the benchmark goes on.
"""
import argparse
import datetime
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
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "tests", "parity"))
import st_io  # noqa: E402

TORCH_SETTINGS = [(1, 2), (2, 2), (1, 1), (2, 1)]  # (torch.set_num_threads, OPENBLAS_NUM_THREADS)
LR, WD, MAX_GRAD_NORM = 1e-4, 0.01, 1.0
CURVE_RTOL = 1e-3
# Multi-threaded runs of onyx_bench carry a "/real_time" suffix (UseRealTime), single-threaded ones
# do not: 'sgemm/onednn/2048x768x768$' alone matches nothing on a multi-core machine.
SGEMM_FILTER = "sgemm/onednn/2048x768x768(/real_time)?$"


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


# ------------------------------------------------------------------------------------------------
# Preparation: export, initial weights, dataset


def prepare(name, spec, mdir, n_batches):
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
    example = tuple(torch.from_numpy(data[k][:b]) for k in spec["inputs"])
    path = os.path.join(mdir, "model.onnx")
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, example, path, input_names=spec["inputs"], output_names=["loss"],
                          dynamic_axes=spec["axes"], opset_version=14,
                          training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                          dynamo=False)
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
    n_params = sum(p.numel() for p in model.parameters())
    return {"params": n_params, "onnx_mb": os.path.getsize(path) / 2**20,
            "flops_per_step": spec["flops"](b)}


# ------------------------------------------------------------------------------------------------
# onyx


def write_onyx_config(name, spec, mdir, steps, tag):
    out_dir = os.path.join(mdir, tag + "_out")
    shutil.rmtree(out_dir, ignore_errors=True)
    cfg = {
        "model": os.path.join(mdir, "model.onnx"), "loss": "loss",
        "train_data": os.path.join(mdir, "train.safetensors"), "output_dir": out_dir,
        "max_steps": steps, "per_device_train_batch_size": spec["batch"],
        "learning_rate": LR, "weight_decay": WD, "adam_beta1": 0.9, "adam_beta2": 0.999,
        "adam_epsilon": 1e-8, "lr_scheduler_type": "constant", "max_grad_norm": MAX_GRAD_NORM,
        "optim": "adamw_fused", "train_sampling_strategy": "sequential", "logging_steps": 1,
        "save_strategy": "no", "eval_strategy": "no", "disable_tqdm": True, "seed": 42,
    }
    cfg_path = os.path.join(mdir, tag + "_config.json")  # JSON is valid YAML
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=1)
    return cfg_path, out_dir


def run_plan(onyx, name, spec, mdir):
    """`onyx plan` of the benchmark config, without and with gradient_checkpointing: the fusions
    applied (with counts), FLOPs per step and the planned memory."""
    cfg_path, _ = write_onyx_config(name, spec, mdir, 1, "plan")
    res = {}
    for key, extra in (("plain", []), ("checkpointing", ["--gradient_checkpointing", "true"])):
        p = subprocess.run([onyx, "plan", cfg_path] + extra, capture_output=True, text=True,
                           timeout=600)
        if p.returncode != 0:
            res[key] = {"error": (p.stderr.strip().splitlines() or ["exit %d" % p.returncode])[-1]}
            continue
        r = {"text": p.stdout}
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


def run_onyx(onyx, name, spec, mdir, steps, warmup, threads=0):
    """threads 0: onyx's default (all cores); N > 0: `onyx --threads N train ...`."""
    tag = f"onyx_t{threads}"
    cfg_path, out_dir = write_onyx_config(name, spec, mdir, steps, tag)
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
    res = {"threads": threads, "rc": rc, "peak_rss_mb": rss, "wall_s": wall, "steps": steps}
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
# PyTorch (worker runs in its own process: `train_bench.py _torch_worker ...`)


def torch_worker(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("--model")
    ap.add_argument("--mdir")
    ap.add_argument("--steps", type=int)
    ap.add_argument("--threads", type=int)
    ap.add_argument("--result")
    a = ap.parse_args(argv)
    import torch  # OPENBLAS_NUM_THREADS is already in the environment
    import bench_models
    torch.set_num_threads(a.threads)
    spec = bench_models.SPECS[a.model]
    model = spec["ctor"]()
    init = st_io.load(os.path.join(a.mdir, "init.safetensors"))
    model.load_state_dict({k: torch.from_numpy(v) for k, v in init.items()})
    del init
    model.train()
    data = st_io.load(os.path.join(a.mdir, "train.safetensors"))
    opt = torch.optim.AdamW(bench_models.param_groups(model, WD), lr=LR, betas=(0.9, 0.999),
                            eps=1e-8, weight_decay=WD)
    params = list(model.parameters())
    b = spec["batch"]
    times, losses = [], []
    for i in range(a.steps):
        t0 = time.perf_counter()
        batch = [torch.from_numpy(data[k][i * b:(i + 1) * b]) for k in spec["inputs"]]
        opt.zero_grad(set_to_none=True)
        loss = model(*batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, MAX_GRAD_NORM)
        opt.step()
        lv = loss.item()
        times.append(time.perf_counter() - t0)
        losses.append(lv)
    with open(a.result, "w") as f:
        json.dump({"times": times, "losses": losses, "torch": torch.__version__,
                   "num_threads": torch.get_num_threads()}, f)


def run_torch(name, mdir, steps, warmup, threads, blas):
    result = os.path.join(mdir, f"torch_t{threads}_b{blas}.json")
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(blas))
    cmd = [sys.executable, os.path.abspath(__file__), "_torch_worker", "--model", name, "--mdir", mdir,
           "--steps", str(steps), "--threads", str(threads), "--result", result]
    err = os.path.join(mdir, f"torch_t{threads}_b{blas}.stderr")
    rc, rss, wall = run_child(cmd, env=env, stderr_path=err)
    res = {"threads": threads, "openblas": blas, "rc": rc, "peak_rss_mb": rss, "wall_s": wall,
           "steps": steps}
    if rc != 0:
        res["error"] = exit_text("torch worker", rc, err)
        return res
    with open(result) as f:
        r = json.load(f)
    steady = r["times"][warmup:]
    res.update(losses=r["losses"], step_times=r["times"], median_step_s=statistics.median(steady),
               mean_step_s=statistics.mean(steady), n_timed=len(steady))
    return res


# ------------------------------------------------------------------------------------------------
# One model


def bench_model(name, spec, args, workdir, log):
    mdir = os.path.join(workdir, name)
    timed = args.warmup + args.steps
    curve = max(timed, args.curve_steps.get(name, args.curve_steps[""])) if args.curves else timed
    row = {"model": name, "desc": spec["desc"], "batch": spec["batch"]}
    t0 = time.time()
    row.update(prepare(name, spec, mdir, curve))
    log(f"[{name}] exported ({row['params'] / 1e6:.2f}M params, {row['onnx_mb']:.0f} MB ONNX, "
        f"{row['flops_per_step'] / 1e9:.1f} GFLOP/step) in {time.time() - t0:.0f}s")

    row["plan"] = run_plan(args.onyx, name, spec, mdir)
    pl, pc = row["plan"].get("plain", {}), row["plan"].get("checkpointing", {})
    if "error" in pl:
        log(f"[{name}] onyx plan FAILED: {pl['error']}")
    else:
        log(f"[{name}] onyx plan: fusions {pl['fusions']}; {pl['gflop']} GFLOP/step; activations "
            f"{pl['activations_mib']} MiB, with gradient_checkpointing {pc.get('activations_mib')} MiB")

    row["onyx_runs"] = []
    for i, th in enumerate(args.onyx_threads):
        t0 = time.time()
        o = run_onyx(args.onyx, name, spec, mdir, curve if i == 0 else timed, args.warmup, th)
        row["onyx_runs"].append(o)
        what = f"onyx threads={th or 'default'}"
        if "error" in o:
            log(f"[{name}] {what} FAILED: {o['error']}")
        else:
            log(f"[{name}] {what}: {o['median_step_s']:.3f} s/step median over {o['n_timed']} steps, "
                f"peak RSS {o['peak_rss_mb']:.0f} MiB ({time.time() - t0:.0f}s)")
    ok_onyx = [o for o in row["onyx_runs"] if "error" not in o]
    # The fastest onyx setting; its losses are compared with PyTorch's (the longest run's losses
    # when settings differ in length: losses do not depend on the thread count beyond float noise).
    o = min(ok_onyx, key=lambda r: r["median_step_s"]) if ok_onyx else row["onyx_runs"][0]
    row["onyx"] = o
    curve_run = max(ok_onyx, key=lambda r: r["steps"]) if ok_onyx else o

    row["torch"] = []
    for i, (th, blas) in enumerate(TORCH_SETTINGS):
        t0 = time.time()
        r = run_torch(name, mdir, curve if i == 0 else timed, args.warmup, th, blas)
        row["torch"].append(r)
        if "error" in r:
            log(f"[{name}] torch threads={th} OPENBLAS={blas} FAILED: {r['error']}")
        else:
            log(f"[{name}] torch threads={th} OPENBLAS={blas}: {r['median_step_s']:.3f} s/step, "
                f"peak RSS {r['peak_rss_mb']:.0f} MiB ({time.time() - t0:.0f}s)")
    ok = [r for r in row["torch"] if "error" not in r]
    b = spec["batch"]
    if ok:
        best = min(ok, key=lambda r: r["median_step_s"])
        row["torch_best"] = {k: best[k] for k in ("threads", "openblas", "median_step_s",
                                                  "peak_rss_mb")}
        row["torch_sps"] = b / best["median_step_s"]
        row["torch_gflops"] = row["flops_per_step"] / best["median_step_s"] / 1e9
    if "error" not in o:
        row["onyx_sps"] = b / o["median_step_s"]
        # onyx executes the FLOPs its plan counts (token pruning skips some of the analytic ones;
        # attention recomputes its scores in backward): its hardware efficiency uses those.
        gf = row.get("plan", {}).get("plain", {}).get("gflop")
        row["onyx_flops_executed"] = gf * 1e9 if gf else row["flops_per_step"]
        row["onyx_gflops"] = row["onyx_flops_executed"] / o["median_step_s"] / 1e9
        if ok:
            row["speed_ratio"] = row["onyx_sps"] / row["torch_sps"]
            row["rss_ratio"] = o["peak_rss_mb"] / best["peak_rss_mb"]
        # Loss curve against the longest PyTorch run (settings differ only by float noise).
        ref = max(ok, key=lambda r: r["steps"]) if ok else None
        if ref:
            ol = curve_run["losses"]
            n = min(len(ol), len(ref["losses"]))
            rel = [abs(ol[i] - ref["losses"][i]) / abs(ref["losses"][i]) for i in range(n)]
            worst = int(np.argmax(rel))
            row["curve"] = {"steps": n, "max_rel": max(rel), "at_step": worst + 1,
                            "onyx": ol[:n], "torch": ref["losses"][:n],
                            "torch_setting": [ref["threads"], ref["openblas"]],
                            "pass": max(rel) <= CURVE_RTOL}
            log(f"[{name}] loss curve over {n} steps: max rel diff {max(rel):.2e} at step {worst + 1} "
                f"(first loss onyx {ol[0]:.5f} torch {ref['losses'][0]:.5f})")
    return row


# ------------------------------------------------------------------------------------------------
# Report


def fmt(x, spec="{:.1f}"):
    return "—" if x is None else spec.format(x)


def table(rows, ceiling):
    head = ("| model | onyx samples/s | torch best samples/s (setting) | speed ratio onyx/torch | "
            "onyx peak RSS MiB | torch peak RSS MiB | RSS ratio onyx/torch | onyx GFLOP/s (executed) | "
            "% of sgemm ceiling | torch GFLOP/s | loss curve max rel diff (steps) |")
    lines = [head, "|" + "|".join(["---"] * 11) + "|"]
    for r in rows:
        tb = r.get("torch_best")
        tset = f" (threads {tb['threads']}, OpenBLAS {tb['openblas']})" if tb else ""
        torch_cell = (fmt(r.get("torch_sps")) + tset) if tb else "failed: " + "; ".join(
            t.get("error", "") for t in r.get("torch", []))[:200]
        o = r.get("onyx", {})
        if "error" in o or "onyx_sps" not in r:
            err = o.get("error", r.get("error", "not run")).replace("|", "\\|")
            lines.append(f"| {r['model']} | **FAILED**: {err} | {torch_cell} | — | "
                         f"{fmt(o.get('peak_rss_mb'), '{:.0f}')} | "
                         f"{fmt(tb and tb['peak_rss_mb'], '{:.0f}')} | — | — | — | "
                         f"{fmt(r.get('torch_gflops'))} | — |")
            continue
        onyx_set = (f" (threads {o['threads'] or 'default'})" if len(r.get("onyx_runs", [])) > 1
                    else "")
        c = r.get("curve")
        curve_cell = (f"{c['max_rel']:.1e} ({c['steps']}) {'ok' if c['pass'] else '**> 1e-3**'}"
                      if c else "—")
        pct = (100 * r["onyx_gflops"] / ceiling) if ceiling else None
        lines.append(
            f"| {r['model']} | {r['onyx_sps']:.1f}{onyx_set} | {torch_cell} | "
            f"{fmt(r.get('speed_ratio'), '{:.2f}')} | {o['peak_rss_mb']:.0f} | "
            f"{fmt(tb and tb['peak_rss_mb'], '{:.0f}')} | {fmt(r.get('rss_ratio'), '{:.2f}')} | "
            f"{r['onyx_gflops']:.1f} | {fmt(pct, '{:.0f}%')} | {fmt(r.get('torch_gflops'))} | "
            f"{curve_cell} |")
    return "\n".join(lines)


def detail(rows):
    out = []
    for r in rows:
        out.append(f"### {r['model']} — {r['desc']}")
        out.append(f"{r['params'] / 1e6:.2f}M parameters, {r['flops_per_step'] / 1e9:.1f} GFLOP per "
                   f"training step (analytic).")
        if r.get("error"):
            out.append(f"- **harness error**: `{r['error']}`")
        for o in r.get("onyx_runs", []):
            what = f"- onyx threads={o['threads'] or 'default'}: "
            if "median_step_s" in o:
                out.append(what + f"median {o['median_step_s'] * 1e3:.0f} ms/step over "
                           f"{o['n_timed']} steps (mean {o['mean_step_s'] * 1e3:.0f} ms; run of "
                           f"{o['steps']} steps, trainer's train_runtime {o['train_runtime']:.1f} s, "
                           f"process wall {o['wall_s']:.1f} s), peak RSS {o['peak_rss_mb']:.0f} MiB")
            else:
                out.append(what + f"**failed**: `{o.get('error')}` (peak RSS "
                           f"{o.get('peak_rss_mb', 0):.0f} MiB, {o.get('wall_s', 0):.0f} s)")
        for t in r.get("torch", []):
            s = f"- torch threads={t['threads']} OPENBLAS_NUM_THREADS={t['openblas']}: "
            if "error" in t:
                s += f"**failed**: `{t['error']}`"
            else:
                s += (f"median {t['median_step_s'] * 1e3:.0f} ms/step over {t['n_timed']} steps "
                      f"(mean {t['mean_step_s'] * 1e3:.0f} ms), peak RSS {t['peak_rss_mb']:.0f} MiB")
            out.append(s)
        c = r.get("curve")
        if c:
            out.append(f"- loss curve: {c['steps']} steps, max rel diff {c['max_rel']:.2e} at step "
                       f"{c['at_step']}; first/last loss onyx {c['onyx'][0]:.5f}/{c['onyx'][-1]:.5f}, "
                       f"torch {c['torch'][0]:.5f}/{c['torch'][-1]:.5f}")
        out.append("")
    return "\n".join(out)


def plot(rows, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib missing (apt-get install -y python3-matplotlib): no plot"
    names = [r["model"] for r in rows]
    sp = [r.get("speed_ratio", 0) or 0 for r in rows]
    rs = [r.get("rss_ratio", 0) or 0 for r in rows]
    x = np.arange(len(names))
    fig, ax = plt.subplots(figsize=(7, 4))
    b1 = ax.bar(x - 0.2, sp, 0.4, label="speed: onyx / torch samples/s (higher is better)")
    b2 = ax.bar(x + 0.2, rs, 0.4, label="memory: onyx / torch peak RSS (lower is better)")
    for bars in (b1, b2):
        for bar in bars:
            h = bar.get_height()
            ax.annotate("failed" if h == 0 else f"{h:.2f}", (bar.get_x() + bar.get_width() / 2, h),
                        ha="center", va="bottom", fontsize=8)
    ax.axhline(1.0, color="gray", lw=1, ls="--")
    ax.set_ylim(0, max([1.0] + sp + rs) * 1.35)
    ax.set_xticks(x, names)
    ax.set_ylabel("ratio onyx / PyTorch (best setting)")
    ax.set_title("onyx vs PyTorch training, " + datetime.date.today().isoformat())
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return None


def plans(rows):
    md = ["| model | fusions applied (count) | GFLOP/step (graph) | planned activations MiB | "
          "with gradient_checkpointing MiB | cut | planned step total MiB |",
          "|---|---|---|---|---|---|---|"]
    for r in rows:
        p = r.get("plan", {})
        a, c = p.get("plain", {}), p.get("checkpointing", {})
        if not a or "error" in a:
            md.append(f"| {r['model']} | {a.get('error', 'not run')} | | | | | |")
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
    md = [
        "# Training benchmark: onyx vs PyTorch",
        "",
        "Regenerated by `bash bench/run.sh` (bench/train_bench.py); do not edit by hand. Raw data: "
        "results.json; chart: results.png.",
        "",
        f"- date: {meta['date']}",
        f"- machine: {meta['machine']['nproc']} CPUs, {meta['machine']['cpu']} "
        f"({meta['machine']['platform']}); load average at start {meta['load_start']}, "
        f"at end {meta['load_end']}",
        f"- onyx: {meta['onyx']} (CMAKE_BUILD_TYPE {meta['build_type']}), --threads settings "
        f"{', '.join(str(t or 'default (all cores)') for t in meta['onyx_threads'])}; "
        f"PyTorch {meta['torch']}",
        f"- steps: {meta['warmup']} warmup + {meta['steps']} measured"
        + ("; loss curves: the first onyx and torch settings run "
           + ", ".join(f"{n} {k}" for n, k in meta["curve_steps"].items()) + " steps"
           if meta["curves"] else "")
        + ("; loss curves off (--no-curves): compared over the timing runs" if not meta["curves"] else ""),
        f"- sgemm ceiling (`onyx_bench --benchmark_filter='{SGEMM_FILTER}'`, this run): "
        + (f"{ceiling:.1f} GFLOP/s" if ceiling else "n/a")
        + f" (before the models: {fmt(meta['sgemm_before'])}, after: {fmt(meta['sgemm_after'])}; "
          "the higher is used); one thread (OMP_NUM_THREADS=1, per CPU-second): "
        + fmt(meta.get("sgemm_one_thread"))
        + (f" — {meta['sgemm_error']}" if meta.get("sgemm_error") else ""),
        "",
        table(rows, ceiling),
        "",
        "Speed ratio > 1: onyx faster. RSS ratio < 1: onyx smaller. Loss curves: |onyx − torch| / |torch| "
        "per step, same initial weights and batches, pass at ≤ 1e-3.",
        "",
        "## Method",
        "- Same model, batch and numerics on both sides: the ONNX model is exported from the PyTorch "
        "module (opset 14, TrainingMode.TRAINING, dropout 0), both start from the same weights and "
        "see the same synthetic batches in the same order; AdamW lr 1e-4, weight decay 0.01 (not on "
        "biases, LayerNorm and rank ≤ 1 tensors, both sides), betas (0.9, 0.999), eps 1e-8, constant "
        "LR, gradient clipping at norm 1.0.",
        "- PyTorch runs at each of torch.set_num_threads {1, 2} × OPENBLAS_NUM_THREADS {2, 1}, each in "
        "its own process; the fastest (median step time) is reported.",
        "- Step time: median over the steps after warmup. onyx: time between consecutive per-step log "
        "lines (logging_steps 1), read as they arrive on a pipe; torch: perf_counter around each step. "
        "samples/s = batch / median step time.",
        "- Peak RSS: ru_maxrss of each benchmark process alone, in MiB (measured through a small "
        "launcher: a child's ru_maxrss starts at its parent's RSS at fork, so the harness itself "
        "must not be the direct parent).",
        "- GFLOP/s: FLOPs per step / median step time. torch: analytic FLOPs = 6 × Σ(matmul weight numel × "
        "rows it multiplies) + 12 × L × B × T² × C (attention), see bench/bench_models.py. onyx: the "
        "FLOPs its optimized graph executes (`onyx plan`), which differ from the analytic count: token "
        "pruning skips the last layer's work on tokens a [CLS] read-out never uses (bert-mini, vit-tiny), "
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


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "_torch_worker":
        return torch_worker(sys.argv[2:])
    import bench_models
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(bench_models.SPECS))
    ap.add_argument("--warmup", type=int, default=3, help="warmup steps (W), not timed")
    ap.add_argument("--steps", type=int, default=10, help="measured steps (S)")
    ap.add_argument("--curves", dest="curves", action="store_true", default=True,
                    help="loss-curve comparison over --curve-steps (default on)")
    ap.add_argument("--no-curves", dest="curves", action="store_false",
                    help="compare losses only over the W+S timing steps")
    ap.add_argument("--curve-steps", default="50,gpt2-tiny=20",
                    help="loss-curve length: N for every model, MODEL=N for one (default: "
                         "50,gpt2-tiny=20: gpt2-tiny's steps cost ~7x the others', 50 of them would "
                         "push a default run past ~15 minutes on 2 cores)")
    ap.add_argument("--onyx-threads", default="0,1",
                    help="comma list of onyx --threads settings to try, 0 = onyx's default (all "
                         "cores); the fastest is reported, as for PyTorch; the first one runs the "
                         "loss-curve length (default: 0,1)")
    ap.add_argument("--onyx", default=os.path.join(REPO, "build", "onyx"))
    ap.add_argument("--onyx-bench", default=None, help="default: onyx_bench next to --onyx")
    ap.add_argument("--workdir", default=None, help="default: a temporary directory")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--out", default=HERE, help="where RESULTS.md, results.png, results.json go")
    args = ap.parse_args()
    if args.warmup < 1 or args.steps < 1:
        ap.error("--warmup and --steps must be >= 1")
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    args.onyx_threads = [int(x) for x in args.onyx_threads.split(",") if x.strip()] or [0]
    curve_steps = {"": 50}
    try:
        for part in args.curve_steps.split(","):
            k, _, v = part.strip().rpartition("=")
            curve_steps[k] = int(v)
    except ValueError:
        ap.error(f"--curve-steps: expected N or MODEL=N entries, got {args.curve_steps!r}")
    args.curve_steps = curve_steps
    unknown = [n for n in names if n not in bench_models.SPECS]
    if unknown:
        ap.error(f"unknown model(s) {unknown}; known: {list(bench_models.SPECS)}")
    if not os.access(args.onyx, os.X_OK):
        ap.error(f"onyx binary not found at {args.onyx}")
    onyx_bench = args.onyx_bench or os.path.join(os.path.dirname(os.path.abspath(args.onyx)),
                                                 "onyx_bench")
    workdir = args.workdir or tempfile.mkdtemp(prefix="onyx-train-bench-")
    os.makedirs(workdir, exist_ok=True)
    t_start = time.time()

    def log(msg):
        print(f"[{time.time() - t_start:6.0f}s] {msg}", flush=True)

    import torch
    meta = {"date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"), "machine": machine_info(),
            "load_start": " ".join(f"{x:.1f}" for x in os.getloadavg()), "onyx": args.onyx,
            "build_type": build_type(args.onyx), "torch": torch.__version__, "warmup": args.warmup,
            "steps": args.steps, "curves": args.curves,
            "curve_steps": {n: args.curve_steps.get(n, args.curve_steps[""]) for n in names},
            "onyx_threads": args.onyx_threads,
            "models": names}
    log(f"machine: {meta['machine']['nproc']} CPUs, {meta['machine']['cpu']}; load {meta['load_start']}; "
        f"workdir {workdir}")
    before, err = sgemm_ceiling(onyx_bench)
    log(f"sgemm ceiling (before): {fmt(before)} GFLOP/s" + (f" ({err})" if err else ""))
    rows = []
    try:
        for n in names:
            try:
                rows.append(bench_model(n, bench_models.SPECS[n], args, workdir, log))
            except Exception as e:  # the harness's own failure for this model: record, go on
                log(f"[{n}] harness error: {type(e).__name__}: {e}")
                rows.append({"model": n, "desc": bench_models.SPECS[n]["desc"], "params": 0,
                             "flops_per_step": 0, "batch": bench_models.SPECS[n]["batch"],
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
        print(table(rows, meta["sgemm_ceiling"]))
        print()
        if perr:
            print(perr)
        log(f"done in {time.time() - t_start:.0f}s; wrote {args.out}/RESULTS.md, results.png, results.json")
    finally:
        if not args.keep and not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
