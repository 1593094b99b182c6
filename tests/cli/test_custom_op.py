"""test_custom_op.py — custom operators: a library built out of tree against only
include/onyx/custom_op.h (examples/custom_op, with cmake into a temporary folder), loaded by
`onyx train` (config key custom_op_libraries) and the global option `--custom-ops`.

The model (onnx.helper, opset 17 + domain com.example): x [batch, 8] → Linear(8, 16) →
com.example.ScaledSwish(beta 1.5, scale 0.8) → Linear(16, 16) → com.example.SquaredReLU(alpha 0.5)
→ Linear(16, 4) → SoftmaxCrossEntropyLoss(labels) = loss. ScaledSwish's gradient is a kernel of
the library (ScaledSwishGrad), SquaredReLU's a rule of existing ops (Relu, Mul).

Cases (one PASS / FAIL / SKIP line each):
  build-example        cmake configure + build of examples/custom_op out of tree → libmyops.so
                       exporting onyx_register_custom_ops only.
  cli-sees-ops         `onyx --custom-ops LIB ops` lists the three ops (gradient rules marked) and
                       `info` / `run` accept the model, run's logits match PyTorch (1e-5);
                       `plan CONFIG --custom_op_libraries [LIB]` (the key as an override) plans
                       the training step with the gradient kernel in it.
  grad-parity          `onyx --custom-ops LIB grad`: loss and every parameter gradient against
                       PyTorch's autograd on the same model (float64 reference), max abs ≤ 1e-5.
  train-adamw-parity   `onyx train` with custom_op_libraries: [libmyops.so] (relative to the
                       config) for 12 AdamW steps (sequential batches of 8, warmup 2 + linear
                       decay, weight_decay 0.01, max_grad_norm 1) against torch.optim.AdamW with
                       Transformers' parameter groups and LambdaLR schedule: every logged loss and
                       grad_norm within 1e-4 relative, learning_rate within 1e-12.
  export-run           `onyx --custom-ops LIB export` of the trained output keeps the two custom
                       nodes (and the com.example opset); `run` of that file matches PyTorch with
                       the trained weights (1e-5).
  error-*              exit status 1 and "onyx: error: ..." naming the problem: a library that
                       does not exist (option and config key), a file that is not a library, one
                       without the entry point, one whose op was built for API version 2, one that
                       refuses onyx's version (ONYX_ERR_API_VERSION), one with a gradient rule
                       that refers to nothing, the same ops loaded from a second file, and the
                       model without the library (`run` and `train`) naming com.example.ScaledSwish.
                       The tiny variants are built here with the system C compiler (C99: the
                       header is plain C) and C++ compiler.

Run: ONYX=build/onyx build/venv/bin/python tests/cli/test_custom_op.py [substring-filter]
Prints one line per case and ends with "N passed, M failed" (", K skipped" when some were);
exits 1 if any case failed. Temporary folders are removed.
"""
import json
import os
import re
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

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "tests", "parity"))
import st_io  # noqa: E402

ONYX = os.environ.get("ONYX", os.path.join(REPO, "build", "onyx"))
INCLUDE = os.path.join(REPO, "include")
EXAMPLE = os.path.join(REPO, "examples", "custom_op")
warnings.filterwarnings("ignore")
torch.set_num_threads(1)

BETA, SCALE, ALPHA = 1.5, 0.8, 0.5
SIZES = [("fc1", 8, 16), ("fc2", 16, 16), ("fc3", 16, 4)]


class Skip(Exception):
    pass


# ----------------------------------------------------------------------------------------------
# The model in PyTorch and as ONNX


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        for name, i, o in SIZES:
            setattr(self, name, nn.Linear(i, o))

    def forward(self, x, labels):
        h = self.fc1(x)
        h = SCALE * h * torch.sigmoid(BETA * h)       # com.example.ScaledSwish
        h = self.fc2(h)
        h = ALPHA * torch.relu(h) ** 2                # com.example.SquaredReLU
        logits = self.fc3(h)
        return F.cross_entropy(logits, labels), logits


