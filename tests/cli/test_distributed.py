"""test_distributed.py — data-parallel `onyx train` under mpirun (OpenMPI): DDP, ZeRO-1, ZeRO-2.

The model: a GPT-2 causal LM from a config (vocab 101, 2 layers, dropout 0.1 everywhere, so the
per-micro-batch dropout seeds matter), 29 216 parameter elements (not a multiple of 128), on
ragged token data (labels -100 after a random length, so micro-batches have different item
counts and the loss weighting across ranks matters). Sequential sampling unless a case says.

Cases (one PASS / FAIL / SKIP line each):
  equal-ddp, equal-zero1, equal-zero2
        `mpirun -np 2` with batch 4 ≡ one process with batch 4 and gradient_accumulation_steps 2,
        max_grad_norm 0.5 (clipping active), 6 steps with random sampling: model.safetensors,
        the optimizer moments of checkpoint-6 (ZeRO's two shards put together by their ranges)
        and every logged loss / grad_norm bit for bit equal.
  buckets-overlap-ddp, buckets-overlap-zero1
        a wider GPT-2 (n_embd 160, ≈ 0.7 M parameters) with ddp_bucket_cap_mb 1: at least 3
        buckets, reduced by the communication thread while backward runs; still bit for bit the
        single process with GA 2.
  uneven-data
        23 samples in batches of 5 (the last one 3): the third step has one micro-batch, for rank
        0 only; rank 1 takes part with nothing. Equal bit for bit to one process with GA 2 over two
        epochs.
  ga-with-ranks
        np 2 × GA 2 against one process × GA 4: the same global batches; losses within 1e-6
        relative, weights within 1e-6 (the sum order of four micro-batches differs).
  one-reduction-per-step
        GA 3 with DDP and with ZeRO-1: `onyx train` reports exactly as many gradient reductions
        as optimizer steps; ZeRO-2 reports one per micro-batch slot (3 per step).
  optimizer-memory
        per-rank optimizer-state elements: Ψ (the flat buffer) for DDP, its 64-aligned half
        ⌈Ψ/2⌉ for ZeRO (the checkpoint's shard files hold exactly those ranges).
  plan-per-rank
        `onyx plan --world-size 2` with zero_stage 1 lists the per-rank optimizer-state elements
        the 2-rank run reports, and the gradient accumulation buffer of GA 2.
  launch
        `onyx launch --nproc 2 --dry-run` prints the mpirun command (thread pool per rank, the
        config and its overrides); `onyx launch --nproc 2 CONFIG` trains ≡ np1 GA2 bit for bit.
  resume-*
        A 6-step run saved at step 3 and resumed from checkpoint-3 equals the uninterrupted run
        bit for bit (weights, and the log after step 3): same world size (ZeRO-1 2 → 2), 2 → 1 rank
        (ZeRO-1 shards read by one process with GA 2), 1 → 2 ranks (a single-process checkpoint
        read as ZeRO-1 shards), ZeRO-1 → DDP and DDP → ZeRO-2.
  consolidate
        `onyx consolidate` of a ZeRO-1 checkpoint writes one optimizer.safetensors equal to the
        single-process run's, and a single process resumes from it.
  fail-kill, fail-throw, fail-stall, fail-mismatch
        a rank SIGKILLed mid-run; a rank whose data has a token id past the vocabulary (it alone
        throws); a rank stopped with SIGSTOP (ddp_timeout 3); two ranks started with different
        configs (MPMD). Each ends the whole job with a non-zero exit within 10 s of the fault,
        names the rank (and for the stall the collective), leaves no onyx process behind, and
        the last checkpoint-N stays complete and loadable.
  two-hosts-tcp
        two network namespaces made here (ip netns, a veth pair, 10.231.7.1/2), mpirun in the
        first with a hostfile of both addresses, the second reached through an rsh agent that
        enters its namespace; OpenMPI's TCP transport between them (btl tcp,self): the 2-rank
        job equals the single-process GA 2 run bit for bit. Needs root (CAP_NET_ADMIN): without
        it this case is a FAIL, as CI runs as root.
"""
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
from safetensors.numpy import load_file, save_file

ONYX = os.path.abspath(os.environ.get("ONYX", "build/onyx"))
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_btl_vader_single_copy_mechanism="none", OMP_NUM_THREADS="1")
MPIRUN = ["mpirun", "--oversubscribe", "--bind-to", "none"]


