"""test_trainer.py — `onyx train` / `export` end to end: optimizer parity with PyTorch, exact
resume after a kill, export run by ONNX Runtime, bad configs and data, checkpoint rotation.

Cases (one PASS / FAIL / SKIP line each):
  adamw-parity, adamw-ref-parity
        a BERT-like classifier (models.TinyBert, dropout 0, cross entropy inside the model) exported
        at opset 17 in TrainingMode.TRAINING, trained 30 steps by `onyx train` (sequential batches
        of 8, warmup 5 + linear decay, weight_decay 0.01, max_grad_norm 1) with optim adamw_fused
        (the default) / adamw; PyTorch runs torch.optim.AdamW with Transformers' parameter groups
        (onyx's rule for generic ONNX models, train/optimizer.cc hf_decay_mask: no decay when the
        name has bias / layernorm / layer_norm / ln_ / norm, or the tensor has rank <= 1),
        LambdaLR with the linear-with-warmup lambda and clip_grad_norm_(1.0) on the same batches.
        Every logged loss and grad_norm agrees within 1e-4 relative, every learning_rate within
        1e-12 relative; the final weights are reported.
  adamw-parity-dynamo, adamw-ga2-parity-dynamo
        adamw-parity and adamw-ga2-parity on the same model exported by torch 2.13's dynamo
        exporter (dynamo=True, default opset, optimize=False; tests/parity/exporters.py).
  scalar-params-parity
        Transformers' RegressionModel (y = a·x + b, 0-d parameters, MSE inside the model) trains:
        the same log as PyTorch's, and a, b move towards the data's 2 and 3.
  sgd-momentum-parity, sgd-momentum-ga2-parity, adamw-ga2-parity
        the same with optim sgd + sgd_momentum 0.9 (torch.optim.SGD, weight decay on the decay
        group as torch adds it), and with gradient_accumulation_steps 2 (PyTorch: each micro-batch
        loss / 2 backpropagated, logged loss = mean of the two).
  resume-exact
        a BERT-like classifier with dropout 0.1 (kept by the training export; onyx seeds it per
        step), random sampling, 40 steps, save_steps 10, logging_steps 1: run A uninterrupted;
        run B started in a subprocess, SIGKILLed as soon as checkpoint-20 exists, then resumed
        with --resume_from_checkpoint .../checkpoint-20. B's log_history.jsonl equals A's value
        for value, bit for bit (timing keys ignored), and the final weights and checkpoint-40's
        files are byte-identical. Both runs use the default thread count.
  resume-exact-bf16
        the same under `bf16: true` (bf16 GEMM operands, float32 accumulation): exact resume,
        and the checkpoint holds float32 weights and moments only and records bf16 in
        training_args.json.
  export-ort
        `onyx export` of a trained checkpoint (loss removed, and with --keep-loss) run by ONNX
        Runtime (the PyPI onnxruntime package of the reference venv) and by `onyx run` on the
        same file and inputs: every output within rtol 1e-5 (atol 1e-6); the exported weights
        equal the checkpoint's bit for bit, and PyTorch (eval mode) with the checkpoint's
        weights gives the same logits within 1e-4. And `--dtype bfloat16`: every weight of >= 16
        elements stored BFLOAT16 (the checkpoint's values rounded to nearest even), initializer
        bytes at most 0.55x the float32 export's, ORT = onyx run, logits within 5e-2 (of the
        largest |logit|) of the float32 export's.
  error-*
        bad configs and data: exit status 1, stderr "onyx: error: ..." naming the problem, and
        the checkpoints and files of an earlier run in output_dir unchanged (hashed before and
        after every case), bad checkpoints left as they were.
  rotation-*
        save_total_limit with eval/save every 4 steps, metric_for_best_model accuracy and a model
        whose eval accuracy falls while it trains: the best checkpoint survives rotation next to
        the newest, trainer_state.json names it (best_model_checkpoint, best_metric), and
        load_best_model_at_end leaves its weights in output_dir. Two probes of Transformers'
        rules: with eval every 4 and save every 8 steps the best metric and its step come from
        every evaluation and best_model_checkpoint names that step's checkpoint only if it was
        saved (Transformers 5's _determine_best_metric / _save_checkpoint; checked against the
        real Trainer in tests/parity/test_hf_trainer.py bert-best-eval2-save4), and
        save_total_limit 1 without
        load_best_model_at_end keeps the newest checkpoint.
  (early stopping, early_stopping_patience in the config: tests/parity/test_hf_trainer.py, against
  the real Trainer.)

Run: ONYX=build/onyx build/venv/bin/python tests/cli/test_trainer.py [substring-filter]
Prints one line per case and ends with "N passed, M failed" (", K skipped" when some were);
exits 1 if any case failed. Temporary folders are removed.

"""
import copy
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "tests", "parity"))
import st_io  # noqa: E402
from models import MlpCls, TinyBert  # noqa: E402

ONYX = os.environ.get("ONYX", os.path.join(REPO, "build", "onyx"))
TIMING_KEYS = {"train_runtime", "train_samples_per_second", "train_steps_per_second",
               "eval_runtime", "eval_samples_per_second", "eval_steps_per_second",
               "test_runtime", "test_samples_per_second"}

warnings.filterwarnings("ignore")
torch.set_num_threads(1)


class Skip(Exception):
    pass


# ----------------------------------------------------------------------------------------------
# Models, data, export


class BertCls(nn.Module):
    def __init__(self, dropout=0.0):
        super().__init__()
        self.bert = TinyBert(dropout=dropout)

    def forward(self, input_ids, attention_mask, token_type_ids, labels):
        logits, _ = self.bert(input_ids, attention_mask, token_type_ids)
        return F.cross_entropy(logits, labels), logits


