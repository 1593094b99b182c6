"""test_cli_errors.py — `onyx run` / `onyx info` on bad input, and `onyx check` / `onyx train` on
models that cannot be trained.

Every case must end with exit status exactly 1 (not a crash or a signal), stderr starting with
"onyx: error:", a message that names the problem (checked with case-insensitive regexes), and no
file created in the --output directory (neither the output nor a temporary left behind).

Coverage cases (`onyx check`, autodiff/coverage.h): onnx.helper models whose loss depends on a
parameter through an op onyx has no kernel for (one not listed by `onyx ops`) and through an op
with a kernel but no gradient rule, each alone and both together: `onyx check` exits 1 naming
every missing op and its node; `onyx train` on the same models exits 1 within seconds with the
same names, its output_dir (the case's output directory) left empty: no checkpoint, no
log_history.jsonl. The same no-rule op off the parameters' path (applied to an input), the
exported real model with an appended cross entropy, and a training config pass: exit 0, the
table on stdout and "N op types: all supported".

Run: ONYX=build/onyx build/venv/bin/python tests/cli/test_cli_errors.py
Prints one line per case and ends with "N passed, M failed"; exits 1 if any case failed.
"""
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import warnings

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "tests", "parity"))
import st_io  # noqa: E402

ONYX = os.environ.get("ONYX", os.path.join(REPO, "build", "onyx"))
warnings.filterwarnings("ignore")


