"""test_unet.py — PyTorch parity of the image ops' gradients on small UNet-style models.

Two UNets (random init, fixed seeds), exported with torch.onnx.export in training mode
(TorchScript exporter, dynamo=False, opset 17, TrainingMode.TRAINING, do_constant_folding=False;
tests/parity/exporters.py), dynamic batch axis, an MSE loss inside the model (scalar output):
  unet-a   Conv2d + GroupNorm + SiLU blocks (the TorchScript exporter writes GroupNorm as
           Reshape + InstanceNormalization + affine), MaxPool2d downsample, a BatchNorm2d block in
           train mode (BatchNormalization training_mode=1 with running-mean/var outputs), a
           squeeze-excitation gate (AdaptiveAvgPool2d(1) = GlobalAveragePool), nn.Upsample(scale 2,
           bilinear) and ConvTranspose2d(k2, s2) upsampling, concatenated skips, F.pad reflect
  unet-b   Conv2d + InstanceNorm2d(affine) + ReLU blocks, AvgPool2d(3, s2, p1,
           count_include_pad=True) and AvgPool2d(4, s3, ceil_mode: a partial last window)
           downsampling, BatchNorm2d in train mode, nn.Upsample(scale 2, nearest),
           F.interpolate(size=..., bilinear, align_corners=True), ConvTranspose2d(k3, s2, p1,
           output_padding 1), F.pad replicate and constant
Cases (one PASS / FAIL / SKIP line each):
  <model>-grad        `onyx grad` on one batch: the loss and every parameter gradient within
                      rtol 1e-4, atol 1e-5 of PyTorch float32 (numpy.allclose's criterion); the
                      BatchNorm running statistics (buffers in PyTorch, float initializers in the
                      ONNX file read only as BatchNormalization's mean/var) must not be listed:
                      onyx does not train them. The line names the image ops the export contains.
  unet-a-grad-dynamo  the same for unet-a exported by the dynamo exporter (default opset,
                      optimize=False); SKIP if that export fails. torch 2.13 writes the
                      train-mode BatchNorm2d there as an inference-mode BatchNormalization
                      (running statistics, no training_mode), so when the file says so PyTorch's
                      BatchNorm2d runs in eval mode for the reference (the line says it)
  <model>-train       12 steps of `onyx train` (sequential batches of 4 over 16 samples, AdamW,
                      lr 2e-3 with warmup 3 + linear decay, weight_decay 0.01, max_grad_norm 1,
                      batch_norm_running_var: unbiased) against torch.optim.AdamW with
                      Transformers' parameter groups (no decay for biases, norms and rank <= 1
                      tensors), LambdaLR and clip_grad_norm_ on the same batches, from an export
                      with the outputs (loss, logits): every logged loss and grad_norm within 1e-4
                      relative; the final parameters reported (not checked: the biases of
                      convolutions that feed an InstanceNorm have gradients of rounding-noise
                      size, which AdamW turns into steps of size lr in either implementation; the
                      one feeding the BatchNorm, mid_conv.bias, is frozen in both, as the running
                      mean records it). Then the BatchNorm: running_mean / running_var of
                      output_dir/model.safetensors within 1e-5 of the module's buffers (relative
                      to each tensor's largest value: channel means can nearly cancel)
                      (both start from the file's values: the export's tracing forwards already
                      moved them) and moved from the file's values; the eval-mode logits of
                      `onyx export OUTPUT_DIR` (BatchNormalization in inference mode) run by
                      `onyx run` against the torch-trained module in eval mode (rtol 1e-4, atol
                      1e-5); the final evaluation's eval_loss against PyTorch's eval-mode loss
                      (1e-4 relative).
  <model>-train-onnx-var  the same with the default batch_norm_running_var (population: the ONNX
                      spec's running_var rule, the batch's population variance; PyTorch's
                      BatchNorm uses the unbiased one): running_var against a float64 replay of
                      that rule on PyTorch's batches, the eval references with that running_var;
                      the line reports how far PyTorch's own running_var is
  unet-a-train-ga     -train with gradient accumulation (2 micro-batches of 2 per step): each
                      micro-batch's forward updates the statistics once, as in PyTorch
  unet-a-train-resume 12 steps saving checkpoint-6 and a run resumed from it: the final
                      model.safetensors, running statistics included, bit-identical

Run: ONYX=build/onyx build/venv/bin/python tests/parity/test_unet.py [substring-filter]
Ends with "N passed, M failed, K skipped"; exits 1 if any case failed.
"""
import copy
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st_io  # noqa: E402
from exporters import export  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ONYX = os.environ.get("ONYX", os.path.join(REPO, "build", "onyx"))
RTOL, ATOL = 1e-4, 1e-5
IMAGE_OPS = ["Conv", "ConvTranspose", "MaxPool", "AveragePool", "GlobalAveragePool", "Resize",
             "BatchNormalization", "InstanceNormalization", "GroupNormalization", "Pad"]