class RegressionModel(nn.Module):
    """Transformers' tests/trainer fixture: y = a * x + b with 0-d parameters a, b and an MSE loss."""

    def __init__(self, a=0.0, b=0.0):
        super().__init__()
        self.a = nn.Parameter(torch.tensor(a).float())
        self.b = nn.Parameter(torch.tensor(b).float())

    def forward(self, input_x, labels):
        y = input_x * self.a + self.b
        return F.mse_loss(y, labels), y


BERT_INPUTS = ["input_ids", "attention_mask", "token_type_ids", "labels"]
MLP_INPUTS = ["x", "labels"]


def bert_data(n, t, seed):
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(n, t, dtype=torch.long)
    for i in range(n):
        mask[i, 4 + i % (t - 3):] = 0  # padded tails of different lengths
    types = torch.zeros(n, t, dtype=torch.long)
    types[:, t // 2:] = 1
    return {"input_ids": torch.randint(0, 60, (n, t), generator=g), "attention_mask": mask,
            "token_type_ids": types, "labels": torch.randint(0, 3, (n,), generator=g)}


def export(model, data, names, path, exporter="ts"):
    """Training export: TorchScript exporter at opset 17 (default) or the dynamo exporter."""
    from exporters import export as export_with
    bt, b = {0: "batch", 1: "seq"}, {0: "batch"}
    dyn = {k: (bt if data[k].dim() == 2 and k != "x" else b) for k in names}
    dyn["logits"] = b
    export_with(copy.deepcopy(model).train(), tuple(data[k][:2] for k in names), path,
                exporter=exporter, opset=17 if exporter == "ts" else None, input_names=names,
                output_names=["loss", "logits"], dynamic_axes=dyn, training=True, fold=False)


def save_data(path, data):
    st_io.save(path, {k: v.numpy() for k, v in data.items()})


def write_config(path, cfg):
    """YAML with JSON-formatted values (valid YAML); lists/dicts as flow style."""
    with open(path, "w") as f:
        for k, v in cfg.items():
            f.write(f"{k}: {json.dumps(v)}\n")


def run_onyx(args, timeout=300, env=None):
    return subprocess.run([ONYX] + args, capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, **env) if env else None)


def last_line(p):
    lines = (p.stderr.strip() or p.stdout.strip()).splitlines()
    return lines[-1] if lines else "(no output)"


def train(cfg_path, extra=(), timeout=300):
    p = run_onyx(["train", cfg_path] + list(extra), timeout)
    if p.returncode != 0:
        raise AssertionError(f"onyx train exited {p.returncode}: {last_line(p)}")
    return p


def read_log(out_dir):
    with open(os.path.join(out_dir, "log_history.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def tensors_of(path):
    return st_io.load(path)


# ----------------------------------------------------------------------------------------------
# PyTorch reference training


def no_decay(name, p):
    """onyx's hf_decay_mask for generic ONNX models (src/train/optimizer.cc)."""
    n = name.lower()
    return any(s in n for s in ("bias", "layernorm", "layer_norm", "ln_", "norm")) or p.dim() <= 1


def micro_schedule(n, bs, ga, max_steps):
    """Sequential sampling: per optimizer step, the list of micro-batch index lists (onyx groups
    up to `ga` batches inside one epoch; the last group of an epoch may be shorter)."""
    nb = (n + bs - 1) // bs
    steps = []
    while len(steps) < max_steps:
        for start in range(0, nb, ga):
            steps.append([list(range(b * bs, min(n, (b + 1) * bs)))
                          for b in range(start, min(nb, start + ga))])
            if len(steps) == max_steps:
                break
    return steps


def linear_warmup(warmup, total):
    def lam(step):  # transformers.get_linear_schedule_with_warmup
        if step < warmup:
            return float(step) / float(max(1, warmup))
        return max(0.0, float(total - step) / float(max(1, total - warmup)))
    return lam


def torch_train(model, data, names, o):
    m = copy.deepcopy(model).train()
    decay = [p for n, p in m.named_parameters() if not no_decay(n, p)]
    nodecay = [p for n, p in m.named_parameters() if no_decay(n, p)]
    groups = [{"params": decay, "weight_decay": o["weight_decay"]},
              {"params": nodecay, "weight_decay": 0.0}]
    if o["optim"] == "sgd":
        opt = torch.optim.SGD(groups, lr=o["learning_rate"], momentum=o.get("sgd_momentum", 0.0))
    else:
        opt = torch.optim.AdamW(groups, lr=o["learning_rate"], betas=(0.9, 0.999), eps=1e-8)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, linear_warmup(o["warmup_steps"],
                                                                 o["max_steps"]))
    n = next(iter(data.values())).shape[0]
    rec = []
    for micro in micro_schedule(n, o["per_device_train_batch_size"],
                                o.get("gradient_accumulation_steps", 1), o["max_steps"]):
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for idx in micro:
            loss = m(*[data[k][idx] for k in names])[0]
            (loss / len(micro) if len(micro) > 1 else loss).backward()
            total += loss.item()
        gn = torch.nn.utils.clip_grad_norm_(m.parameters(), o["max_grad_norm"])
        opt.step()
        lr = sched.get_last_lr()[0]  # the LR this step used: Transformers logs it (read before
        sched.step()                 # lr_scheduler.step(), trainer.py "get learning rate before update")
        rec.append({"loss": total / len(micro), "grad_norm": float(gn), "learning_rate": lr})
    return rec, {k: v.detach().numpy() for k, v in m.state_dict().items()}


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-30)