class Skip(Exception):
    pass


def write_config(path, cfg):
    with open(path, "w") as f:
        for k, v in cfg.items():
            f.write(f"{k}: {json.dumps(v)}\n")


def make_data(path, n=23, t=12, bad_rows=()):
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 101, (n, t)).astype(np.int64)
    mask = np.ones((n, t), np.int64)
    labels = ids.copy()
    for i in range(n):
        k = rng.integers(2, t + 1)
        mask[i, k:] = 0
        labels[i, k:] = -100
    for i in bad_rows:
        ids[i, 0] = 5000  # past the vocabulary: the embedding lookup throws
    save_file({"input_ids": ids, "attention_mask": mask, "labels": labels}, path)


BASE = {
    "model": {"arch": "gpt2", "task": "causal-lm",
              "config": {"vocab_size": 101, "n_embd": 32, "n_layer": 2, "n_head": 2,
                         "n_positions": 16, "resid_pdrop": 0.1, "embd_pdrop": 0.1,
                         "attn_pdrop": 0.1}},
    "max_steps": 6, "per_device_train_batch_size": 4, "learning_rate": 1e-3,
    "weight_decay": 0.01, "warmup_steps": 2, "max_grad_norm": 0.5, "logging_steps": 1,
    "save_strategy": "no", "disable_tqdm": True, "train_sampling_strategy": "random",
}


class Ctx:
    def __init__(self, tmp):
        self.tmp = tmp
        self.data = os.path.join(tmp, "train.safetensors")
        make_data(self.data)
        self.n = 0

    def config(self, **over):
        self.n += 1
        d = os.path.join(self.tmp, f"run{self.n}")
        os.makedirs(d)
        cfg = dict(BASE, train_data=self.data, output_dir=os.path.join(d, "out"))
        cfg.update(over)
        path = os.path.join(d, "cfg.yaml")
        write_config(path, cfg)
        return path, cfg["output_dir"]


def run(np_, cfg, extra=(), timeout=300, check=True):
    cmd = ([ONYX] if np_ == 0 else MPIRUN + ["-np", str(np_), ONYX]) + ["train", cfg] + list(extra)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=ENV)
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(cmd[:6])}... exited {p.returncode}: "
                             f"{(p.stderr.strip() or p.stdout.strip())[-600:]}")
    return p


def read_log(out):
    with open(os.path.join(out, "log_history.jsonl")) as f:
        rows = [json.loads(l) for l in f if l.strip()]
    return [{k: v for k, v in r.items() if "runtime" not in k and "per_second" not in k}
            for r in rows]


def same_file(a, b):
    with open(a, "rb") as f, open(b, "rb") as g:
        return f.read() == g.read()


def moments(ckpt):
    """The optimizer state of a checkpoint as whole-buffer arrays (shards put together)."""
    one = os.path.join(ckpt, "optimizer.safetensors")
    if os.path.exists(one):
        return {k: v for k, v in load_file(one).items() if k != "step"}
    from safetensors import safe_open
    out = {}
    for f in sorted(glob.glob(os.path.join(ckpt, "optimizer-*-of-*.safetensors"))):
        with safe_open(f, "np") as h:
            meta = h.metadata()
            b, n = int(meta["begin"]), int(meta["numel"])
            for k in h.keys():
                if k == "step":
                    continue
                out.setdefault(k, np.zeros(n, np.float32))[b:b + h.get_tensor(k).size] = h.get_tensor(k)
    return out


def summary(p):
    m = re.search(r"data parallel: (\d+) ranks \((\w+)\), (DDP|ZeRO stage \d), (\d+) gradient "
                  r"reductions in (\d+) steps .*\), (\d+) of (\d+) optimizer-state", p.stdout)
    if not m:
        raise AssertionError(f"no data-parallel summary in: {p.stdout[-400:]}")
    return {"world": int(m[1]), "mode": m[3], "reductions": int(m[4]), "steps": int(m[5]),
            "state": int(m[6]), "numel": int(m[7])}


# ----------------------------------------------------------------------------------------------