def onnx_model(net, path):
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    inits, nodes = [], []
    for name, _, _ in SIZES:
        lin = getattr(net, name)
        inits.append(numpy_helper.from_array(lin.weight.detach().numpy(), f"{name}.weight"))
        inits.append(numpy_helper.from_array(lin.bias.detach().numpy(), f"{name}.bias"))
    nodes.append(helper.make_node("Gemm", ["x", "fc1.weight", "fc1.bias"], ["h1"], transB=1))
    nodes.append(helper.make_node("ScaledSwish", ["h1"], ["a1"], domain="com.example",
                                  beta=BETA, scale=SCALE))
    nodes.append(helper.make_node("Gemm", ["a1", "fc2.weight", "fc2.bias"], ["h2"], transB=1))
    nodes.append(helper.make_node("SquaredReLU", ["h2"], ["a2"], domain="com.example", alpha=ALPHA))
    nodes.append(helper.make_node("Gemm", ["a2", "fc3.weight", "fc3.bias"], ["logits"], transB=1))
    nodes.append(helper.make_node("SoftmaxCrossEntropyLoss", ["logits", "labels"], ["loss"],
                                  reduction="mean"))
    graph = helper.make_graph(
        nodes, "custom_op_mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8]),
         helper.make_tensor_value_info("labels", TensorProto.INT64, ["batch"])],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, []),
         helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 4])],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.example", 1)],
                              producer_name="test_custom_op")
    onnx.save(model, path)


def make_data(n, seed):
    g = torch.Generator().manual_seed(seed)
    return {"x": torch.randn(n, 8, generator=g),
            "labels": torch.randint(0, 4, (n,), generator=g)}


# ----------------------------------------------------------------------------------------------
# Helpers


def run(cmd, timeout=300, cwd=None):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd)


def onyx(args, timeout=300):
    return run([ONYX] + args, timeout)


def last_line(p):
    lines = (p.stderr.strip() or p.stdout.strip()).splitlines()
    return lines[-1] if lines else "(no output)"


def write_config(path, cfg):
    with open(path, "w") as f:
        for k, v in cfg.items():
            f.write(f"{k}: {json.dumps(v)}\n")


def no_decay(name, p):  # onyx's hf_decay_mask for generic ONNX models (src/train/optimizer.cc)
    n = name.lower()
    return any(s in n for s in ("bias", "layernorm", "layer_norm", "ln_", "norm")) or p.dim() <= 1


def linear_warmup(warmup, total):  # transformers.get_linear_schedule_with_warmup
    def lam(step):
        if step < warmup:
            return float(step) / float(max(1, warmup))
        return max(0.0, float(total - step) / float(max(1, total - warmup)))
    return lam