def parity_case(tmp, tag, model_path, model, data, names, overrides):
    o = {"learning_rate": 1e-3, "train_sampling_strategy": "sequential", "logging_steps": 1,
         "weight_decay": 0.01, "warmup_steps": 5, "lr_scheduler_type": "linear",
         "max_grad_norm": 1.0, "per_device_train_batch_size": 8, "max_steps": 30,
         "save_strategy": "no", "optim": "adamw_fused", "disable_tqdm": True}
    o.update(overrides)
    d = os.path.join(tmp, tag)
    os.makedirs(d)
    save_data(os.path.join(d, "train.safetensors"), data)
    cfg = {"model": model_path, "loss": "loss", "train_data": "train.safetensors",
           "output_dir": os.path.join(d, "out")}
    cfg.update(o)
    write_config(os.path.join(d, "cfg.yaml"), cfg)
    train(os.path.join(d, "cfg.yaml"))
    log = [e for e in read_log(cfg["output_dir"]) if "loss" in e]
    ref, ref_w = torch_train(model, data, names, o)
    steps = [e["step"] for e in log]
    if steps != list(range(1, o["max_steps"] + 1)):
        return False, f"logged loss steps are {steps}, want 1..{o['max_steps']}"
    worst = {"loss": (0.0, 0), "grad_norm": (0.0, 0), "learning_rate": (0.0, 0)}
    tol = {"loss": 1e-4, "grad_norm": 1e-4, "learning_rate": 1e-12}
    bad = []
    for e, r in zip(log, ref):
        for k in worst:
            err = rel(e[k], r[k]) if r[k] != 0 else abs(e[k])
            if err > worst[k][0]:
                worst[k] = (err, e["step"])
            if err > tol[k] and len(bad) < 4:
                bad.append(f"step {e['step']} {k} onyx {e[k]!r} torch {r[k]!r}")
    got_w = tensors_of(os.path.join(cfg["output_dir"], "model.safetensors"))
    w_err, w_name = 0.0, ""
    for k, v in ref_w.items():
        if k in got_w:
            err = float(np.max(np.abs(got_w[k].astype(np.float64) - v) / (np.abs(v) + 1e-2)))
            if err > w_err:
                w_err, w_name = err, k
    msg = (f"{len(log)} steps; max rel err loss {worst['loss'][0]:.1e} (step {worst['loss'][1]}),"
           f" grad_norm {worst['grad_norm'][0]:.1e}, lr {worst['learning_rate'][0]:.1e};"
           f" final weights max |d|/(|w|+1e-2) {w_err:.1e} ({w_name})")
    if bad:
        return False, msg + "; over tolerance: " + "; ".join(bad)
    return True, msg


# ----------------------------------------------------------------------------------------------
# Cases


class Ctx:
    """Models and data shared between cases, made on first use."""

    def __init__(self, tmp):
        self.tmp = tmp
        self._cache = {}

    def get(self, key, make):
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]

    def bert_nodrop(self):
        def make():
            torch.manual_seed(0)
            m = BertCls(dropout=0.0)
            data = bert_data(64, 10, 1)
            path = os.path.join(self.tmp, "bert_nodrop.onnx")
            export(m, data, BERT_INPUTS, path)
            return m, data, path
        return self.get("bert_nodrop", make)

    def bert_nodrop_dynamo(self):
        """The same model, weights and data as bert_nodrop, exported by the dynamo exporter."""
        def make():
            m, data, _ = self.bert_nodrop()
            path = os.path.join(self.tmp, "bert_nodrop_dynamo.onnx")
            export(m, data, BERT_INPUTS, path, exporter="dynamo")
            return m, data, path
        return self.get("bert_nodrop_dynamo", make)

    def bert_drop(self):
        def make():
            torch.manual_seed(3)
            m = BertCls(dropout=0.1)
            data = bert_data(64, 10, 4)
            path = os.path.join(self.tmp, "bert_drop.onnx")
            export(m, data, BERT_INPUTS, path)
            return m, data, path
        return self.get("bert_drop", make)

    def mlp(self):
        """An MLP classifier that starts out predicting class 0 (output bias 1), trained on
        labels 1 and evaluated on labels 0: eval accuracy starts near 1 and falls step by step."""
        def make():
            torch.manual_seed(5)
            m = MlpCls()
            with torch.no_grad():
                m.mlp.net[4].bias.copy_(torch.tensor([1.0, 0.0, 0.0]))
            g = torch.Generator().manual_seed(6)
            train_d = {"x": torch.randn(64, 16, generator=g),
                       "labels": torch.ones(64, dtype=torch.long)}
            eval_d = {"x": torch.randn(48, 16, generator=g),
                      "labels": torch.zeros(48, dtype=torch.long)}
            path = os.path.join(self.tmp, "mlp.onnx")
            export(m, train_d, MLP_INPUTS, path)
            save_data(os.path.join(self.tmp, "mlp_train.safetensors"), train_d)
            save_data(os.path.join(self.tmp, "mlp_eval.safetensors"), eval_d)
            return m, train_d, eval_d, path
        return self.get("mlp", make)