def case_equal(ctx, zero, bf16=False):
    """np2 (DDP or ZeRO) ≡ np1 with GA2, bit for bit. With bf16 (mixed precision) each rank's GEMMs
    read the bf16 shadow of the weights: under ZeRO the shadow of the gathered weights."""
    extra = {"bf16": True} if bf16 else {}
    c1, o1 = ctx.config(save_strategy="steps", save_steps=6, **extra)
    run(0, c1, ["--gradient_accumulation_steps", "2"])
    c2, o2 = ctx.config(save_strategy="steps", save_steps=6, zero_stage=zero, **extra)
    p = run(2, c2)
    s = summary(p)
    bad = []
    if not same_file(f"{o1}/model.safetensors", f"{o2}/model.safetensors"):
        bad.append("weights differ")
    m1, m2 = moments(f"{o1}/checkpoint-6"), moments(f"{o2}/checkpoint-6")
    for k in m1:
        if k not in m2 or not np.array_equal(m1[k].view(np.uint32), m2[k].view(np.uint32)):
            bad.append(f"moment {k} differs")
    l1, l2 = read_log(o1), read_log(o2)
    if l1 != l2:
        bad.append(f"logs differ: {l1[:2]} vs {l2[:2]}")
    clipped = sum(1 for r in l1 if "grad_norm" in r and r["grad_norm"] > 0.5)
    if clipped == 0:
        bad.append("clipping never active")
    if bf16:
        f32 = ctx.config(save_strategy="no")
        run(0, f32[0], ["--gradient_accumulation_steps", "2"])
        if same_file(f"{f32[1]}/model.safetensors", f"{o1}/model.safetensors"):
            bad.append("the bf16 run's weights equal the float32 run's: bf16 did not run")
    return not bad, (f"np2 {s['mode']}{' bf16' if bf16 else ''} ≡ np1 GA2 bit for bit: weights, exp_avg/exp_avg_sq, "
                     f"{len(l1)} log rows ({clipped} clipped steps)" if not bad else "; ".join(bad))


def case_buckets(ctx, zero):
    """A wider model (≈ 0.7 M parameters, 3 buckets of 1 MiB): buckets reduced while backward
    runs, still bit for bit the single process."""
    model = json.loads(json.dumps(BASE["model"]))
    model["config"].update(n_embd=160, n_head=4)
    c1, o1 = ctx.config(model=model, max_steps=3)
    run(0, c1, ["--gradient_accumulation_steps", "2"])
    c2, o2 = ctx.config(model=model, max_steps=3, zero_stage=zero, ddp_bucket_cap_mb=1)
    p = run(2, c2)
    m = re.search(r"\((\d+) buckets; ([\d.e-]+) s in the communication thread", p.stdout)
    if not m:
        return False, f"no overlapped-reduction summary: {p.stdout[-300:]}"
    ok = int(m[1]) >= 3 and same_file(f"{o1}/model.safetensors", f"{o2}/model.safetensors") \
        and read_log(o1) == read_log(o2)
    return ok, (f"{m[1]} buckets reduced by the communication thread during backward: np2 ≡ np1 "
                f"GA2 bit for bit" if ok else f"{m[1]} buckets; result differs")


def case_uneven(ctx):
    over = dict(per_device_train_batch_size=5, max_steps=-1, num_train_epochs=2,
                train_sampling_strategy="sequential")
    c1, o1 = ctx.config(**over)
    run(0, c1, ["--gradient_accumulation_steps", "2"])
    c2, o2 = ctx.config(**over)
    p = run(2, c2)
    s = summary(p)
    ok = same_file(f"{o1}/model.safetensors", f"{o2}/model.safetensors") and read_log(o1) == read_log(o2)
    return ok, (f"23 samples / batch 5 (5 micro-batches, 3 steps per epoch, the last for rank 0 "
                f"alone), {s['steps']} steps: np2 ≡ np1 GA2 bit for bit" if ok else
                "uneven run differs from single process")


def case_ga_with_ranks(ctx):
    c1, o1 = ctx.config(max_steps=3)
    run(0, c1, ["--gradient_accumulation_steps", "4"])
    c2, o2 = ctx.config(max_steps=3, gradient_accumulation_steps=2)
    run(2, c2)
    w1, w2 = load_file(f"{o1}/model.safetensors"), load_file(f"{o2}/model.safetensors")
    werr = max(float(np.max(np.abs(w1[k] - w2[k]))) for k in w1)
    l1, l2 = read_log(o1), read_log(o2)
    lerr = max(abs(a["loss"] - b["loss"]) / abs(a["loss"]) for a, b in zip(l1, l2) if "loss" in a)
    ok = werr < 1e-6 and lerr < 1e-6 and len(l1) == len(l2)
    return ok, f"np2×GA2 vs np1×GA4: losses rel {lerr:.1e}, weights max |Δ| {werr:.1e}"