def torch_train(net, data, o):
    import copy
    m = copy.deepcopy(net).train()
    groups = [{"params": [p for n, p in m.named_parameters() if not no_decay(n, p)],
               "weight_decay": o["weight_decay"]},
              {"params": [p for n, p in m.named_parameters() if no_decay(n, p)],
               "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=o["learning_rate"], betas=(0.9, 0.999), eps=1e-8)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, linear_warmup(o["warmup_steps"], o["max_steps"]))
    n, bs = data["x"].shape[0], o["per_device_train_batch_size"]
    rec, step = [], 0
    while step < o["max_steps"]:
        for b in range(0, n, bs):
            idx = list(range(b, min(n, b + bs)))
            opt.zero_grad(set_to_none=True)
            loss = m(data["x"][idx], data["labels"][idx])[0]
            loss.backward()
            gn = torch.nn.utils.clip_grad_norm_(m.parameters(), o["max_grad_norm"])
            opt.step()
            lr = sched.get_last_lr()[0]
            sched.step()
            rec.append({"loss": loss.item(), "grad_norm": float(gn), "learning_rate": lr})
            step += 1
            if step == o["max_steps"]:
                break
    return rec


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-30)


class Ctx:
    def __init__(self, tmp):
        self.tmp = tmp
        self.lib = None
        self.net = Net()
        self.model = os.path.join(tmp, "model.onnx")
        onnx_model(self.net, self.model)

    def need_lib(self):
        if not self.lib:
            raise Skip("libmyops.so was not built (see build-example)")
        return self.lib


def compile_variant(tmp, name, source, lang="c"):
    """Builds a tiny shared library from `source`; returns its path."""
    src = os.path.join(tmp, name + (".c" if lang == "c" else ".cc"))
    with open(src, "w") as f:
        f.write(source)
    out = os.path.join(tmp, "lib" + name + ".so")
    if lang == "c":
        cc = shutil.which("cc") or shutil.which("gcc")
        cmd = [cc, "-std=c99", "-Wall", "-Werror", "-pedantic"]
    else:
        cmd = [shutil.which("c++") or shutil.which("g++"), "-std=c++17", "-Wall", "-Werror"]
    p = run(cmd + ["-shared", "-fPIC", "-fvisibility=hidden", "-I", INCLUDE, src, "-o", out])
    if p.returncode != 0:
        raise AssertionError(f"compiling {name} failed: {p.stderr.strip()[-800:]}")
    return out


# ----------------------------------------------------------------------------------------------
# Cases


def case_build(ctx):
    bdir = os.path.join(ctx.tmp, "myops-build")
    cmake = shutil.which("cmake")
    if not cmake:
        raise Skip("cmake not found")
    p = run([cmake, "-S", EXAMPLE, "-B", bdir, f"-DONYX_INCLUDE_DIR={INCLUDE}"])
    if p.returncode != 0:
        return False, f"cmake configure failed: {last_line(p)}"
    p = run([cmake, "--build", bdir], timeout=300)
    if p.returncode != 0:
        return False, f"cmake build failed: {p.stdout.strip()[-800:]}"
    lib = os.path.join(bdir, "libmyops.so")
    if not os.path.exists(lib):
        return False, f"no libmyops.so in {bdir}: {os.listdir(bdir)}"
    syms = run(["nm", "-D", "--defined-only", lib]).stdout.split()
    exported = [s for s in syms if s.startswith("onyx_")]
    ctx.lib = lib
    if exported != ["onyx_register_custom_ops"]:
        return False, f"exported onyx_* symbols {exported}, want [onyx_register_custom_ops]"
    return True, f"built {lib} out of tree (exports onyx_register_custom_ops)"


def case_cli_sees_ops(ctx):
    lib = ctx.need_lib()
    p = onyx(["--custom-ops", lib, "ops"])
    if p.returncode != 0:
        return False, f"ops exited {p.returncode}: {last_line(p)}"
    lines = {ln.split()[0]: ln for ln in p.stdout.splitlines() if ln.startswith("com.example.")}
    want = {"com.example.ScaledSwish": True, "com.example.ScaledSwishGrad": False,
            "com.example.SquaredReLU": True}
    for k, grad in want.items():
        if k not in lines:
            return False, f"`onyx ops` does not list {k}: {sorted(lines)}"
        if ("(gradient)" in lines[k]) != grad or "custom op from" not in lines[k]:
            return False, f"`onyx ops` line for {k}: {lines[k]!r}"
    md = onyx(["--custom-ops", lib, "ops", "--markdown"])
    if not re.search(r"^## com\.example \(3 ops", md.stdout, re.M):
        return False, "`onyx ops --markdown` has no com.example section"
    info = onyx(["--custom-ops", lib, "info", ctx.model])
    if info.returncode != 0 or "com.example.ScaledSwish: 1" not in info.stdout:
        return False, f"info: {last_line(info)}"
    # run: logits against PyTorch
    data = make_data(5, 3)
    inp = os.path.join(ctx.tmp, "run_in.safetensors")
    st_io.save(inp, {k: v.numpy() for k, v in data.items()})
    out = os.path.join(ctx.tmp, "run_out.safetensors")
    r = onyx(["--custom-ops", lib, "run", ctx.model, "--inputs", inp, "--output", out])
    if r.returncode != 0:
        return False, f"run exited {r.returncode}: {last_line(r)}"
    got = st_io.load(out)["logits"]
    with torch.no_grad():
        ref = ctx.net.double()(data["x"].double(), data["labels"])[1].numpy()
        ctx.net.float()
    err = float(np.max(np.abs(got - ref)))
    if err > 1e-5:
        return False, f"run logits differ from PyTorch by {err:.2e}"
    # plan: the training graph builds with both gradients (kernel and rule)
    d = os.path.join(ctx.tmp, "plan")
    os.makedirs(d)
    st_io.save(os.path.join(d, "train.safetensors"), {k: v.numpy() for k, v in make_data(16, 1).items()})
    write_config(os.path.join(d, "cfg.yaml"), {"model": ctx.model, "loss": "loss",
                                               "train_data": "train.safetensors",
                                               "output_dir": os.path.join(d, "out"),
                                               "per_device_train_batch_size": 8})
    # (the library as a command-line override of the config key, in YAML list form)
    pl = onyx(["plan", os.path.join(d, "cfg.yaml"), "--custom_op_libraries", f"[{lib}]"])
    if pl.returncode != 0:
        return False, f"plan exited {pl.returncode}: {last_line(pl)}"
    if "ScaledSwishGrad" not in pl.stdout:
        return False, "plan's op histogram has no com.example.ScaledSwishGrad"
    return True, (f"ops lists 3 com.example ops (2 with gradients); info, plan (override) ok; run logits "
                  f"max |d| {err:.1e} vs PyTorch")


def case_grad(ctx):
    lib = ctx.need_lib()
    data = make_data(6, 7)
    inp = os.path.join(ctx.tmp, "grad_in.safetensors")
    st_io.save(inp, {k: v.numpy() for k, v in data.items()})
    out = os.path.join(ctx.tmp, "grads.safetensors")
    p = onyx(["--custom-ops", lib, "grad", ctx.model, "--inputs", inp, "--output", out,
              "--loss", "loss"])
    if p.returncode != 0:
        return False, f"grad exited {p.returncode}: {last_line(p)}"
    got = st_io.load(out)
    net = Net().double()
    net.load_state_dict({k: v.double() for k, v in ctx.net.state_dict().items()})
    loss = net(data["x"].double(), data["labels"])[0]
    loss.backward()
    worst, name = abs(float(got["loss"]) - loss.item()), "loss"
    for n, prm in net.named_parameters():
        if n not in got:
            return False, f"no gradient for {n} in {sorted(got)}"
        err = float(np.max(np.abs(got[n].astype(np.float64) - prm.grad.numpy())))
        if err > worst:
            worst, name = err, n
    if worst > 1e-5:
        return False, f"max abs error {worst:.2e} ({name}) over 1e-5"
    return True, f"loss and {len(list(net.parameters()))} gradients: max abs error {worst:.1e} ({name})"


def case_train(ctx):
    lib = ctx.need_lib()
    d = os.path.join(ctx.tmp, "train")
    os.makedirs(d)
    shutil.copy(lib, os.path.join(d, "libmyops.so"))  # custom_op_libraries is relative to the config
    data = make_data(32, 11)
    st_io.save(os.path.join(d, "train.safetensors"), {k: v.numpy() for k, v in data.items()})
    o = {"learning_rate": 1e-2, "train_sampling_strategy": "sequential", "logging_steps": 1,
         "weight_decay": 0.01, "warmup_steps": 2, "lr_scheduler_type": "linear",
         "max_grad_norm": 1.0, "per_device_train_batch_size": 8, "max_steps": 12,
         "save_strategy": "no", "optim": "adamw_fused", "disable_tqdm": True}
    cfg = {"model": ctx.model, "custom_op_libraries": ["libmyops.so"], "loss": "loss",
           "train_data": "train.safetensors", "output_dir": os.path.join(d, "out")}
    cfg.update(o)
    write_config(os.path.join(d, "cfg.yaml"), cfg)
    p = onyx(["train", os.path.join(d, "cfg.yaml")])
    if p.returncode != 0:
        return False, f"train exited {p.returncode}: {last_line(p)}"
    with open(os.path.join(cfg["output_dir"], "log_history.jsonl")) as f:
        log = [e for e in map(json.loads, f) if "loss" in e]
    ref = torch_train(ctx.net, data, o)
    if [e["step"] for e in log] != list(range(1, o["max_steps"] + 1)):
        return False, f"logged steps {[e['step'] for e in log]}"
    tol = {"loss": 1e-4, "grad_norm": 1e-4, "learning_rate": 1e-12}
    worst = {k: 0.0 for k in tol}
    bad = []
    for e, r in zip(log, ref):
        for k in tol:
            err = rel(e[k], r[k]) if r[k] != 0 else abs(e[k])
            worst[k] = max(worst[k], err)
            if err > tol[k] and len(bad) < 4:
                bad.append(f"step {e['step']} {k} onyx {e[k]!r} torch {r[k]!r}")
    first, last = (np.mean([e["loss"] for e in log[i:i + 4]]) for i in (0, len(log) - 4))
    ctx.trained_out = cfg["output_dir"]
    msg = (f"{len(log)} steps, epoch-mean loss {first:.4f} -> {last:.4f}; max rel err "
           f"loss {worst['loss']:.1e}, grad_norm {worst['grad_norm']:.1e}, lr {worst['learning_rate']:.1e}")
    if bad:
        return False, msg + "; over tolerance: " + "; ".join(bad)
    return True, msg


def case_export(ctx):
    lib = ctx.need_lib()
    if not getattr(ctx, "trained_out", None):
        raise Skip("no trained output (see train-adamw-parity)")
    exp = os.path.join(ctx.tmp, "exported.onnx")
    p = onyx(["--custom-ops", lib, "export", ctx.trained_out, "--output", exp])
    if p.returncode != 0:
        return False, f"export exited {p.returncode}: {last_line(p)}"
    import onnx
    m = onnx.load(exp)
    ops = sorted({f"{n.domain}.{n.op_type}" for n in m.graph.node if n.domain})
    opsets = {o.domain: o.version for o in m.opset_import}
    if ops != ["com.example.ScaledSwish", "com.example.SquaredReLU"] or opsets.get("com.example") != 1:
        return False, f"exported custom ops {ops}, opsets {opsets}"
    data = make_data(5, 21)
    inp = os.path.join(ctx.tmp, "exp_in.safetensors")
    st_io.save(inp, {"x": data["x"].numpy()})
    out = os.path.join(ctx.tmp, "exp_out.safetensors")
    r = onyx(["--custom-ops", lib, "run", exp, "--inputs", inp, "--output", out])
    if r.returncode != 0:
        return False, f"run of the export exited {r.returncode}: {last_line(r)}"
    net = Net().double()
    w = st_io.load(os.path.join(ctx.trained_out, "model.safetensors"))
    net.load_state_dict({k: torch.from_numpy(np.asarray(v, dtype=np.float64)) for k, v in w.items()})
    with torch.no_grad():
        ref = net(data["x"].double(), data["labels"])[1].numpy()
    err = float(np.max(np.abs(st_io.load(out)["logits"] - ref)))
    if err > 1e-5:
        return False, f"exported model's logits differ from PyTorch with the trained weights by {err:.2e}"
    return True, (f"export keeps {ops} (opset com.example=1, loss removed); its logits match PyTorch "
                  f"with the trained weights (max |d| {err:.1e})")


VARIANT_HEAD = """#include <onyx/custom_op.h>
#include <string.h>
static inline int copy_in(OnyxKernelContext* c) {
  memcpy(c->outputs[0].data, c->inputs[0].data, (size_t)c->inputs[0].numel * 4);
  return ONYX_OK;
}
static inline OnyxCustomOp identity_op(const char* domain, const char* name) {
  OnyxCustomOp op;
  memset(&op, 0, sizeof op);
  op.api_version = ONYX_CUSTOM_OP_API_VERSION;
  op.domain = domain;
  op.name = name;
  op.min_inputs = op.max_inputs = 1;
  op.min_outputs = op.max_outputs = 1;
  op.compute = copy_in;
  return op;
}
"""

VARIANTS = {
    # an entry point under another name only
    "noentry": ("c", VARIANT_HEAD + """
ONYX_CUSTOM_OP_EXPORT int register_ops(const OnyxCustomOpApi* api) { (void)api; return 0; }
"""),
    # an op stamped with a future API version
    "version2": ("c", VARIANT_HEAD + """
ONYX_CUSTOM_OP_EXPORT int onyx_register_custom_ops(const OnyxCustomOpApi* api) {
  OnyxCustomOp op = identity_op("com.test", "Copy");
  op.api_version = 2;
  return api->register_op(api->registrar, &op);
}
"""),
    # a library that only works with API version 2
    "wants2": ("c", VARIANT_HEAD + """
ONYX_CUSTOM_OP_EXPORT int onyx_register_custom_ops(const OnyxCustomOpApi* api) {
  if (api->version != 2) {
    api->set_error(api->registrar, "libwants2 needs custom-op API version 2");
    return ONYX_ERR_API_VERSION;
  }
  return ONYX_OK;
}
"""),
    # a gradient rule that refers to a value nobody defines
    "badrule": ("cc", VARIANT_HEAD + """
static const char* const kIn[] = {"GO0", "nothing"};
static const OnyxGradNode kNodes[] = {{"Mul", nullptr, kIn, 2, "g", nullptr, 0}};
static const OnyxGradRule kRules[] = {{0, kNodes, 1, "g"}};
extern "C" ONYX_CUSTOM_OP_EXPORT int onyx_register_custom_ops(const OnyxCustomOpApi* api) {
  OnyxCustomOp op = identity_op("com.test", "BadRule");
  op.grad_rules = kRules;
  op.num_grad_rules = 1;
  return api->register_op(api->registrar, &op);
}
"""),
}


def error_cases(ctx):
    """(name, ok, message) per case."""
    tmp = os.path.join(ctx.tmp, "errors")
    os.makedirs(tmp)
    libs = {name: compile_variant(tmp, name, src, lang) for name, (lang, src) in VARIANTS.items()}
    notlib = os.path.join(tmp, "libtext.so")
    with open(notlib, "w") as f:
        f.write("not an ELF file\n")
    cases = [
        ("error-missing-library", ["--custom-ops", os.path.join(tmp, "libnope.so"), "ops"],
         [r"custom-op library '.*libnope\.so' does not exist"]),
        ("error-not-a-library", ["--custom-ops", notlib, "ops"],
         [r"libtext\.so' cannot be loaded"]),
        ("error-no-entry-point", ["--custom-ops", libs["noentry"], "ops"],
         [r"libnoentry\.so' does not export onyx_register_custom_ops"]),
        ("error-op-api-version", ["--custom-ops", libs["version2"], "ops"],
         [r"libversion2\.so'", r"API version 2", r"implements version 1"]),
        ("error-library-refuses-version", ["--custom-ops", libs["wants2"], "ops"],
         [r"libwants2\.so' does not support this onyx's custom-op API version 1",
          r"needs custom-op API version 2"]),
        ("error-bad-gradient-rule", ["--custom-ops", libs["badrule"], "ops"],
         [r"libbadrule\.so'", r"com\.test\.BadRule", r"'nothing'"]),
    ]
    if ctx.lib:
        twin = os.path.join(tmp, "libmyops_copy.so")
        shutil.copy(ctx.lib, twin)
        cases.append(("error-op-registered-twice", ["--custom-ops", f"{ctx.lib},{twin}", "ops"],
                      [r"libmyops_copy\.so'", r"com\.example\.ScaledSwish' is already registered "
                       r"\(by library '.*myops-build/libmyops\.so'\)"]))
    if getattr(ctx, "trained_out", None):
        cases.append(("error-export-without-library",
                      ["export", ctx.trained_out, "--output", os.path.join(tmp, "e.onnx")],
                      [r"com\.example\.ScaledSwish", r"not a standard ONNX op \(nor a custom op"]))
    # the model without its library
    data = make_data(8, 5)
    inp = os.path.join(tmp, "in.safetensors")
    st_io.save(inp, {k: v.numpy() for k, v in data.items()})
    cases.append(("error-unregistered-op-run",
                  ["run", ctx.model, "--inputs", inp, "--output", os.path.join(tmp, "o.safetensors")],
                  [r"com\.example\.ScaledSwish"]))
    st_io.save(os.path.join(tmp, "train.safetensors"), {k: v.numpy() for k, v in data.items()})
    base = {"model": ctx.model, "loss": "loss", "train_data": "train.safetensors",
            "output_dir": os.path.join(tmp, "out"), "max_steps": 1, "save_strategy": "no"}
    write_config(os.path.join(tmp, "nolib.yaml"), base)
    cases.append(("error-unregistered-op-train", ["train", os.path.join(tmp, "nolib.yaml")],
                  [r"com\.example\.ScaledSwish"]))
    write_config(os.path.join(tmp, "missing.yaml"), dict(base, custom_op_libraries=["libgone.so"]))
    cases.append(("error-config-missing-library", ["train", os.path.join(tmp, "missing.yaml")],
                  [r"missing\.yaml'", r"custom_op_libraries", r"libgone\.so"]))
    out = []
    for name, args, patterns in cases:
        p = onyx(args, timeout=120)
        err = p.stderr.strip()
        first = err.splitlines()[-1] if err else "(no stderr)"
        ok = "onyx: error:" in err
        missing = [pat for pat in patterns if not re.search(pat, err)]
        if p.returncode != 1:
            out.append((name, False, f"exit status {p.returncode}, want 1: {first}"))
        elif not ok or missing:
            out.append((name, False, f"message does not match {missing}: {first}"))
        else:
            out.append((name, True, first[:240]))
    return out


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
    tmp = tempfile.mkdtemp(prefix="onyx-test-custom-op-")
    t0 = time.time()
    try:
        ctx = Ctx(tmp)
        single = [
            ("build-example", lambda: case_build(ctx)),
            ("cli-sees-ops", lambda: case_cli_sees_ops(ctx)),
            ("grad-parity", lambda: case_grad(ctx)),
            ("train-adamw-parity", lambda: case_train(ctx)),
            ("export-run", lambda: case_export(ctx)),
        ]
        for name, fn in single:
            # the library is needed by every other case: build it whatever the filter
            if filt not in name and name != "build-example":
                continue
            try:
                ok, msg = fn()
                if filt in name:
                    report("PASS" if ok else "FAIL", name, msg)
            except Skip as e:
                report("SKIP", name, str(e))
            except Exception as e:
                report("FAIL", name, f"{type(e).__name__}: {e}")
        if not filt or filt.startswith("error"):
            try:
                for name, ok, msg in error_cases(ctx):
                    if filt in name:
                        report("PASS" if ok else "FAIL", name, msg)
            except Exception as e:
                report("FAIL", "error-setup", f"{type(e).__name__}: {e}")
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