def case_scalar_params(ctx):
    """0-d parameters train (Transformers' RegressionModel, y = 2x + 3 + noise): every logged
    loss, grad_norm and LR and the final a, b as PyTorch's; a and b move towards 2 and 3."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(42)
    x = torch.randn(64, generator=g)
    data = {"input_x": x, "labels": 2.0 * x + 3.0 + 0.1 * torch.randn(64, generator=g)}
    m = RegressionModel()
    path = os.path.join(ctx.tmp, "regression.onnx")
    export(m, data, ["input_x", "labels"], path)
    ok, msg = parity_case(ctx.tmp, "scalar", path, m, data, ["input_x", "labels"],
                          {"learning_rate": 0.1, "weight_decay": 0.0, "warmup_steps": 0})
    w = tensors_of(os.path.join(ctx.tmp, "scalar", "out", "model.safetensors"))
    a, b = float(w["a"]), float(w["b"])
    if not (a > 0.5 and b > 0.5):
        ok = False
        msg += f"; a={a:.3f} b={b:.3f} did not move towards 2 and 3"
    return ok, msg + f"; trained a={a:.3f}, b={b:.3f}"


def case_parity(ctx, tag, overrides, exporter="ts"):
    m, data, path = ctx.bert_nodrop() if exporter == "ts" else ctx.bert_nodrop_dynamo()
    return parity_case(ctx.tmp, tag, path, m, data, BERT_INPUTS, overrides)


def strip_timing(log):
    return [{k: v for k, v in e.items() if k not in TIMING_KEYS} for e in log]


def diff_logs(a, b):
    """Describes where two logs differ (values compared exactly)."""
    out = []
    if len(a) != len(b):
        out.append(f"{len(a)} entries vs {len(b)}")
    for i, (x, y) in enumerate(zip(a, b)):
        for k in sorted(set(x) | set(y)):
            if x.get(k) != y.get(k):
                out.append(f"entry {i} (step {x.get('step')}) {k}: {x.get(k)!r} vs {y.get(k)!r}")
    return out


def file_digests(root):
    """{relative path: sha256} of every file under root."""
    out = {}
    for dirpath, _, files in os.walk(root):
        for f in files:
            p = os.path.join(dirpath, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, root)] = hashlib.sha256(fh.read()).hexdigest()
    return out


def bf16_bits(x):
    """float32 array -> bfloat16 bit patterns, rounded to nearest even (finite inputs)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def safetensors_header(path):
    """The JSON header of a safetensors file (tensor name -> dtype, shape, offsets)."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        return json.loads(f.read(n))


def case_resume(ctx, bf16=False):
    """Exact resume after SIGKILL; with bf16, under `bf16: true` mixed precision (float32 master
    weights and moments in the checkpoint, the flag in training_args.json)."""
    import onnx
    m, data, path = ctx.bert_drop()
    n_dropout = sum(n.op_type == "Dropout" for n in onnx.load(path).graph.node)
    if n_dropout == 0:
        return False, "setup: the training export has no Dropout node"
    d = os.path.join(ctx.tmp, "resume-bf16" if bf16 else "resume")
    os.makedirs(d)
    save_data(os.path.join(d, "train.safetensors"), data)
    base = {"model": path, "loss": "loss", "train_data": "train.safetensors",
            "learning_rate": 1e-3, "train_sampling_strategy": "random", "logging_steps": 1,
            "weight_decay": 0.01, "warmup_steps": 5, "max_steps": 40, "save_steps": 10,
            "per_device_train_batch_size": 8, "seed": 7, "disable_tqdm": True}
    if bf16:
        base["bf16"] = True
    out_a, out_b = os.path.join(d, "a"), os.path.join(d, "b")
    write_config(os.path.join(d, "a.yaml"), dict(base, output_dir=out_a))
    write_config(os.path.join(d, "b.yaml"), dict(base, output_dir=out_b))
    train(os.path.join(d, "a.yaml"))
    if bf16:
        ck = os.path.join(out_a, "checkpoint-40")
        with open(os.path.join(ck, "training_args.json")) as f:
            if json.load(f).get("bf16") is not True:
                return False, "checkpoint-40/training_args.json does not record bf16: true"
        for fname in ("model.safetensors", "optimizer.safetensors"):
            dtypes = {v["dtype"] for k, v in safetensors_header(os.path.join(ck, fname)).items()
                      if k != "__metadata__"}
            if "F32" not in dtypes or dtypes & {"BF16", "F16"}:  # (I64: the optimizer's step)
                return False, f"a bf16 run saved {fname} as {sorted(dtypes)}, not float32"
        # The bf16 path ran: the same run in float32 logs other (close) losses.
        out_f = os.path.join(d, "f32")
        write_config(os.path.join(d, "f32.yaml"), dict(base, bf16=False, output_dir=out_f))
        train(os.path.join(d, "f32.yaml"))
        lf = {e["step"]: e["loss"] for e in read_log(out_f) if "loss" in e}
        lh = {e["step"]: e["loss"] for e in read_log(out_a) if "loss" in e}
        if all(lf[k] == lh[k] for k in lf):
            return False, "the bf16 run logged exactly the float32 run's losses: bf16 did not run"
        worst = max(abs(lf[k] - lh[k]) / abs(lf[k]) for k in (1, 10))
        if worst > 2e-2:
            return False, f"bf16 and float32 losses differ by {worst:.2e} (relative) at steps 1/10"
    else:
        ctx._cache["trained_bert_checkpoint"] = os.path.join(out_a, "checkpoint-40")

    # Run B: kill it (SIGKILL) as soon as checkpoint-20 has been renamed into place.
    proc = subprocess.Popen([ONYX, "train", os.path.join(d, "b.yaml")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    ck20 = os.path.join(out_b, "checkpoint-20")
    deadline = time.time() + 120
    while not os.path.isdir(ck20) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.002)
    killed_running = proc.poll() is None
    if killed_running:
        proc.send_signal(signal.SIGKILL)
    rc = proc.wait()
    err = proc.stderr.read().decode(errors="replace")
    proc.stderr.close()
    if not os.path.isdir(ck20):
        return False, f"run B ended (rc {rc}) without checkpoint-20: {err.strip()[-300:]}"
    before = [e.get("step") for e in read_log(out_b) if "loss" in e]
    killed_at = max(before) if before else 0
    train(os.path.join(d, "b.yaml"), ["--resume_from_checkpoint", ck20])

    la, lb = strip_timing(read_log(out_a)), strip_timing(read_log(out_b))
    problems = diff_logs(la, lb)
    for f in ("model.safetensors", "checkpoint-40/model.safetensors",
              "checkpoint-40/optimizer.safetensors", "checkpoint-40/rng_state.json",
              "checkpoint-30/model.safetensors"):
        pa, pb = os.path.join(out_a, f), os.path.join(out_b, f)
        if not (os.path.exists(pa) and os.path.exists(pb)):
            problems.append(f"{f} missing in {'A' if not os.path.exists(pa) else 'B'}")
        elif open(pa, "rb").read() != open(pb, "rb").read():
            problems.append(f"{f} differs")
    stale = [n for n in os.listdir(out_b) if n.startswith(".tmp-") or n.startswith(".old-")]
    how = (f"B killed (SIGKILL) after checkpoint-20 appeared, last logged step {killed_at}"
           if killed_running else f"B had already exited (rc {rc}) when checkpoint-20 was seen")
    if problems:
        # Tell nondeterminism from a resume bug: does a second uninterrupted run equal A?
        out_c = os.path.join(d, "c")
        write_config(os.path.join(d, "c.yaml"), dict(base, output_dir=out_c))
        train(os.path.join(d, "c.yaml"))
        nd = diff_logs(la, strip_timing(read_log(out_c)))
        note = (f"; a second uninterrupted run differs from A too ({len(nd)} values, first: "
                f"{nd[0]}): nondeterminism" if nd else
                "; a second uninterrupted run equals A: the resume is at fault")
        return False, (f"{how}; {len(problems)} differences, first: "
                       + "; ".join(problems[:5]) + note)
    msg = (f"{how}; {n_dropout} Dropout nodes; {len(la)} log entries and final/checkpoint-40 "
           f"files identical")
    if stale:
        msg += f" (left behind by the kill: {', '.join(sorted(stale))})"
    return True, msg


def ort_session(path):
    """An onnxruntime (PyPI, the reference venv) CPU session for the model at path."""
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def case_export_ort(ctx):
    import onnx
    from onnx import numpy_helper
    m, data, path = ctx.bert_drop()
    ck = ctx._cache.get("trained_bert_checkpoint")
    if not ck or not os.path.isdir(ck):  # case resume-exact did not run: train a short one
        d = os.path.join(ctx.tmp, "export_train")
        os.makedirs(d)
        save_data(os.path.join(d, "train.safetensors"), data)
        write_config(os.path.join(d, "cfg.yaml"),
                     {"model": path, "loss": "loss", "train_data": "train.safetensors",
                      "learning_rate": 1e-3, "max_steps": 10, "save_steps": 10,
                      "output_dir": os.path.join(d, "out"), "disable_tqdm": True})
        train(os.path.join(d, "cfg.yaml"))
        ck = os.path.join(d, "out", "checkpoint-10")
    d = os.path.join(ctx.tmp, "export")
    os.makedirs(d)
    test = bert_data(5, 10, 99)
    ck_w = tensors_of(os.path.join(ck, "model.safetensors"))
    notes, ok = [], True
    fp32_logits, fp32_size, fp32_bytes = None, None, None
    for variant, extra in (("inference", []), ("keep-loss", ["--keep-loss"]),
                           ("bf16", ["--dtype", "bfloat16"])):
        onnx_path = os.path.join(d, f"{variant}.onnx")
        p = run_onyx(["export", ck, "--output", onnx_path] + extra)
        if p.returncode != 0:
            return False, f"onyx export {' '.join(extra)} exited {p.returncode}: {last_line(p)}"
        g = onnx.load(onnx_path).graph
        init_names = {i.name for i in g.initializer}
        in_names = [i.name for i in g.input if i.name not in init_names]
        out_names = [o.name for o in g.output]
        want_in = BERT_INPUTS if variant == "keep-loss" else BERT_INPUTS[:3]
        want_out = ["loss", "logits"] if variant == "keep-loss" else ["logits"]
        if sorted(in_names) != sorted(want_in) or sorted(out_names) != sorted(want_out):
            ok = False
            notes.append(f"{variant}: inputs {in_names} outputs {out_names}, want {want_in} "
                         f"/ {want_out}")
        if any(n.op_type == "Dropout" for n in g.node):
            ok = False
            notes.append(f"{variant}: Dropout left in the exported graph")
        # The exported weights are the checkpoint's (bf16: rounded to nearest even, stored as
        # BFLOAT16 and read through a Cast to float32, for every weight of >= 16 elements).
        n_bf16 = 0
        for init in g.initializer:
            if init.name not in ck_w:
                continue
            want = ck_w[init.name]
            if init.data_type == onnx.TensorProto.BFLOAT16:
                got_bits = np.frombuffer(init.raw_data, dtype=np.uint16).reshape(want.shape)
                if variant != "bf16" or not np.array_equal(got_bits, bf16_bits(want)):
                    ok = False
                    notes.append(f"{variant}: bf16 initializer {init.name} is not the "
                                 f"checkpoint's tensor rounded to nearest even")
                    break
                n_bf16 += 1
            elif (variant == "bf16" and want.size >= 16) or not np.array_equal(
                    numpy_helper.to_array(init), want):
                ok = False
                notes.append(f"{variant}: initializer {init.name} ({init.data_type}) differs "
                             f"from the checkpoint")
                break
        weight_bytes = sum(len(i.raw_data) for i in g.initializer)
        if variant == "bf16":
            notes.append(f"bf16: {n_bf16} weights bf16, initializer bytes "
                         f"{weight_bytes / fp32_bytes:.2f}x float32's, file "
                         f"{os.path.getsize(onnx_path) / fp32_size:.2f}x")
            if n_bf16 == 0 or weight_bytes > 0.55 * fp32_bytes:
                ok = False
        feeds = {k: test[k].numpy() for k in in_names if k in test}
        try:
            sess = ort_session(onnx_path)
            ort_out = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
        except Exception as e:  # noqa: BLE001 - any ORT error is a failure of the export
            return False, f"ONNX Runtime failed on the {variant} export: {e}"
        in_st, out_st = os.path.join(d, f"{variant}.in.st"), os.path.join(d, f"{variant}.out.st")
        st_io.save(in_st, feeds)
        p = run_onyx(["run", onnx_path, "--inputs", in_st, "--output", out_st])
        if p.returncode != 0:
            return False, f"onyx run on the {variant} export exited {p.returncode}: {last_line(p)}"
        onyx_out = tensors_of(out_st)
        worst = 0.0
        for k, want in ort_out.items():
            got = onyx_out.get(k)
            if got is None or got.shape != want.shape:
                ok = False
                notes.append(f"{variant}: output {k} onyx {None if got is None else got.shape} "
                             f"vs ORT {want.shape}")
                continue
            diff = np.abs(got.astype(np.float64) - want)
            err = float(np.max(diff / (np.abs(want) + 1e-6 / 1e-5)))
            worst = max(worst, err)
            if not np.all(diff <= 1e-6 + 1e-5 * np.abs(want)):
                ok = False
                notes.append(f"{variant}: output {k} onyx vs ORT rel err {err:.1e}")
        notes.append(f"{variant}: onyx vs ORT max rel err {worst:.1e}")
        if variant == "bf16":  # bf16 weights: close to the float32 export, not equal
            err = float(np.max(np.abs(ort_out["logits"] - fp32_logits))
                        / np.max(np.abs(fp32_logits)))
            notes.append(f"bf16 vs float32 export logits max err {err:.1e} of max |logit|")
            if not 0 < err <= 5e-2:
                ok = False
        if variant == "inference":
            fp32_logits, fp32_size = ort_out["logits"], os.path.getsize(onnx_path)
            fp32_bytes = weight_bytes
            # PyTorch, eval mode, with the checkpoint's weights.
            tm = copy.deepcopy(m).eval()
            tm.load_state_dict({k: torch.from_numpy(ck_w[k].copy())
                                for k in tm.state_dict()})
            with torch.no_grad():
                ref = tm(*[test[k] for k in BERT_INPUTS])[1].numpy()
            err = float(np.max(np.abs(ort_out["logits"] - ref) / (np.abs(ref) + 1e-2)))
            if err > 1e-4:
                ok = False
            notes.append(f"ORT vs PyTorch logits rel err {err:.1e}")
    return ok, "; ".join(notes)


# ---- bad configs and data --------------------------------------------------------------------


def error_cases(ctx):
    """Yields (name, ok, message) for every bad config / data case."""
    m, train_d, eval_d, path = ctx.mlp()
    d = os.path.join(ctx.tmp, "errors")
    os.makedirs(d)
    out = os.path.join(d, "out")
    base = {"model": path, "loss": "loss", "train_data": os.path.join(ctx.tmp,
                                                                      "mlp_train.safetensors"),
            "output_dir": out, "max_steps": 4, "save_steps": 2, "logging_steps": 1,
            "learning_rate": 1e-3, "disable_tqdm": True}
    good = os.path.join(d, "good.yaml")
    write_config(good, base)
    train(good)
    ck = os.path.join(out, "checkpoint-4")
    # Bad checkpoints, outside output_dir.
    bad_shape = os.path.join(d, "bad-shape-ck")
    shutil.copytree(ck, bad_shape)
    w = tensors_of(os.path.join(bad_shape, "model.safetensors"))
    w["mlp.net.2.weight"] = np.zeros((16, 64), np.float32)
    st_io.save(os.path.join(bad_shape, "model.safetensors"), w)
    bad_state = os.path.join(d, "bad-state-ck")
    shutil.copytree(ck, bad_state)
    with open(os.path.join(bad_state, "trainer_state.json"), "w") as f:
        f.write('{"epoch": 1.0, "global_step": 4, "log_history": [')
    # Bad data.
    missing = os.path.join(d, "missing.safetensors")
    save_data(missing, {"x": train_d["x"]})
    uneven = os.path.join(d, "uneven.safetensors")
    save_data(uneven, {"x": train_d["x"], "labels": train_d["labels"][:63]})
    blocker = os.path.join(d, "a-file")
    with open(blocker, "w") as f:
        f.write("not a folder\n")

    def cfg(name, **changes):
        c = dict(base)
        for k, v in changes.items():
            if v is None:
                c.pop(k, None)
            else:
                c[k] = v
        p = os.path.join(d, name + ".yaml")
        write_config(p, c)
        return p

    def raw_cfg(name, text):
        p = os.path.join(d, name + ".yaml")
        with open(p, "w") as f:
            f.write(text)
        return p

    base_text = "".join(f"{k}: {json.dumps(v)}\n" for k, v in base.items())
    cases = [
        ("error-unknown-key", ["train", raw_cfg("unknown", base_text + "learning_rat: 0.1\n")],
         [r"unknown key", r"learning_rat\b"]),
        ("error-unknown-override", ["train", good, "--no_such_arg", "3"],
         [r"unknown", r"no_such_arg"]),
        ("error-wrong-type", ["train", raw_cfg("wrongtype", base_text.replace(
            "learning_rate: 0.001", "learning_rate: abc"))], [r"learning_rate", r"abc"]),
        ("error-wrong-type-int", ["train", cfg("wrongint", per_device_train_batch_size="eight")],
         [r"per_device_train_batch_size", r"eight"]),
        ("error-missing-input", ["train", cfg("missing", train_data=missing)],
         [r"labels", r"no tensor|missing|has no"]),
        ("error-sample-counts", ["train", cfg("uneven", train_data=uneven)],
         [r"'labels'", r"'x'", r"63", r"64"]),
        ("error-unwritable-output-dir",
         ["train", cfg("unwritable", output_dir=os.path.join(blocker, "out"))],
         [r"output_dir", re.escape(os.path.join(blocker, "out")), r"not a directory"]),
        ("error-missing-config", ["train", os.path.join(d, "no-such-config.yaml")],
         [r"no-such-config\.yaml", r"does not exist|not found|no such"]),
        ("error-no-trainable-parameter",
         ["train", cfg("allfrozen", frozen=[n for n, _ in m.named_parameters()])],
         [r"no trainable parameter", r"frozen"]),
        ("error-unknown-loss-type",
         ["train", cfg("losstype", loss={"type": "hinge", "logits": "logits",
                                         "labels": "labels"})],
         [r"loss\.type|loss type", r"hinge"]),
        ("error-resume-missing",
         ["train", good, "--resume_from_checkpoint", os.path.join(out, "checkpoint-999")],
         [r"checkpoint-999", r"not a folder|does not exist|not found"]),
        ("error-resume-bad-shape", ["train", good, "--resume_from_checkpoint", bad_shape],
         [r"mlp\.net\.2\.weight", r"\[16, ?64\]|16x64|shape"]),
        ("error-resume-bad-state-json", ["train", good, "--resume_from_checkpoint", bad_state],
         [r"trainer_state\.json", r"JSON"]),
        # read before any work (they were read at the first GEMM, after loading and planning)
        ("error-bad-onyx-gemm", ["train", good], [r"ONYX_GEMM=cublas", r"onednn_matmul"],
         {"ONYX_GEMM": "cublas"}),
        ("error-bad-onyx-prepack", ["train", good], [r"ONYX_PREPACK=yes", r"'always'"],
         {"ONYX_PREPACK": "yes"}),
    ]
    watched = {"output_dir": out, "bad-shape checkpoint": bad_shape,
               "bad-state checkpoint": bad_state}
    for name, argv, pats, *env in cases:
        before = {k: file_digests(v) for k, v in watched.items()}
        p = run_onyx(argv, timeout=120, env=env[0] if env else None)
        after = {k: file_digests(v) for k, v in watched.items()}
        problems = []
        if p.returncode != 1:
            problems.append(f"exit status {p.returncode}, want 1")
        err = p.stderr.strip()
        if not err.startswith("onyx: error:"):
            problems.append(f"stderr does not start with 'onyx: error:': {err[:200]!r}")
        for pat in pats:
            if not re.search(pat, err, re.I):
                problems.append(f"message lacks /{pat}/")
        for k in watched:
            if before[k] != after[k]:
                changed = sorted(set(before[k].items()) ^ set(after[k].items()))
                problems.append(f"{k} changed: {sorted({c[0] for c in changed})[:5]}")
        msg = err.splitlines()[0][:240] if err else "(no stderr)"
        yield name, not problems, ("; ".join(problems) + " -- " if problems else "") + msg


# ---- rotation / best checkpoint ----------------------------------------------------------------


def rotation_run(ctx, tag, **changes):
    m, train_d, eval_d, path = ctx.mlp()
    d = os.path.join(ctx.tmp, tag)
    os.makedirs(d)
    out = os.path.join(d, "out")
    c = {"model": path, "loss": "loss", "train_data": os.path.join(ctx.tmp, "mlp_train.safetensors"),
         "eval_data": os.path.join(ctx.tmp, "mlp_eval.safetensors"), "metrics": ["accuracy"],
         "output_dir": out, "learning_rate": 3e-3, "max_steps": 24, "logging_steps": 4,
         "eval_strategy": "steps", "eval_steps": 4, "save_strategy": "steps", "save_steps": 4,
         "metric_for_best_model": "accuracy", "load_best_model_at_end": True,
         "save_total_limit": 2, "per_device_train_batch_size": 8, "seed": 1,
         "disable_tqdm": True}
    for k, v in changes.items():
        if v is None:
            c.pop(k, None)
        else:
            c[k] = v
    write_config(os.path.join(d, "cfg.yaml"), c)
    train(os.path.join(d, "cfg.yaml"))
    log = read_log(out)
    evals = [(e["step"], e["eval_accuracy"]) for e in log if "eval_accuracy" in e]
    cks = sorted((int(n.split("-")[1]) for n in os.listdir(out) if re.fullmatch(r"checkpoint-\d+", n)))
    with open(os.path.join(out, "trainer_state.json")) as f:
        state = json.load(f)
    return out, c, evals, cks, state


def first_best(evals, steps=None):
    """Transformers: the first step with the highest metric (a later equal one is no better)."""
    best = None
    for s, v in evals:
        if steps is not None and s not in steps:
            continue
        if best is None or v > best[1]:
            best = (s, v)
    return best


def case_rotation(ctx, tag, limit):
    out, c, evals, cks, state = rotation_run(ctx, tag, save_total_limit=limit)
    last = c["max_steps"]
    # Only the evaluations at or before the final step count (onyx train also evaluates after).
    evals = [(s, v) for s, v in evals if s <= last][:last // c["eval_steps"]]
    best = first_best(evals)
    trail = ", ".join(f"{s}:{v:.3f}" for s, v in evals)
    problems = []
    if best is None:
        return False, "no eval_accuracy in the log"
    if best[0] == last:
        return False, f"setup: accuracy did not fall (evals {trail}); the test proves nothing"
    want = sorted({best[0], last})
    if cks != want:
        problems.append(f"checkpoints left {cks}, want {want}")
    want_path = os.path.join(out, f"checkpoint-{best[0]}")
    bmc = state.get("best_model_checkpoint")
    if bmc is None or os.path.normpath(bmc) != os.path.normpath(want_path):
        problems.append(f"trainer_state best_model_checkpoint {bmc!r}, want {want_path!r}")
    if state.get("best_metric") != best[1]:
        problems.append(f"trainer_state best_metric {state.get('best_metric')!r}, want {best[1]!r}")
    ck_state_path = os.path.join(out, f"checkpoint-{last}", "trainer_state.json")
    if os.path.exists(ck_state_path):
        with open(ck_state_path) as f:
            cs = json.load(f)
        if cs.get("best_model_checkpoint") != bmc:
            problems.append(f"checkpoint-{last}/trainer_state.json best_model_checkpoint "
                            f"{cs.get('best_model_checkpoint')!r}")
    best_w = os.path.join(want_path, "model.safetensors")
    if os.path.exists(best_w):
        a, b = tensors_of(best_w), tensors_of(os.path.join(out, "model.safetensors"))
        if any(not np.array_equal(a[k], b[k]) for k in a):
            problems.append("load_best_model_at_end: output_dir/model.safetensors is not the "
                            "best checkpoint's")
    msg = f"evals {trail}; best checkpoint-{best[0]}; left {cks}"
    return not problems, ("; ".join(problems) + " -- " if problems else "") + msg


def case_best_at_save(ctx):
    out, c, evals, cks, state = rotation_run(ctx, "rot-save8", save_steps=8,
                                             save_total_limit=None)
    last = c["max_steps"]
    evals = [(s, v) for s, v in evals if s <= last][:last // c["eval_steps"]]
    trail = ", ".join(f"{s}:{v:.3f}" for s, v in evals)
    saved = set(cks)
    # Transformers 5 (_determine_best_metric): the best metric and its step are tracked at every
    # evaluation; a save names checkpoint-<best step> when that step was saved, so an unsaved
    # best evaluation leaves best_model_checkpoint at an earlier saved best, or None.
    best_val, best_step, want = None, None, None
    for s_, v in evals:
        if best_val is None or v > best_val:
            best_val, best_step = v, s_
        if s_ in saved and best_step in saved:
            want = os.path.join(out, f"checkpoint-{best_step}")
    bmc = state.get("best_model_checkpoint")
    problems = []
    if (bmc is None) != (want is None) or (bmc and os.path.normpath(bmc) != os.path.normpath(want)):
        problems.append(f"best_model_checkpoint {bmc!r}, want {want!r} (best evaluation at step "
                        f"{best_step}; saved {sorted(saved)})")
    if state.get("best_global_step") != best_step or state.get("best_metric") != best_val:
        problems.append(f"best_global_step {state.get('best_global_step')} / best_metric "
                        f"{state.get('best_metric')}, want {best_step} / {best_val}")
    msg = f"evals {trail}; saved {sorted(saved)}; best step {best_step}, checkpoint {want}"
    return not problems, ("; ".join(problems) + " -- " if problems else "") + msg


def case_limit1_keeps_newest(ctx):
    out, c, evals, cks, state = rotation_run(ctx, "rot-limit1-nobest", save_total_limit=1,
                                             load_best_model_at_end=False,
                                             metric_for_best_model=None)
    last = c["max_steps"]
    ok = cks == [last]
    return ok, (f"checkpoints left {cks}, want [{last}] (Transformers keeps the newest; "
                f"best_model_checkpoint {state.get('best_model_checkpoint')!r})")


# ----------------------------------------------------------------------------------------------


def main():
    filt = sys.argv[1] if len(sys.argv) > 1 else ""
    counts = {"PASS": 0, "FAIL": 0, "SKIP": 0}

    def report(status, name, msg):
        counts[status] += 1
        print(f"{status} {name}: {msg}", flush=True)

    if not os.path.exists(ONYX):
        report("FAIL", "setup", f"onyx binary not found at {ONYX} (set ONYX)")
        print(f"{counts['PASS']} passed, {counts['FAIL']} failed")
        return 1
    tmp = tempfile.mkdtemp(prefix="onyx-test-trainer-")
    t0 = time.time()
    try:
        ctx = Ctx(tmp)
        single = [
            ("adamw-parity", lambda: case_parity(ctx, "adamw", {})),
            ("adamw-ref-parity", lambda: case_parity(ctx, "adamw_ref", {"optim": "adamw"})),
            ("sgd-momentum-parity", lambda: case_parity(
                ctx, "sgd", {"optim": "sgd", "sgd_momentum": 0.9, "learning_rate": 0.05})),
            ("sgd-momentum-ga2-parity", lambda: case_parity(
                ctx, "sgd_ga2", {"optim": "sgd", "sgd_momentum": 0.9, "learning_rate": 0.05,
                                 "gradient_accumulation_steps": 2})),
            ("adamw-ga2-parity", lambda: case_parity(ctx, "adamw_ga2",
                                                     {"gradient_accumulation_steps": 2})),
            ("adamw-parity-dynamo", lambda: case_parity(ctx, "adamw_dyn", {}, "dynamo")),
            ("adamw-ga2-parity-dynamo", lambda: case_parity(
                ctx, "adamw_ga2_dyn", {"gradient_accumulation_steps": 2}, "dynamo")),
            ("scalar-params-parity", lambda: case_scalar_params(ctx)),
            ("resume-exact", lambda: case_resume(ctx)),
            ("resume-exact-bf16", lambda: case_resume(ctx, bf16=True)),
            ("export-ort", lambda: case_export_ort(ctx)),
        ]
        for name, fn in single:
            if filt not in name:
                continue
            try:
                ok, msg = fn()
                report("PASS" if ok else "FAIL", name, msg)
            except Skip as e:
                report("SKIP", name, str(e))
            except Exception as e:  # a broken case is a failure, with the reason
                report("FAIL", name, f"{type(e).__name__}: {e}")
        if not filt or filt.startswith("error"):
            try:
                for name, ok, msg in error_cases(ctx):
                    if filt in name:
                        report("PASS" if ok else "FAIL", name, msg)
            except Exception as e:
                report("FAIL", "error-setup", f"{type(e).__name__}: {e}")
        rotation = [
            ("rotation-limit2-keeps-best", lambda: case_rotation(ctx, "rot2", 2)),
            ("rotation-limit1-keeps-best", lambda: case_rotation(ctx, "rot1", 1)),
            ("rotation-best-checkpoint-when-saved", lambda: case_best_at_save(ctx)),
            ("rotation-limit1-no-best-keeps-newest", lambda: case_limit1_keeps_newest(ctx)),
        ]
        for name, fn in rotation:
            if filt not in name:
                continue
            try:
                ok, msg = fn()
                report("PASS" if ok else "FAIL", name, msg)
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