def case_reductions(ctx):
    out = []
    for zero, per_step in ((0, 1), (1, 1), (2, 3)):
        c, o = ctx.config(max_steps=2, gradient_accumulation_steps=3, zero_stage=zero,
                          per_device_train_batch_size=2)
        s = summary(run(2, c))
        if s["reductions"] != per_step * s["steps"]:
            return False, f"zero_stage {zero}: {s['reductions']} reductions in {s['steps']} steps"
        out.append(f"{s['mode']} {s['reductions']}/{s['steps']}")
    return True, "GA 3, reductions/steps: " + ", ".join(out)


def case_memory(ctx):
    c, o = ctx.config(max_steps=1)
    ddp = summary(run(2, c))
    c, o = ctx.config(max_steps=1, zero_stage=1, save_strategy="steps", save_steps=1)
    z = summary(run(2, c))
    n = ddp["numel"]
    half = -(-(-(-n // 2)) // 64) * 64
    shards = sorted(glob.glob(f"{o}/checkpoint-1/optimizer-*-of-00002.safetensors"))
    sizes = [load_file(f)["exp_avg"].size for f in shards]
    ok = ddp["state"] == n and z["state"] == half and sizes == [half, n - half]
    return ok, (f"Ψ = {n} (not a multiple of 128: {n % 128 != 0}); DDP {ddp['state']} per rank, "
                f"ZeRO-1 {z['state']} (⌈Ψ/2⌉ 64-aligned = {half}), shard files {sizes}")


def case_plan(ctx):
    c, o = ctx.config(max_steps=1, zero_stage=1)
    z = summary(run(2, c))
    p = subprocess.run([ONYX, "plan", c, "--world-size", "2", "--gradient_accumulation_steps", "2"],
                       capture_output=True, text=True, env=ENV)
    m = re.search(r"optimizer state \(2 buffers\).*\((\d+) of (\d+) elements per buffer", p.stdout)
    acc = re.search(r"gradient accumulation buffer", p.stdout)
    tot = re.search(r"total .* per rank \(world size 2, ZeRO stage 1\)", p.stdout)
    ok = p.returncode == 0 and m and int(m[1]) == z["state"] and int(m[2]) == z["numel"] and \
        acc and tot
    return bool(ok), (f"onyx plan --world-size 2 (ZeRO-1): {m[1]} of {m[2]} optimizer-state "
                      f"elements per rank, as the 2-rank run holds; accumulation buffer listed"
                      if ok else p.stdout[-600:] + p.stderr[-300:])


def case_launch(ctx):
    c, o = ctx.config()
    dry = subprocess.run([ONYX, "launch", "--nproc", "2", "--dry-run", c, "--zero_stage", "1"],
                         capture_output=True, text=True, env=ENV)
    want = ["mpirun -np 2", "OMP_NUM_THREADS=", " train " + c, "--zero_stage 1"]
    if dry.returncode != 0 or any(w not in dry.stdout for w in want):
        return False, f"dry run: {dry.stdout.strip()} {dry.stderr.strip()}"
    p = subprocess.run([ONYX, "launch", "--nproc", "2", c], capture_output=True, text=True,
                       env=ENV, timeout=300)
    c1, o1 = ctx.config()
    run(0, c1, ["--gradient_accumulation_steps", "2"])
    ok = p.returncode == 0 and same_file(f"{o1}/model.safetensors", f"{o}/model.safetensors")
    return ok, (f"`{dry.stdout.strip()[:110]}...`; the launched job ≡ np1 GA2 bit for bit" if ok
                else f"launch exited {p.returncode}: {p.stderr[-400:]}")


def case_resume(ctx, first, second):
    """first / second: (np, zero, ga) of the run saved at step 3 and of its resume."""
    ref_c, ref_o = ctx.config(gradient_accumulation_steps=2)
    run(0, ref_c)
    np1, z1, ga1 = first
    c, o = ctx.config(save_strategy="steps", save_steps=3, max_steps=3, zero_stage=z1,
                      gradient_accumulation_steps=ga1)
    run(np1, c)
    np2, z2, ga2 = second
    c2, o2 = ctx.config(zero_stage=z2, gradient_accumulation_steps=ga2,
                        resume_from_checkpoint=f"{o}/checkpoint-3")
    run(np2, c2)
    ok = same_file(f"{ref_o}/model.safetensors", f"{o2}/model.safetensors") and \
        read_log(ref_o)[3:] == read_log(o2)[3:]
    return ok, (f"np{np1 or 1} zero {z1} → np{np2 or 1} zero {z2}: resumed run equals the "
                f"uninterrupted one bit for bit" if ok else "resumed run differs")


def case_consolidate(ctx):
    c1, o1 = ctx.config(save_strategy="steps", save_steps=3, max_steps=3,
                        gradient_accumulation_steps=2)
    run(0, c1)
    c, o = ctx.config(save_strategy="steps", save_steps=3, max_steps=3, zero_stage=1)
    run(2, c)
    dst = os.path.join(ctx.tmp, "consolidated")
    p = subprocess.run([ONYX, "consolidate", f"{o}/checkpoint-3", "--output", dst],
                       capture_output=True, text=True, env=ENV)
    if p.returncode != 0:
        return False, f"consolidate exited {p.returncode}: {p.stderr.strip()[-300:]}"
    a = load_file(f"{o1}/checkpoint-3/optimizer.safetensors")
    b = load_file(f"{dst}/optimizer.safetensors")
    same = set(a) == set(b) and all(a[k].tobytes() == b[k].tobytes() for k in a)
    left = glob.glob(f"{dst}/optimizer-*")
    c2, o2 = ctx.config(gradient_accumulation_steps=2, resume_from_checkpoint=dst)
    run(0, c2)
    ref_c, ref_o = ctx.config(gradient_accumulation_steps=2)
    run(0, ref_c)
    resumed = same_file(f"{ref_o}/model.safetensors", f"{o2}/model.safetensors")
    ok = same and not left and resumed
    return ok, (f"consolidated optimizer.safetensors equals the single-process one, no shard "
                f"left, a single process resumes from it exactly" if ok else
                f"same={same} shards_left={left} resumed_equal={resumed}")


def onyx_pids(tag):
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [int(l.split()[0]) for l in out.splitlines()[1:] if tag in l and "onyx" in l
            and "mpirun" not in l]


def checkpoint_ok(out):
    cks = sorted(glob.glob(f"{out}/checkpoint-*"), key=lambda p: int(p.rsplit("-", 1)[1]))
    if not cks:
        return False, "no checkpoint"
    last = cks[-1]
    try:
        w = load_file(f"{last}/model.safetensors")
        m = moments(last)
        json.load(open(f"{last}/trainer_state.json"))
    except Exception as e:
        return False, f"{last} unreadable: {e}"
    return bool(w) and bool(m), os.path.basename(last)


def start_job(cfg, extra=(), np_=2):
    return subprocess.Popen(MPIRUN + ["-np", str(np_), ONYX, "train", cfg] + list(extra),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
                            start_new_session=True)


def wait_for(path, timeout=60):
    t = time.time()
    while not os.path.exists(path):
        if time.time() - t > timeout:
            raise AssertionError(f"{path} did not appear in {timeout} s")
        time.sleep(0.02)


def finish(proc, t_fault, tag, out, want):
    try:
        so, se = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return False, "the job was still running 30 s after the fault (hang)"
    dt = time.time() - t_fault
    time.sleep(0.3)
    left = onyx_pids(tag)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    ck_ok, ck = checkpoint_ok(out)
    missing = [w for w in want if not re.search(w, se + so)]
    ok = proc.returncode != 0 and dt < 10 and not left and ck_ok and not missing
    first = next((l for l in se.splitlines() if "onyx: error" in l),
                 next((l for l in se.splitlines() if re.search(r"rank|signal", l)), se[:200]))
    return ok, (f"exit {proc.returncode} after {dt:.1f} s, orphans {left}, last checkpoint "
                f"{ck}, message: {first[:200]!r}" + (f"; missing {missing}" if missing else ""))


SLOW = dict(max_steps=100000, save_strategy="steps", save_steps=2, logging_steps=1,
            per_device_train_batch_size=2)


def case_fail_kill(ctx):
    c, o = ctx.config(**SLOW)
    proc = start_job(c)
    wait_for(f"{o}/checkpoint-4/trainer_state.json")
    pids = onyx_pids(c)
    if len(pids) != 2:
        os.killpg(proc.pid, signal.SIGKILL)
        return False, f"expected 2 rank processes, found {pids}"
    os.kill(pids[1], signal.SIGKILL)
    return finish(proc, time.time(), c, o, [r"(rank|process).*(1|exited|killed|signal)"])


def case_fail_throw(ctx):
    data = os.path.join(ctx.tmp, "bad.safetensors")
    make_data(data, n=400, bad_rows=range(50, 60))  # batch 25.. of batch size 2: rank 1's
    c, o = ctx.config(train_data=data, train_sampling_strategy="sequential", **SLOW)
    t0 = time.time()
    proc = start_job(c)
    return finish(proc, t0, c, o, [r"rank 1 of 2", r"(outside the embedding|Gather|index|out of range|bounds)"])


def case_fail_stall(ctx):
    c, o = ctx.config(ddp_timeout=3, **SLOW)
    proc = start_job(c)
    wait_for(f"{o}/checkpoint-4/trainer_state.json")
    pids = onyx_pids(c)
    os.kill(pids[1], signal.SIGSTOP)
    t = time.time()
    r = finish(proc, t, c, o, [r"rank 0 of 2", r"collective '\w+'", r"timed out after 3 s",
                               r"rank 1"])
    return r


def case_fail_mismatch(ctx):
    c1, o1 = ctx.config()
    c2, _ = ctx.config(per_device_train_batch_size=3)
    t0 = time.time()
    proc = subprocess.Popen(MPIRUN + ["-np", "1", ONYX, "train", c1, ":", "-np", "1", ONYX,
                                      "train", c2], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=ENV, start_new_session=True)
    try:
        so, se = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return False, "hang"
    ok = proc.returncode != 0 and "disagree on per_device_train_batch_size" in se and \
        time.time() - t0 < 10
    line = next((l for l in se.splitlines() if "disagree" in l), se[-200:])
    return ok, f"exit {proc.returncode}: {line.strip()[:220]}"


def case_two_hosts(ctx):
    if os.geteuid() != 0:
        return False, "needs root (ip netns); CI runs as root"
    a, b = "onyx-dp-a", "onyx-dp-b"
    ip_a, ip_b = "10.231.7.1", "10.231.7.2"

    def sh(*cmd):
        subprocess.run(cmd, check=True, capture_output=True)

    for ns in (a, b):
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    try:
        sh("ip", "netns", "add", a)
        sh("ip", "netns", "add", b)
        sh("ip", "link", "add", "onyxdp0", "type", "veth", "peer", "name", "onyxdp1")
        sh("ip", "link", "set", "onyxdp0", "netns", a)
        sh("ip", "link", "set", "onyxdp1", "netns", b)
        for ns, dev, addr in ((a, "onyxdp0", ip_a), (b, "onyxdp1", ip_b)):
            sh("ip", "netns", "exec", ns, "ip", "addr", "add", addr + "/24", "dev", dev)
            sh("ip", "netns", "exec", ns, "ip", "link", "set", dev, "up")
            sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        # The "remote shell" of host B: enter its namespace and run the command mpirun gives.
        agent = os.path.join(ctx.tmp, "netns-rsh")
        with open(agent, "w") as f:
            f.write("#!/bin/sh\n# usage: netns-rsh HOST COMMAND...\nhost=$1; shift\n"
                    f"case $host in {ip_b}) ns={b};; {ip_a}) ns={a};; *) exit 1;; esac\n"
                    "exec ip netns exec $ns /bin/sh -c \"$*\"\n")
        os.chmod(agent, 0o755)
        hostfile = os.path.join(ctx.tmp, "hosts")
        with open(hostfile, "w") as f:
            f.write(f"{ip_a} slots=1\n{ip_b} slots=1\n")
        c1, o1 = ctx.config()
        run(0, c1, ["--gradient_accumulation_steps", "2"])
        c2, o2 = ctx.config()
        cmd = ["ip", "netns", "exec", a, "mpirun", "-np", "2", "--hostfile", hostfile,
               "--bind-to", "none", "--mca", "plm_rsh_agent", agent,
               "--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", "10.231.7.0/24",
               "--mca", "oob_tcp_if_include", "10.231.7.0/24", "-x", "OMP_NUM_THREADS",
               "-x", "PATH", "-x", "LD_LIBRARY_PATH", ONYX, "train", c2]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=ENV)
        if p.returncode != 0:
            return False, f"mpirun across namespaces exited {p.returncode}: {p.stderr[-500:]}"
        s = summary(p)
        ok = same_file(f"{o1}/model.safetensors", f"{o2}/model.safetensors")
        return ok, (f"rank 0 in {a} ({ip_a}), rank 1 in {b} ({ip_b}) over btl tcp: "
                    f"{s['steps']} steps ≡ np1 GA2 bit for bit" if ok else "weights differ")
    finally:
        for ns in (a, b):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def main():
    filt = sys.argv[1] if len(sys.argv) > 1 else ""
    counts = {"PASS": 0, "FAIL": 0, "SKIP": 0}

    def report(status, name, msg):
        counts[status] += 1
        print(f"{status} {name}: {msg}", flush=True)

    tmp = tempfile.mkdtemp(prefix="onyx-test-dist-")
    t0 = time.time()
    try:
        if not shutil.which("mpirun"):
            report("FAIL", "setup", "mpirun not found (scripts/setup.sh installs openmpi-bin)")
            return 1
        ctx = Ctx(tmp)
        cases = [
            ("equal-ddp", lambda: case_equal(ctx, 0)),
            ("equal-zero1", lambda: case_equal(ctx, 1)),
            ("equal-zero2", lambda: case_equal(ctx, 2)),
            ("equal-ddp-bf16", lambda: case_equal(ctx, 0, bf16=True)),
            ("equal-zero1-bf16", lambda: case_equal(ctx, 1, bf16=True)),
            ("equal-zero2-bf16", lambda: case_equal(ctx, 2, bf16=True)),
            ("buckets-overlap-ddp", lambda: case_buckets(ctx, 0)),
            ("buckets-overlap-zero1", lambda: case_buckets(ctx, 1)),
            ("uneven-data", lambda: case_uneven(ctx)),
            ("ga-with-ranks", lambda: case_ga_with_ranks(ctx)),
            ("one-reduction-per-step", lambda: case_reductions(ctx)),
            ("optimizer-memory", lambda: case_memory(ctx)),
            ("plan-per-rank", lambda: case_plan(ctx)),
            ("launch", lambda: case_launch(ctx)),
            ("resume-zero1-2to2", lambda: case_resume(ctx, (2, 1, 1), (2, 1, 1))),
            ("resume-zero1-2to1", lambda: case_resume(ctx, (2, 1, 1), (0, 0, 2))),
            ("resume-1to2-zero1", lambda: case_resume(ctx, (0, 0, 2), (2, 1, 1))),
            ("resume-zero1-to-ddp", lambda: case_resume(ctx, (2, 1, 1), (2, 0, 1))),
            ("resume-ddp-to-zero2", lambda: case_resume(ctx, (2, 0, 1), (2, 2, 1))),
            ("consolidate", lambda: case_consolidate(ctx)),
            ("fail-kill", lambda: case_fail_kill(ctx)),
            ("fail-throw", lambda: case_fail_throw(ctx)),
            ("fail-stall", lambda: case_fail_stall(ctx)),
            ("fail-mismatch", lambda: case_fail_mismatch(ctx)),
            ("two-hosts-tcp", lambda: case_two_hosts(ctx)),
        ]
        for name, fn in cases:
            if filt not in name:
                continue
            try:
                ok, msg = fn()
                report("PASS" if ok else "FAIL", name, msg)
            except Skip as e:
                report("SKIP", name, str(e))
            except Exception as e:
                report("FAIL", name, f"{type(e).__name__}: {e}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"({time.time() - t0:.0f} s)")
    line = f"{counts['PASS']} passed, {counts['FAIL']} failed"
    if counts["SKIP"]:
        line += f", {counts['SKIP']} skipped"
    print(line)
    return 1 if counts["FAIL"] else 0


if __name__ == "__main__":
    sys.exit(main())