def export_real_model(path):
    """A small real model exported by PyTorch: inputs input_ids [batch, seq] int64 and
    features [batch, seq, 8] float32; output logits [batch, seq, 4]."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(20, 8)
            self.ln = nn.LayerNorm(8)
            self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 4)

        def forward(self, input_ids, features):
            h = self.ln(self.emb(input_ids) + features)
            return self.fc2(F.gelu(self.fc1(h)))

    torch.manual_seed(0)
    dyn = {0: "batch", 1: "seq"}
    torch.onnx.export(Tiny().eval(), (torch.zeros(2, 5, dtype=torch.long), torch.zeros(2, 5, 8)),
                      path, input_names=["input_ids", "features"], output_names=["logits"],
                      dynamic_axes={"input_ids": dyn, "features": dyn, "logits": dyn},
                      opset_version=14, dynamo=False)


def good_inputs(b=2, t=5):
    rng = np.random.default_rng(0)
    return {"input_ids": rng.integers(0, 20, (b, t)).astype(np.int64),
            "features": rng.standard_normal((b, t, 8)).astype(np.float32)}


def helper_model(nodes, inputs, outputs, initializers=()):
    from onnx import helper
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 14)], ir_version=7)


def claimed_ops():
    """{op: has_gradient_rule} for the ai.onnx ops `onyx ops` lists."""
    p = subprocess.run([ONYX, "ops"], capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        raise RuntimeError(f"onyx ops failed: {p.stderr.strip()}")
    ops = {}
    for line in p.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 1 and "." not in parts[0] and not parts[0][0].isdigit():
            ops[parts[0]] = "(gradient)" in line
    return ops


def path_model(path, ops, off_path_op=None):
    """loss = ReduceSum(<ops...>(x * w) + b [+ <off_path_op>(x)]): the loss depends on the
    parameter w through every op of `ops` (unary float ops, node names given); off_path_op is
    applied to the input x only, so it needs no gradient."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(3)
    nodes = [helper.make_node("Mul", ["x", "w"], ["h0"], name="scale")]
    for i, (op, name) in enumerate(ops):
        nodes.append(helper.make_node(op, [f"h{i}"], [f"h{i + 1}"], name=name))
    last = f"h{len(ops)}"
    nodes.append(helper.make_node("Add", [last, "b"], ["shifted"], name="shift"))
    if off_path_op:
        nodes += [helper.make_node(off_path_op, ["x"], ["xq"], name="input_only"),
                  helper.make_node("Add", ["shifted", "xq"], ["summed"], name="plus_input")]
        last = "summed"
    else:
        last = "shifted"
    nodes.append(helper.make_node("ReduceSum", [last], ["loss"], name="total", keepdims=0))
    graph = helper.make_graph(
        nodes, "coverage",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
        initializer=[numpy_helper.from_array(rng.standard_normal((2, 3)).astype(np.float32), "w"),
                     numpy_helper.from_array(rng.standard_normal(3).astype(np.float32), "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)


def coverage_cases(tmp, real, write):
    """`onyx check` and `onyx train` on models with an op without a kernel / a gradient rule on
    the loss path (see the header); each case is (name, argv builder, regexes, options)."""
    ops = claimed_ops()
    # Unary float ops (no required attributes): the first one onyx does not claim, and the first
    # one with a kernel but no gradient rule (rules get added, so this is a list).
    no_kernel = next((op for op in ["Hardmax", "LpNormalization", "Det"] if op not in ops), None)
    no_rule = next((op for op in ["Floor", "Ceil", "Round", "Sign", "Softsign", "HardSigmoid",
                                  "HardSwish", "Celu", "ThresholdedRelu", "Shrink"]
                    if op in ops and not ops[op]), None)
    if no_kernel is None or no_rule is None:
        raise RuntimeError("no candidate op left without a kernel / without a gradient rule: "
                           "extend the lists in coverage_cases")
    models = {
        "nokernel": [(no_kernel, "my_unclaimed")],
        "norule": [(no_rule, "quantize")],
        "both": [(no_rule, "quantize"), (no_kernel, "my_unclaimed")],
    }
    paths = {}
    for k, chain in models.items():
        paths[k] = os.path.join(tmp, f"cov_{k}.onnx")
        path_model(paths[k], chain)
    paths["offpath"] = os.path.join(tmp, "cov_offpath.onnx")
    path_model(paths["offpath"], [("Relu", "act")], off_path_op=no_rule)
    data = os.path.join(tmp, "cov_x.safetensors")
    st_io.save(data, {"x": np.random.default_rng(0).standard_normal((64, 3)).astype(np.float32)})

    kernel_re = [rf"forward kernel for '{no_kernel}'", r"my_unclaimed"]
    rule_re = [rf"gradient for '{no_rule}'", r"'quantize'"]
    both_re = kernel_re + rule_re + [rf"gradient for '{no_kernel}'"]

    def check_argv(model, *extra):
        return lambda d, out: ["check", model, *extra]

    def train_argv(model):
        def argv(d, out):
            cfg = (f"model: {model}\nloss: loss\ntrain_data: {data}\noutput_dir: {os.path.dirname(out)}\n"
                   "max_steps: 1000\nper_device_train_batch_size: 2\nlogging_steps: 1\n"
                   "save_steps: 1\nreport_to: tensorboard\ndisable_tqdm: true\n")
            return ["train", write(d, "train.yaml", cfg.encode())]
        return argv

    fast = {"max_s": 10}
    cases = [
        (f"check: {no_kernel} (no kernel) on the loss path", check_argv(paths["nokernel"]),
         kernel_re, {"stdout": [rf"{no_kernel}\s+ai\.onnx\s+17\s+1\s+NO"]}),
        (f"check: {no_rule} (kernel, no gradient rule) on the loss path", check_argv(paths["norule"]),
         rule_re, {"stdout": [rf"{no_rule}\s+ai\.onnx\s+17\s+1\s+yes\s+NO"]}),
        (f"check: {no_kernel} and {no_rule} named at once", check_argv(paths["both"]), both_re, {}),
        ("check: --loss that is not an output", check_argv(paths["norule"], "--loss", "nope"),
         [r"'nope'", r"not an output"], {}),
        (f"train: {no_rule} without a gradient rule fails before step 1", train_argv(paths["norule"]),
         [r"cannot be trained"] + rule_re, fast),
        (f"train: {no_kernel} and {no_rule} fail before step 1, both named", train_argv(paths["both"]),
         [r"cannot be trained"] + both_re, fast),
        (f"check: {no_rule} applied to an input only (not needed) passes",
         check_argv(paths["offpath"]), [r"op types: all supported"],
         {"rc": 0, "stdout": [rf"{no_rule}\s+ai\.onnx\s+17\s+1\s+yes\s+not needed",
                              r"Relu\s+ai\.onnx\s+17\s+1\s+yes\s+yes",
                              r"^op\s+domain\s+opset\s+count\s+forward\s+gradient",
                              r"^\d+ op types: all supported$"]}),
        ("check: the exported real model with --logits/--labels passes",
         check_argv(real, "--logits", "logits", "--labels", "labels"), [],
         {"rc": 0, "stdout": [r"SoftmaxCrossEntropyLoss\s+ai\.onnx\s+14\s+1\s+yes\s+yes",
                              r"Gather\s+ai\.onnx\s+14\s+\d+\s+yes\s+yes",
                              r"^\d+ op types: all supported$"]}),
        ("check: a training config passes",
         lambda d, out: ["check", write(d, "ok.yaml", (
             f"model: {paths['offpath']}\nloss: loss\ntrain_data: {data}\n"
             f"output_dir: {os.path.dirname(out)}\n").encode())],
         [], {"rc": 0, "stdout": [r"trainable parameters? \(9 elements\)",
                                  r"^\d+ op types: all supported$"]}),
    ]
    return cases


def build_cases(tmp):
    """Returns a list of (name, argv builder, [regexes]); builders get (case_dir, out_path)."""
    import onnx
    from onnx import TensorProto, helper

    real = os.path.join(tmp, "real.onnx")
    export_real_model(real)
    real_bytes = open(real, "rb").read()
    good_in = os.path.join(tmp, "good.safetensors")
    st_io.save(good_in, good_inputs())

    # Sanity: the good model and inputs run (otherwise every case below proves nothing).
    probe = os.path.join(tmp, "probe.safetensors")
    p = subprocess.run([ONYX, "run", real, "--inputs", good_in, "--output", probe],
                       capture_output=True, text=True, timeout=120)
    if p.returncode != 0 or not os.path.exists(probe):
        raise RuntimeError(f"the valid model does not run: rc={p.returncode} {p.stderr.strip()}")
    os.remove(probe)

    cases = []

    def write(d, name, data):
        path = os.path.join(d, name)
        with open(path, "wb") as f:
            f.write(data)
        return path

    def run_model_bytes(data, fname="model.onnx", inputs=None):
        def argv(d, out):
            m = write(d, fname, data)
            return ["run", m, "--inputs", inputs or good_in, "--output", out]
        return argv

    def run_inputs_bytes(data, model=real, fname="in.safetensors"):
        def argv(d, out):
            i = write(d, fname, data)
            return ["run", model, "--inputs", i, "--output", out]
        return argv

    def not_onnx(data):
        try:
            onnx.load_model_from_string(data)
        except Exception:
            return True
        return False

    # --- .onnx files that are not models ------------------------------------------------------
    n = len(real_bytes)
    for cut in sorted({1, 7, 40, n // 4, n // 2, (3 * n) // 4, n - 1}):
        data = real_bytes[:cut]
        assert not_onnx(data), f"truncation at {cut} still parses as ONNX; pick another point"
        cases.append((f"truncated .onnx ({cut} of {n} bytes)",
                      run_model_bytes(data, "trunc.onnx"), [r"trunc\.onnx", r"truncated|pars|valid"]))
    rnd = random.Random(7)
    for k, size in enumerate((64, 4096)):
        data = bytes(rnd.getrandbits(8) for _ in range(size))
        if not_onnx(data):
            cases.append((f"random bytes as .onnx ({size} bytes)",
                          run_model_bytes(data, f"random{k}.onnx"),
                          [rf"random{k}\.onnx", r"pars|valid|not .*onnx"]))
    cases.append(("empty .onnx file", run_model_bytes(b"", "empty.onnx"),
                  [r"empty\.onnx", r"empty|no graph|not .*onnx|valid"]))
    cases.append(("missing .onnx file",
                  lambda d, out: ["run", os.path.join(d, "nope.onnx"), "--inputs", good_in,
                                  "--output", out],
                  [r"nope\.onnx", r"cannot open|no such|not found|does not exist"]))
    cases.append(("a model where a config belongs (plan)",
                  lambda d, out: ["plan", real],
                  [r"real\.onnx", r"is a model, not a config", r"model: "]))
    cases.append(("info on truncated .onnx",
                  lambda d, out: ["info", write(d, "t.onnx", real_bytes[: n // 2])],
                  [r"t\.onnx", r"truncated|pars|valid"]))

    # --- bad safetensors input files ----------------------------------------------------------
    good_st = open(good_in, "rb").read()
    hlen = int.from_bytes(good_st[:8], "little")
    cases.append(("empty .safetensors file", run_inputs_bytes(b"", fname="empty.safetensors"),
                  [r"empty\.safetensors", r"empty|short"]))
    # cut inside the length prefix, inside the JSON header, inside the first tensor, in the last
    for cut in (4, 8 + hlen // 2, 8 + hlen + 10, len(good_st) - 1):
        cases.append((f"truncated .safetensors ({cut} of {len(good_st)} bytes)",
                      run_inputs_bytes(good_st[:cut], fname="trunc.safetensors"),
                      [r"trunc\.safetensors", r"truncated|too short|past the end|outside"]))
    cases.append(("missing .safetensors file",
                  lambda d, out: ["run", real, "--inputs", os.path.join(d, "nope.safetensors"),
                                  "--output", out],
                  [r"nope\.safetensors", r"cannot open|no such|not found|does not exist"]))
    cases.append(("safetensors header length beyond 100 MB",
                  run_inputs_bytes((1 << 40).to_bytes(8, "little") + b"{}      ",
                                   fname="huge.safetensors"),
                  [r"huge\.safetensors", r"header"]))
    cases.append(("safetensors header not JSON",
                  run_inputs_bytes((8).to_bytes(8, "little") + b"{nope!! ", fname="nj.safetensors"),
                  [r"nj\.safetensors", r"json"]))
    bad_off = st_io.encode(good_inputs()).replace(b'"data_offsets":[0,', b'"data_offsets":[9,', 1)
    cases.append(("safetensors data_offsets inconsistent with shape",
                  run_inputs_bytes(bad_off, fname="off.safetensors"),
                  [r"off\.safetensors", r"input_ids|features"]))
    cases.append(("safetensors unknown dtype code",
                  run_inputs_bytes(st_io.encode(good_inputs(), dtype_override={"features": "Q7"}),
                                   fname="dt.safetensors"),
                  [r"features", r"Q7|dtype"]))

    # --- inputs that do not fit the model -----------------------------------------------------
    def inputs_case(tensors, model=real):
        return run_inputs_bytes(st_io.encode(tensors), model=model)

    gi = good_inputs()
    cases.append(("input with wrong dtype (input_ids as F32)",
                  inputs_case({**gi, "input_ids": gi["input_ids"].astype(np.float32)}),
                  [r"input_ids", r"int64|i64"]))
    cases.append(("input with wrong dtype (features as F64)",
                  inputs_case({**gi, "features": gi["features"].astype(np.float64)}),
                  [r"features", r"float64|f64|double"]))
    cases.append(("input with wrong shape (features last dim 7, model says 8)",
                  inputs_case({**gi, "features": gi["features"][:, :, :7].copy()}),
                  [r"features", r"shape"]))
    cases.append(("input with wrong rank (input_ids [2,5,1])",
                  inputs_case({**gi, "input_ids": gi["input_ids"][..., None].copy()}),
                  [r"input_ids", r"shape|rank"]))
    cases.append(("missing input (features)",
                  inputs_case({"input_ids": gi["input_ids"]}), [r"features", r"missing"]))
    cases.append(("extra unknown input name",
                  inputs_case({**gi, "bogus_input": np.zeros(3, np.float32)}),
                  [r"bogus_input", r"not an input|unknown|unexpected"]))
    cases.append(("inconsistent dynamic dims (seq 5 vs 4)",
                  inputs_case({**gi, "features": gi["features"][:, :4].copy()}),
                  [r"shape|broadcast|seq|dim"]))
    cases.append(("token id out of range for the embedding (Gather)",
                  inputs_case({**gi, "input_ids": np.full((2, 5), 1000, np.int64)}),
                  [r"gather", r"1000|range|bound"]))

    # --- models that are valid protobuf but not runnable --------------------------------------
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    xin = st_io.encode({"x": np.ones((2, 3), np.float32)})
    m = helper_model([helper.make_node("Relu", ["x"], ["h"], name="ok_relu"),
                      helper.make_node("FooBar", ["h"], ["y"], name="my_foobar_node")], [x], [y])
    cases.append(("model with unknown op FooBar",
                  lambda d, out, m=m: ["run", write(d, "foobar.onnx", m.SerializeToString()),
                                       "--inputs", write(d, "x.safetensors", xin), "--output", out],
                  [r"FooBar", r"my_foobar_node"]))
    m = helper_model([helper.make_node("Add", ["x", "nowhere_value"], ["y"], name="add_node")],
                     [x], [y])
    cases.append(("node input references an undefined value",
                  lambda d, out, m=m: ["run", write(d, "undef.onnx", m.SerializeToString()),
                                       "--inputs", write(d, "x.safetensors", xin), "--output", out],
                  [r"nowhere_value"]))
    m = helper_model([helper.make_node("Relu", ["x"], ["h"], name="r")], [x], [y])
    cases.append(("graph output never produced",
                  lambda d, out, m=m: ["run", write(d, "noout.onnx", m.SerializeToString()),
                                       "--inputs", write(d, "x.safetensors", xin), "--output", out],
                  [r"'y'|\by\b"]))

    # --- ops without a kernel or a gradient rule: `onyx check`, and `onyx train` before step 1 ---
    cases += coverage_cases(tmp, real, write)

    # --- output that cannot be written --------------------------------------------------------
    cases.append(("--output in a directory that does not exist",
                  lambda d, out: ["run", real, "--inputs", good_in, "--output",
                                  os.path.join(d, "no_such_dir", "o.safetensors")],
                  [r"no_such_dir"]))
    return cases


def check(case_dir, out_dir, argv, patterns, opts=None):
    """opts: rc (expected exit status, default 1), stdout (regexes, multiline), max_s (seconds)."""
    opts = opts or {}
    want_rc = opts.get("rc", 1)
    out = os.path.join(out_dir, "out.safetensors")
    args = [ONYX] + argv(case_dir, out)
    t0 = time.monotonic()
    try:
        p = subprocess.run(args, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return False, "timed out after 120 s"
    elapsed = time.monotonic() - t0
    err = p.stderr.strip()
    first = err.splitlines()[0] if err else "(empty stderr)"
    problems = []
    if p.returncode != want_rc:
        how = f"killed by signal {-p.returncode}" if p.returncode < 0 else f"exit {p.returncode}"
        problems.append(f"expected exit {want_rc}, got {how}")
    if want_rc == 1 and not p.stderr.startswith("onyx: error:"):
        problems.append("stderr does not start with 'onyx: error:'")
    text = err if want_rc == 1 else p.stdout
    for pat in patterns:
        if not re.search(pat, text, re.IGNORECASE):
            problems.append(f"message lacks /{pat}/")
    for pat in opts.get("stdout", []):
        if not re.search(pat, p.stdout, re.MULTILINE):
            problems.append(f"stdout lacks /{pat}/")
    if "max_s" in opts and elapsed > opts["max_s"]:
        problems.append(f"took {elapsed:.1f} s (more than {opts['max_s']} s)")
    left = os.listdir(out_dir)
    if left:
        problems.append(f"left files in the output directory: {left}")
    if os.path.isdir(os.path.join(case_dir, "no_such_dir")):
        problems.append("created the missing output directory")
    if problems:
        shown = first if want_rc == 1 else (err or p.stdout.strip())[-300:]
        return False, "; ".join(problems) + f" — stderr: {shown[:300]}"
    if want_rc != 1:
        lines = p.stdout.strip().splitlines()
        return True, f"exit {p.returncode}: {lines[-1][:200] if lines else ''}"
    return True, first[:200] + (f" ({elapsed:.2f} s)" if "max_s" in opts else "")


def main():
    if not (os.path.isfile(ONYX) and os.access(ONYX, os.X_OK)):
        print(f"FAIL setup: onyx binary not found at {ONYX} (set ONYX=...)")
        print("0 passed, 1 failed")
        return 1
    tmp = tempfile.mkdtemp(prefix="onyx-cli-")
    passed = failed = 0
    try:
        try:
            cases = build_cases(tmp)
        except Exception as e:
            print(f"FAIL setup: {type(e).__name__}: {e}")
            print("0 passed, 1 failed")
            return 1
        for i, (name, argv, patterns, *opts) in enumerate(cases):
            case_dir = os.path.join(tmp, f"case{i}")
            out_dir = os.path.join(case_dir, "out")
            os.makedirs(out_dir)
            try:
                ok, msg = check(case_dir, out_dir, argv, patterns, *opts)
            except Exception as e:
                ok, msg = False, f"{type(e).__name__}: {e}"
            print(f"{'PASS' if ok else 'FAIL'} {name}: {msg}", flush=True)
            passed += ok
            failed += not ok
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