warnings.filterwarnings("ignore")
torch.set_num_threads(1)


# ----------------------------------------------------------------------------------------------
# Models: forward(x, target) -> MSE loss; forward(x) -> the prediction (for eval-mode logits)


def loss_and_logits(model, out, target):
    """forward(x) is the prediction; forward(x, target) the MSE loss, or (loss, prediction) when
    the module's return_logits is set (the -train cases' export: `onyx export` of the trained
    output_dir then has the prediction as its output)."""
    if target is None:
        return out
    loss = ((out - target) ** 2).mean()
    return (loss, out) if getattr(model, "return_logits", False) else loss


class GNBlock(nn.Module):
    def __init__(self, cin, cout, groups):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.norm1 = nn.GroupNorm(groups, cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
        self.norm2 = nn.GroupNorm(groups, cout)

    def forward(self, x):
        x = F.silu(self.norm1(self.conv1(x)))
        return F.relu(self.norm2(self.conv2(x)))


class UNetA(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc1 = GNBlock(3, 8, 2)
        self.enc2 = GNBlock(8, 16, 4)
        self.mid_conv = nn.Conv2d(16, 16, 3, padding=1)
        self.mid_bn = nn.BatchNorm2d(16)
        self.se = nn.Conv2d(16, 16, 1)
        self.up2 = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False)
        self.dec2 = GNBlock(32, 16, 4)
        self.up1 = nn.ConvTranspose2d(16, 8, 2, stride=2)
        self.dec1 = nn.Conv2d(16, 8, 3)  # after a reflect pad of 1
        self.head = nn.Conv2d(8, 2, 1)

    def forward(self, x, target=None):
        e1 = self.enc1(x)                               # 16x16
        e2 = self.enc2(F.max_pool2d(e1, 2))             # 8x8
        m = F.relu(self.mid_bn(self.mid_conv(F.max_pool2d(e2, 2))))  # 4x4
        m = m * torch.sigmoid(self.se(F.adaptive_avg_pool2d(m, 1)))
        d2 = self.dec2(torch.cat([self.up2(m), e2], 1))  # 8x8
        d1 = torch.cat([self.up1(d2), e1], 1)           # 16x16
        d1 = F.silu(self.dec1(F.pad(d1, (1, 1, 1, 1), mode="reflect")))
        out = self.head(d1)
        return loss_and_logits(self, out, target)


class INBlock(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1)
        self.norm = nn.InstanceNorm2d(cout, affine=True)

    def forward(self, x):
        return F.relu(self.norm(self.conv(x)))


class UNetB(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc1 = INBlock(3, 8)
        self.enc2 = INBlock(8, 12)
        self.mid_conv = nn.Conv2d(12, 12, 3, padding=1)
        self.mid_bn = nn.BatchNorm2d(12)
        self.up_near = nn.Upsample(scale_factor=2, mode="nearest")
        self.dec2 = INBlock(24, 12)
        self.up1 = nn.ConvTranspose2d(12, 8, 3, stride=2, padding=1, output_padding=1)
        self.dec1 = nn.Conv2d(16, 8, 3)  # after a replicate pad of 1
        self.head = nn.Conv2d(8, 2, 3)   # after a constant pad of 1

    def forward(self, x, target=None):
        e1 = self.enc1(x)                                                          # 12x12
        e2 = self.enc2(F.avg_pool2d(e1, 3, stride=2, padding=1, count_include_pad=True))  # 6x6
        m = F.avg_pool2d(e2, 4, stride=3, ceil_mode=True)  # 2x2, the last window partial
        m = F.relu(self.mid_bn(self.mid_conv(m)))
        u = F.interpolate(self.up_near(m), size=(6, 6), mode="bilinear", align_corners=True)
        d2 = self.dec2(torch.cat([u, e2], 1))                                      # 6x6
        d1 = torch.cat([self.up1(d2), e1], 1)                                      # 12x12
        d1 = F.relu(self.dec1(F.pad(d1, (1, 1, 1, 1), mode="replicate")))
        out = self.head(F.pad(d1, (1, 1, 1, 1), value=0.25))
        return loss_and_logits(self, out, target)


# name: (class, seed, image size)
MODELS = {"unet-a": (UNetA, 21, 16), "unet-b": (UNetB, 22, 12)}


def make_data(n, size, seed):
    """Images and a learnable per-pixel target: a pointwise and a smoothed function of x."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, size, size, generator=g)
    target = torch.cat([torch.tanh(x[:, :1] + x[:, 1:2]),
                        F.avg_pool2d(x[:, 2:3], 3, stride=1, padding=1)], 1)
    return {"x": x, "target": target + 0.05 * torch.randn(n, 2, size, size, generator=g)}


NAMES = ["x", "target"]
DYN = {"x": {0: "batch"}, "target": {0: "batch"}}


# ----------------------------------------------------------------------------------------------


def run_onyx(args, timeout=600):
    p = subprocess.run([ONYX] + args, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def last_line(out, err):
    lines = (err.strip() or out.strip()).splitlines()
    return lines[-1] if lines else "(no output)"


def rel_err(got, want):
    """(ok, max relative error, max abs error) with numpy.allclose's criterion."""
    g64, w64 = got.astype(np.float64), want.astype(np.float64)
    if g64.size == 0:
        return True, 0.0, 0.0
    if not np.all(np.isfinite(g64)):
        return False, float("inf"), float("inf")
    diff = np.abs(g64 - w64)
    ok = bool(np.all(diff <= ATOL + RTOL * np.abs(w64)))
    return ok, float(np.max(diff / (np.abs(w64) + ATOL / RTOL))), float(np.max(diff))


def op_summary(path):
    import onnx
    ops = {}
    for n in onnx.load(path).graph.node:
        if n.op_type in IMAGE_OPS:
            ops[n.op_type] = ops.get(n.op_type, 0) + 1
    return ops


def bn_exported_in_training_mode(path):
    """False when a BatchNormalization of the file normalizes with the running statistics
    (torch 2.13's dynamo exporter writes train-mode BatchNorm2d that way, without
    training_mode=1)."""
    import onnx
    for n in onnx.load(path).graph.node:
        if n.op_type == "BatchNormalization":
            if not any(a.name == "training_mode" and a.i == 1 for a in n.attribute):
                return False
    return True


def torch_grads(model, data, dtype=torch.float32, bn_eval=False):
    m = copy.deepcopy(model).to(dtype).train()
    if bn_eval:  # the export's BatchNormalization is in inference mode: compare with that
        for mod in m.modules():
            if isinstance(mod, nn.BatchNorm2d):
                mod.eval()
    loss = m(*[data[k].to(dtype) for k in NAMES])
    loss.backward()
    return loss.detach().numpy(), {n: p.grad.detach().numpy() for n, p in m.named_parameters()}


def grad_case(tmp, tag, path, model, data):
    in_path = os.path.join(tmp, tag + ".in.safetensors")
    out_path = os.path.join(tmp, tag + ".grads.safetensors")
    st_io.save(in_path, {k: v.numpy() for k, v in data.items()})
    rc, out, err = run_onyx(["grad", path, "--inputs", in_path, "--output", out_path])
    if rc != 0:
        return False, f"onyx grad exited {rc}: {last_line(out, err)}"
    got = st_io.load(out_path)
    bn_eval = not bn_exported_in_training_mode(path)
    loss, grads = torch_grads(model, data, bn_eval=bn_eval)
    want = {"loss": loss, **grads}
    buffers = sorted(n for n, _ in model.named_buffers() if n in got)
    notes, bad, ok = [], [], True
    missing = sorted(set(want) - set(got))
    if missing:
        ok = False
        notes.append(f"missing from onyx output: {missing[:6]}")
    if buffers:  # BatchNorm running statistics are buffers, not trainable parameters
        ok = False
        notes.append(f"running statistics listed as gradients: {buffers}")
    unexpected = sorted(set(got) - set(want) - set(buffers))
    if unexpected:
        ok = False
        notes.append(f"unexpected: {unexpected[:6]}")
    worst, worst_abs, worst_name = 0.0, 0.0, ""
    for k in sorted(set(want) & set(got)):
        if got[k].shape != want[k].shape:
            ok = False
            bad.append(f"{k}: shape {got[k].shape} != {want[k].shape}")
            continue
        t_ok, rel, ab = rel_err(got[k], want[k])
        if rel > worst:
            worst, worst_name = rel, k
        worst_abs = max(worst_abs, ab)
        if not t_ok:
            ok = False
            bad.append(f"{k} (rel {rel:.1e})")
    ops = ", ".join(f"{k} x{v}" for k, v in op_summary(path).items())
    msg = (f"max rel err {worst:.2e} ({worst_name}; max abs {worst_abs:.2e}), "
           f"{len(want) - 1} parameter gradients, no running statistic listed; ops: {ops}")
    if bn_eval:
        msg += ("; the export's BatchNormalization is in inference mode (no training_mode=1): "
                "compared with PyTorch's BatchNorm2d in eval mode")
    if bad:
        loss64, g64 = torch_grads(model, data, torch.float64, bn_eval)
        exact = {"loss": loss64, **g64}
        e_onyx = max(rel_err(got[k], exact[k])[1] for k in exact if k in got
                     and got[k].shape == exact[k].shape)
        e_torch = max(rel_err(want[k], exact[k])[1] for k in exact)
        msg += (f"; {len(bad)} over tolerance: " + ", ".join(bad[:4])
                + f"; vs float64: onyx {e_onyx:.2e}, torch-f32 {e_torch:.2e}")
    if notes:
        msg += "; " + "; ".join(notes)
    return ok, msg


# ----------------------------------------------------------------------------------------------
# Training parity (the rules of tests/cli/test_trainer.py's adamw-parity)

TRAIN = {"learning_rate": 2e-3, "train_sampling_strategy": "sequential", "logging_steps": 1,
         "weight_decay": 0.01, "warmup_steps": 3, "lr_scheduler_type": "linear",
         "max_grad_norm": 1.0, "per_device_train_batch_size": 4, "max_steps": 12,
         "save_strategy": "no", "optim": "adamw_fused", "disable_tqdm": True}


# Frozen in both: the bias of the convolution feeding the BatchNorm. The normalization removes it,
# so its gradient is rounding noise, which AdamW turns into steps of size lr that differ between
# any two implementations; the running mean (which includes that bias) would record them.
FROZEN = ["mid_conv.bias"]


def no_decay(name, p):
    """onyx's hf_decay_mask for generic ONNX models (src/train/optimizer.cc)."""
    n = name.lower()
    return any(s in n for s in ("bias", "layernorm", "layer_norm", "ln_", "norm")) or p.dim() <= 1


def torch_train(model, data, o, stats=None):
    """PyTorch's loop on the same batches, the BatchNorm running statistics starting from
    `stats` (by state-dict name) when given. Returns the logged values, the trained module
    (train mode) and, per BatchNorm2d, its running_var as the ONNX spec's rule would have updated
    it (population batch variance instead of PyTorch's unbiased one; float64 replay)."""
    m = copy.deepcopy(model).train()
    with torch.no_grad():
        for k, b in m.named_buffers():
            if stats and k in stats:
                b.copy_(torch.from_numpy(stats[k]))
    for k, p in m.named_parameters():
        p.requires_grad_(k not in FROZEN)
    params = [(k, p) for k, p in m.named_parameters() if p.requires_grad]
    groups = [{"params": [p for n, p in params if not no_decay(n, p)],
               "weight_decay": o["weight_decay"]},
              {"params": [p for n, p in params if no_decay(n, p)], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=o["learning_rate"], betas=(0.9, 0.999), eps=1e-8)
    warm, total = o["warmup_steps"], o["max_steps"]

    def lam(step):  # transformers.get_linear_schedule_with_warmup
        if step < warm:
            return float(step) / float(max(1, warm))
        return max(0.0, float(total - step) / float(max(1, total - warm)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lam)
    onnx_var, hooks = {}, []
    for name, mod in m.named_modules():
        if isinstance(mod, nn.BatchNorm2d):
            onnx_var[name + ".running_var"] = mod.running_var.detach().double().clone()

            def pre(module, inp, key=name + ".running_var"):
                if module.training:
                    v = inp[0].detach().double().var(dim=(0, 2, 3), unbiased=False)
                    onnx_var[key] = (1 - module.momentum) * onnx_var[key] + module.momentum * v
            hooks.append(mod.register_forward_pre_hook(pre))
    n = data["x"].shape[0]
    bs = o["per_device_train_batch_size"]
    nb = (n + bs - 1) // bs
    ga = o.get("gradient_accumulation_steps", 1)
    rec = []
    for step in range(total):
        opt.zero_grad(set_to_none=True)
        loss = 0.0
        for j in range(ga):  # each micro-batch's forward updates the running statistics once
            b = (step * ga + j) % nb
            idx = slice(b * bs, min(n, (b + 1) * bs))
            part = m(*[data[k][idx] for k in NAMES]) / ga
            part.backward()
            loss += part.detach()
        gn = torch.nn.utils.clip_grad_norm_([p for _, p in params], o["max_grad_norm"])
        opt.step()
        rec.append({"loss": float(loss), "grad_norm": float(gn),
                    "learning_rate": sched.get_last_lr()[0]})
        sched.step()
    for h in hooks:
        h.remove()
    return rec, m, {k: v.float().numpy() for k, v in onnx_var.items()}


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-30)


def max_rel(got, want):
    g64, w64 = got.astype(np.float64), want.astype(np.float64)
    return float(np.max(np.abs(g64 - w64) / np.maximum(np.abs(w64), 1e-30)))


def rel_to_largest(got, want):
    """max |got - want| over the tensor / its largest |want|: a running mean is an average of
    activations whose channels can nearly cancel (a mean of -0.009 next to 0.16), and float32
    summation in any order errs by ~1e-7 of the activations' scale, which is 1e-5 of such a
    channel's own value."""
    g64, w64 = got.astype(np.float64), want.astype(np.float64)
    return float(np.max(np.abs(g64 - w64)) / max(float(np.max(np.abs(w64))), 1e-30))


STATS_RTOL = 1e-5    # running_mean / running_var against the reference, of the largest |value|
EVAL_RTOL, EVAL_ATOL = 1e-4, 1e-5  # eval-mode logits (numpy.allclose's criterion)


# The same with gradient accumulation: 2 micro-batches of 2 per step (their losses averaged).
TRAIN_GA = {**TRAIN, "per_device_train_batch_size": 2, "gradient_accumulation_steps": 2}


def train_case(tmp, tag, path, model, data, name, var_mode, o=TRAIN):
    """onyx train vs PyTorch (logs), then the BatchNorm running statistics of output_dir and the
    trained model in eval mode. var_mode "unbiased" (config batch_norm_running_var: unbiased):
    every reference is PyTorch's own module; "population" (the default, the ONNX spec's
    running_var rule): running_var against the ONNX-rule replay, and the eval-mode references
    use the torch-trained module with that running_var."""
    _, seed, size = MODELS[name]
    d = os.path.join(tmp, tag)
    os.makedirs(d)
    eval_data = make_data(8, size, seed + 200)
    st_io.save(os.path.join(d, "train.safetensors"), {k: v.numpy() for k, v in data.items()})
    st_io.save(os.path.join(d, "eval.safetensors"), {k: v.numpy() for k, v in eval_data.items()})
    cfg = {"model": path, "loss": "loss", "train_data": "train.safetensors",
           "eval_data": "eval.safetensors", "per_device_eval_batch_size": 8, "frozen": FROZEN,
           "output_dir": os.path.join(d, "out"), **o}
    if var_mode == "unbiased":
        cfg["batch_norm_running_var"] = "unbiased"
    with open(os.path.join(d, "cfg.yaml"), "w") as f:
        for k, v in cfg.items():
            f.write(f"{k}: {json.dumps(v)}\n")
    rc, out, err = run_onyx(["train", os.path.join(d, "cfg.yaml")])
    if rc != 0:
        return False, f"onyx train exited {rc}: {last_line(out, err)}"
    with open(os.path.join(cfg["output_dir"], "log_history.jsonl")) as f:
        entries = [json.loads(line) for line in f if line.strip()]
    log = [e for e in entries if "loss" in e]
    evals = [e for e in entries if "eval_loss" in e]
    # torch.onnx.export traces the module in train mode, so the running statistics the file
    # holds are the module's after the tracing forwards (not its initial 0 / 1): both start there.
    import onnx
    from onnx import numpy_helper
    init_stats = {i.name: numpy_helper.to_array(i).copy() for i in onnx.load(path).graph.initializer
                  if i.name.endswith("running_mean") or i.name.endswith("running_var")}
    ref, m, onnx_var = torch_train(model, data, o, init_stats)
    ref_w = {k: p.detach().numpy() for k, p in m.named_parameters()}
    steps = [e["step"] for e in log]
    if steps != list(range(1, o["max_steps"] + 1)):
        return False, f"logged loss steps are {steps}, want 1..{o['max_steps']}"
    tol = {"loss": 1e-4, "grad_norm": 1e-4, "learning_rate": 1e-12}
    worst = {k: (0.0, 0) for k in tol}
    bad = []
    for e, r in zip(log, ref):
        for k in tol:
            err = rel(e[k], r[k]) if r[k] != 0 else abs(e[k])
            if err > worst[k][0]:
                worst[k] = (err, e["step"])
            if err > tol[k] and len(bad) < 4:
                bad.append(f"step {e['step']} {k} onyx {e[k]!r} torch {r[k]!r}")
    got_w = st_io.load(os.path.join(cfg["output_dir"], "model.safetensors"))
    w_err, w_name = 0.0, ""
    for k, v in ref_w.items():
        if k not in got_w:
            bad.append(f"final weights lack {k}")
            continue
        e = float(np.max(np.abs(got_w[k].astype(np.float64) - v) / (np.abs(v) + 1e-2)))
        if e > w_err:
            w_err, w_name = e, k
    # Running statistics: PyTorch's buffers after the N train-mode forwards (running_var by the
    # ONNX rule in population mode). The eval-mode reference module carries the same.
    # how far PyTorch's own running_var is from the ONNX rule's (reported in population mode)
    spec_gap = max((max_rel(dict(m.named_buffers())[k].detach().numpy(), v)
                    for k, v in onnx_var.items()), default=0.0)
    m.eval()
    ref_stats = {}
    for k, b in m.named_buffers():
        if k.endswith("running_mean") or k.endswith("running_var"):
            ref_stats[k] = b.detach().numpy().copy()
            if var_mode == "population" and k in onnx_var:
                ref_stats[k] = onnx_var[k]
                b.copy_(torch.from_numpy(onnx_var[k]))
    s_err, s_name = 0.0, ""
    for k, v in ref_stats.items():
        if k not in got_w:
            bad.append(f"model.safetensors lacks {k}")
            continue
        e = rel_to_largest(got_w[k], v)
        if e > s_err:
            s_err, s_name = e, k
        if e > STATS_RTOL:
            bad.append(f"{k} rel err {e:.1e} (onyx {got_w[k][:3]}, want {v[:3]})")
        if k not in init_stats:
            bad.append(f"the export has no initializer {k}")
        elif np.array_equal(got_w[k], init_stats[k]):
            bad.append(f"{k} is still its initial value")
    with torch.no_grad():
        want_logits = m(eval_data["x"]).numpy()
        want_eval_loss = float(m(eval_data["x"], eval_data["target"]))
    # 1. `onyx export` of output_dir (Dropout removed, BatchNormalization in inference mode, the
    # loss and target removed), then `onyx run`: the eval-mode logits
    exported = os.path.join(d, "exported.onnx")
    rc, out, err = run_onyx(["export", cfg["output_dir"], "--output", exported])
    if rc != 0:
        return False, f"onyx export exited {rc}: {last_line(out, err)}"
    st_io.save(os.path.join(d, "x.safetensors"), {"x": eval_data["x"].numpy()})
    rc, out, err = run_onyx(["run", exported, "--inputs", os.path.join(d, "x.safetensors"),
                             "--output", os.path.join(d, "logits.safetensors")])
    if rc != 0:
        return False, f"onyx run of the export exited {rc}: {last_line(out, err)}"
    got_logits = st_io.load(os.path.join(d, "logits.safetensors"))["logits"]
    l_rel = max_rel(got_logits, want_logits)
    l_abs = float(np.max(np.abs(got_logits.astype(np.float64) - want_logits)))
    if not np.all(np.abs(got_logits.astype(np.float64) - want_logits)
                  <= EVAL_ATOL + EVAL_RTOL * np.abs(want_logits)):
        bad.append(f"eval-mode logits max rel {l_rel:.1e} (abs {l_abs:.1e})")
    # 2. the final evaluation of onyx train (TrainingSession::forward)
    if not evals:
        return False, "onyx train logged no eval_loss"
    onyx_eval_loss = evals[-1]["eval_loss"]
    if rel(onyx_eval_loss, want_eval_loss) > 1e-4:
        bad.append(f"eval_loss {onyx_eval_loss!r}, PyTorch eval mode {want_eval_loss!r}")
    first, last = log[0]["loss"], log[-1]["loss"]
    msg = (f"{len(log)} steps, loss {first:.4f} -> {last:.4f}; max rel err loss "
           f"{worst['loss'][0]:.1e} (step {worst['loss'][1]}), grad_norm "
           f"{worst['grad_norm'][0]:.1e}, lr {worst['learning_rate'][0]:.1e}; final weights max "
           f"|d|/(|w|+1e-2) {w_err:.1e} ({w_name}); running statistics ({var_mode} variance) "
           f"max rel err {s_err:.1e} ({s_name})"
           + (f", PyTorch's unbiased running_var {spec_gap:.1e} away" if var_mode == "population"
              else "") + f"; eval mode: logits max rel {l_rel:.1e} "
           f"(abs {l_abs:.1e}), eval_loss rel {rel(onyx_eval_loss, want_eval_loss):.1e}")
    if bad:
        return False, msg + "; over tolerance: " + "; ".join(bad)
    return True, msg


def resume_case(tmp, tag, path, data):
    """12 steps saving checkpoint-6, against a second run resumed from that checkpoint: the final
    model.safetensors (BatchNorm running statistics included) must be the same bits."""
    d = os.path.join(tmp, tag)
    os.makedirs(d)
    st_io.save(os.path.join(d, "train.safetensors"), {k: v.numpy() for k, v in data.items()})
    outs = []
    for run, extra in (("full", {}), ("resumed", {"resume_from_checkpoint": "full/checkpoint-6"})):
        cfg = {"model": path, "loss": "loss", "train_data": "train.safetensors", **TRAIN,
               "save_strategy": "steps", "save_steps": 6, "output_dir": os.path.join(d, run),
               **{k: os.path.join(d, v) for k, v in extra.items()}}
        with open(os.path.join(d, run + ".yaml"), "w") as f:
            for k, v in cfg.items():
                f.write(f"{k}: {json.dumps(v)}\n")
        rc, out, err = run_onyx(["train", os.path.join(d, run + ".yaml")])
        if rc != 0:
            return False, f"onyx train ({run}) exited {rc}: {last_line(out, err)}"
        outs.append(st_io.load(os.path.join(d, run, "model.safetensors")))
    mid = st_io.load(os.path.join(d, "full", "checkpoint-6", "model.safetensors"))
    stats = sorted(k for k in outs[0] if k.endswith("running_mean") or k.endswith("running_var"))
    if not stats:
        return False, "model.safetensors has no running statistics"
    differ = sorted(k for k in outs[0] if not np.array_equal(outs[0][k], outs[1].get(k)))
    if differ:
        return False, f"the resumed run's final tensors differ: {differ[:6]}"
    same_as_mid = [k for k in stats if np.array_equal(mid[k], outs[0][k])]
    if same_as_mid:
        return False, f"running statistics did not move after checkpoint-6: {same_as_mid}"
    return True, (f"resumed from checkpoint-6: all {len(outs[0])} tensors of model.safetensors "
                  f"bit-identical, running statistics included ({', '.join(stats)})")


# ----------------------------------------------------------------------------------------------


def main():
    filt = sys.argv[1] if len(sys.argv) > 1 else ""
    if not (os.path.isfile(ONYX) and os.access(ONYX, os.X_OK)):
        print(f"FAIL setup: onyx binary not found at {ONYX} (set ONYX=...)")
        print("0 passed, 1 failed, 0 skipped")
        return 1
    t0 = time.time()
    tmp = tempfile.mkdtemp(prefix="onyx-unet-")
    counts = {"PASS": 0, "FAIL": 0, "SKIP": 0}

    def report(status, case, msg):
        counts[status] += 1
        print(f"{status} {case}: {msg}", flush=True)

    cases = [(f"{name}-grad", name, "ts") for name in MODELS]
    cases.append(("unet-a-grad-dynamo", "unet-a", "dynamo"))
    cases += [(f"{name}-train", name, "train") for name in MODELS]
    cases += [(f"{name}-train-onnx-var", name, "train-population") for name in MODELS]
    cases.append(("unet-a-train-ga", "unet-a", "train-ga"))
    cases.append(("unet-a-train-resume", "unet-a", "train-resume"))
    try:
        models, paths = {}, {}
        for case, name, kind in cases:
            if filt not in case:
                continue
            cls, seed, size = MODELS[name]
            if name not in models:
                torch.manual_seed(seed)
                models[name] = cls()
            model = models[name]
            exporter = "dynamo" if kind == "dynamo" else "ts"
            logits = kind.startswith("train")  # outputs (loss, logits)
            key = (name, exporter, logits)
            if key not in paths:
                path = os.path.join(tmp, f"{name}_{exporter}{'_logits' if logits else ''}.onnx")
                sample = make_data(2, size, seed)
                try:
                    m = copy.deepcopy(model).train()
                    m.return_logits = logits
                    export(m, tuple(sample[k] for k in NAMES), path,
                           exporter=exporter, opset=17 if exporter == "ts" else None,
                           input_names=NAMES,
                           output_names=["loss", "logits"] if logits else ["loss"],
                           dynamic_axes=DYN, training=True, fold=False)
                    paths[key] = path
                except Exception as e:
                    paths[key] = None
                    msg = f"torch.onnx.export failed: {type(e).__name__}: {str(e)[:200]}"
                    if exporter == "dynamo":
                        report("SKIP", case, msg)
                    else:
                        report("FAIL", case, msg)
                    continue
            path = paths[key]
            if path is None:
                report("FAIL" if exporter == "ts" else "SKIP", case, "export failed (see above)")
                continue
            try:
                if kind == "train-resume":
                    ok, msg = resume_case(tmp, case, path, make_data(16, size, seed + 100))
                elif kind.startswith("train"):
                    ok, msg = train_case(tmp, case, path, model, make_data(16, size, seed + 100),
                                         name, "population" if kind == "train-population"
                                         else "unbiased", TRAIN_GA if kind == "train-ga" else TRAIN)
                else:
                    ok, msg = grad_case(tmp, case, path, model, make_data(3, size, seed + 50))
            except Exception as e:  # a broken case is a failure, with the reason
                ok, msg = False, f"{type(e).__name__}: {e}"
            report("PASS" if ok else "FAIL", case, msg)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"({time.time() - t0:.0f} s)")
    print(f"{counts['PASS']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped")
    return 1 if counts["FAIL"] else 0


if __name__ == "__main__":
    sys.exit(main())
