"""test_grad_parity.py — loss and gradient parity between PyTorch's backward() and `onyx grad`.

Models (models.py, random init, fixed seeds, dropout p=0 unless said), each exported with
torch.onnx.export in training mode without constant folding, by the TorchScript exporter at opset 14 and
opset 17 and by the dynamo exporter at its default opset (tests/parity/exporters.py), with
dynamic batch / sequence axes:
  mlp-mse        MLP (softmax output) with an MSE loss computed inside the model (scalar output)
  mlp-mse-app    the same MLP exported logits-only; onyx appends the loss (--loss-type mse)
  mlp-ce-app     the MLP's pre-softmax logits; onyx appends cross entropy (one label = -100)
  bert-cls       BERT-like post-LN encoder, sequence-classification cross entropy inside the model
                 (outputs loss and logits; --loss loss), padded attention mask
  bert-nodrop    the same with dropout p=0.1 in the export, run with --no-dropout, against
                 PyTorch with dropout off (eval mode)
  gpt2-lm        GPT-2-like pre-LN causal LM, tied embeddings, shifted LM cross entropy inside the
                 model, some labels = -100
  gpt2-logits    the same LM exported logits-only; onyx appends cross entropy (--logits logits
                 --labels labels), some labels = -100
  gpt2-smooth    as gpt2-logits with --label-smoothing 0.1, against
                 F.cross_entropy(label_smoothing=0.1, ignore_index=-100)
  gpt2-frozen    as gpt2-logits with --frozen: frozen parameters must get no gradient entry, and
                 the rest must match PyTorch with those parameters' requires_grad off
  vit-cls        ViT-like encoder (Conv patches, cls token, pos embedding), classification CE
  einsum-scatter torch.einsum (batched matmul, three operands, ellipsis, a batch diagonal), the
                 trigonometric / hyperbolic functions and their inverses (Tan ... Atanh), tensor.scatter
                 (ScatterElements), index_put (ScatterND; with accumulate=True, reduction add in the
                 dynamo export) and advanced indexing (GatherND in the dynamo export); static shapes.
                 The TorchScript exporter has no symbolic for sinh / cosh / asinh / acosh / atanh: the
                 test registers one each, emitting the standard ONNX op (opset 9)
and one error case:
  no-rule        an onnx.helper graph whose loss depends on a parameter through a float op that
                 onyx runs forward but cannot differentiate (Floor; Ceil / Round if Floor gains a
                 rule): `onyx grad` must exit 1 with a message naming the op and the node, and
                 write nothing (the check happens before any step runs).

Every parameter gradient (ONNX initializer name = PyTorch parameter name; tied weights appear
once) and the loss must match PyTorch float32 within rtol 1e-4, atol 1e-6 (numpy.allclose's
criterion). The relative error reported for an element is |onyx - torch| / (|torch| + atol/rtol),
so a case passes exactly when its maximum is <= 1e-4. On a failure the line also gives both
implementations' errors against a float64 PyTorch reference, to tell float32 accumulation-order
noise from a wrong gradient.

Run: ONYX=build/onyx build/venv/bin/python tests/parity/test_grad_parity.py [substring-filter]
Prints one line per case and ends with "N passed, M failed" (", K skipped" when some were);
exits 1 if any case failed.
"""
import copy
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
from exporters import VARIANTS, export  # noqa: E402
from models import TinyBert, TinyGpt2, TinyMlp, TinyVit  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ONYX = os.environ.get("ONYX", os.path.join(REPO, "build", "onyx"))
RTOL, ATOL = 1e-4, 1e-6

warnings.filterwarnings("ignore")
torch.set_num_threads(1)


# ----------------------------------------------------------------------------------------------
# Exported modules: forward(*inputs) -> graph outputs. `loss_fn(outputs, inputs)` computes the
# reference loss in PyTorch for the cases where onyx appends the loss itself.


class MlpMse(nn.Module):  # loss inside the model
    def __init__(self):
        super().__init__()
        self.mlp = TinyMlp()

    def forward(self, x, target):  # F.mse_loss has no ONNX export in torch 1.13
        d = self.mlp(x) - target
        return (d * d).mean()


class MlpProbs(nn.Module):  # softmax output only; onyx appends MSE
    def __init__(self):
        super().__init__()
        self.mlp = TinyMlp()

    def forward(self, x):
        return self.mlp(x)


class MlpLogits(nn.Module):  # pre-softmax logits only; onyx appends cross entropy
    def __init__(self):
        super().__init__()
        self.mlp = TinyMlp()

    def forward(self, x):
        return self.mlp.net(x)


class BertCls(nn.Module):
    def __init__(self, dropout=0.0):
        super().__init__()
        self.bert = TinyBert(dropout=dropout)

    def forward(self, input_ids, attention_mask, token_type_ids, labels):
        logits, _ = self.bert(input_ids, attention_mask, token_type_ids)
        return F.cross_entropy(logits, labels), logits


class Gpt2Lm(nn.Module):  # Transformers-style shifted LM loss
    def __init__(self):
        super().__init__()
        self.gpt = TinyGpt2()

    def forward(self, input_ids, labels):
        logits = self.gpt(input_ids)
        v = logits.size(-1)
        return F.cross_entropy(logits[:, :-1, :].reshape(-1, v), labels[:, 1:].reshape(-1),
                               ignore_index=-100)


class VitCls(nn.Module):
    def __init__(self):
        super().__init__()
        self.vit = TinyVit()

    def forward(self, pixel_values, labels):
        return F.cross_entropy(self.vit(pixel_values), labels)


# TorchScript export of the hyperbolic functions (dynamo exports them already): the ONNX op itself.
for _op in ["sinh", "cosh", "asinh", "acosh", "atanh"]:
    torch.onnx.register_custom_op_symbolic(
        f"aten::{_op}", (lambda name: lambda g, x: g.op(name, x))(_op.capitalize()), 9)


class EinsumScatter(nn.Module):
    """Einsum, trig / hyperbolic ops and scatters on the path from every parameter to an MSE loss."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 6) * 0.3)
        self.q = nn.Parameter(torch.randn(6, 6) * 0.3)
        self.u = nn.Parameter(torch.randn(6) * 0.5)
        self.table = nn.Parameter(torch.randn(5, 6) * 0.5)
        self.src = nn.Parameter(torch.randn(2, 3) * 0.5)
        self.head = nn.Linear(6, 3)

    def forward(self, x, col_idx, rows, target):
        h = torch.einsum("btd,de->bte", x, self.w)  # a batched matmul
        t = torch.tanh(h)  # |t| < 1 for the inverse functions' domains
        h = (torch.atan(h) + torch.asinh(h) + torch.sinh(0.5 * h) + torch.cosh(0.3 * h)
             + torch.asin(0.9 * t) + torch.acos(0.8 * t) + torch.atanh(0.7 * t)
             + torch.tan(0.4 * t) + torch.acosh(1.5 + h * h))
        h = 0.1 * h
        s = torch.einsum("bte,ef,bsf->bts", h, self.q, h)  # three operands
        h = (torch.einsum("bts,bse->bte", torch.softmax(s, -1), h)
             + torch.einsum("...e,e->...", h, self.u).unsqueeze(-1))  # ellipsis
        d = torch.einsum("bii->bi", torch.einsum("bte,bse->bts", h, h))  # a diagonal
        tab = self.table.scatter(1, col_idx, self.src * 2.0)  # ScatterElements
        tab = tab.index_put((rows,), h[0, : rows.size(0)])  # ScatterND
        tab = tab.index_put((rows,), h[1, : rows.size(0)], accumulate=True)
        picked = h[rows % 2, rows % 4]  # GatherND (dynamo)
        pooled = h.mean(1) + tab.sum(0) + d.sum(-1, keepdim=True) + picked.sum(0)
        diff = self.head(pooled) - target
        return (diff * diff).mean()


def einsum_scatter_inputs(g):
    return {"x": torch.randn(2, 4, 8, generator=g),
            "col_idx": torch.tensor([[0, 3, 5], [4, 1, 2]]),  # unique per row: scatter, no reduction
            "rows": torch.tensor([4, 1]), "target": torch.randn(2, 3, generator=g)}


def ce_ref(smoothing=0.0):
    def f(outputs, inputs):
        logits = outputs[0]
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), inputs["labels"].reshape(-1),
                               ignore_index=-100, label_smoothing=smoothing)
    return f


def mse_ref(outputs, inputs):
    return F.mse_loss(outputs[0], inputs["labels"])


# ----------------------------------------------------------------------------------------------
# Inputs (one fixed set per model; torch tensors). Names match the exported input names; a name
# that is not a model input (labels for an appended loss) only goes to onyx's --inputs file.


def mlp_inputs(g, with_target=False, labels=None):
    d = {"x": torch.randn(6, 16, generator=g)}
    if with_target:
        d["target"] = torch.softmax(torch.randn(6, 5, generator=g), -1)
    if labels == "float":
        d["labels"] = torch.softmax(torch.randn(6, 5, generator=g), -1)
    elif labels == "class":
        d["labels"] = torch.tensor([0, 4, -100, 2, 1, 3])
    return d


def bert_inputs(g):
    b, t = 3, 9
    ids = torch.randint(0, 60, (b, t), generator=g)
    mask = torch.ones(b, t, dtype=torch.long)
    mask[1, 6:] = 0
    mask[2, 4:] = 0
    types = torch.zeros(b, t, dtype=torch.long)
    types[:, t // 2:] = 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types,
            "labels": torch.tensor([2, 0, 1])}


def gpt_inputs(g):
    b, t = 2, 11
    ids = torch.randint(0, 70, (b, t), generator=g)
    labels = ids.clone()
    labels[0, 7:] = -100  # padding
    labels[1, 2] = -100
    return {"input_ids": ids, "labels": labels}


def vit_inputs(g):
    return {"pixel_values": torch.randn(3, 1, 28, 28, generator=g),
            "labels": torch.tensor([7, 0, 3])}


BT = {0: "batch", 1: "seq"}
B = {0: "batch"}

# name: (module class, seed, inputs(gen), exported input names, output names, dynamic axes)
EXPORTS = {
    "mlp-mse": (MlpMse, 11, lambda g: mlp_inputs(g, with_target=True), ["x", "target"], ["loss"],
                {"x": B, "target": B}),
    "mlp-probs": (MlpProbs, 11, lambda g: mlp_inputs(g, labels="float"), ["x"], ["probs"],
                  {"x": B, "probs": B}),
    "mlp-logits": (MlpLogits, 11, lambda g: mlp_inputs(g, labels="class"), ["x"], ["logits"],
                   {"x": B, "logits": B}),
    "bert-cls": (BertCls, 12, bert_inputs,
                 ["input_ids", "attention_mask", "token_type_ids", "labels"], ["loss", "logits"],
                 {"input_ids": BT, "attention_mask": BT, "token_type_ids": BT, "labels": B,
                  "logits": B}),
    "bert-drop": (lambda: BertCls(dropout=0.1), 12, bert_inputs,
                  ["input_ids", "attention_mask", "token_type_ids", "labels"], ["loss", "logits"],
                  {"input_ids": BT, "attention_mask": BT, "token_type_ids": BT, "labels": B,
                   "logits": B}),
    "gpt2-lm": (Gpt2Lm, 13, gpt_inputs, ["input_ids", "labels"], ["loss"],
                {"input_ids": BT, "labels": BT}),
    "gpt2-logits": (lambda: TinyGpt2(), 13, gpt_inputs, ["input_ids"], ["logits"],
                    {"input_ids": BT, "logits": BT}),
    "vit-cls": (VitCls, 14, vit_inputs, ["pixel_values", "labels"], ["loss"],
                {"pixel_values": B, "labels": B}),
    "einsum-scatter": (EinsumScatter, 15, einsum_scatter_inputs,
                       ["x", "col_idx", "rows", "target"], ["loss"], {}),
}

GPT_FROZEN = ["wte.weight", "blocks.0.ln1.weight", "blocks.1.attn.q.bias"]

# case name: (export name, extra onyx args, reference loss fn (None: the model's first output),
#             frozen parameter names)
CASES = [
    ("mlp-mse", "mlp-mse", [], None, []),
    ("mlp-mse-app", "mlp-probs",
     ["--logits", "probs", "--labels", "labels", "--loss-type", "mse"], mse_ref, []),
    ("mlp-ce-app", "mlp-logits", ["--logits", "logits", "--labels", "labels"], ce_ref(), []),
    ("bert-cls", "bert-cls", ["--loss", "loss"], None, []),
    ("bert-nodrop", "bert-drop", ["--loss", "loss", "--no-dropout"], None, []),
    ("gpt2-lm", "gpt2-lm", [], None, []),
    ("gpt2-logits", "gpt2-logits", ["--logits", "logits", "--labels", "labels"], ce_ref(), []),
    ("gpt2-smooth", "gpt2-logits",
     ["--logits", "logits", "--labels", "labels", "--label-smoothing", "0.1"], ce_ref(0.1), []),
    ("gpt2-frozen", "gpt2-logits",
     ["--logits", "logits", "--labels", "labels", "--frozen", ",".join(GPT_FROZEN)], ce_ref(),
     GPT_FROZEN),
    ("vit-cls", "vit-cls", [], None, []),
    ("einsum-scatter", "einsum-scatter", [], None, []),
]


# ----------------------------------------------------------------------------------------------


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


def torch_reference(model, inputs, model_inputs, ref_loss, frozen, dtype, dropout):
    """Loss and {param name: grad} from PyTorch in `dtype` (float inputs cast to it), in training
    mode, or in eval mode (dropout off) when not `dropout`."""
    m = copy.deepcopy(model).to(dtype).train(dropout)
    cast = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in inputs.items()}
    for n, p in m.named_parameters():
        p.requires_grad_(n not in frozen)
        p.grad = None
    out = m(*[cast[k] for k in model_inputs])
    out = out if isinstance(out, tuple) else (out,)
    loss = out[0] if ref_loss is None else ref_loss(out, cast)
    loss.backward()
    grads = {n: p.grad.detach().numpy() for n, p in m.named_parameters() if n not in frozen}
    return loss.detach().numpy(), grads


def run_onyx(args):
    p = subprocess.run([ONYX] + args, capture_output=True, text=True, timeout=300)
    return p.returncode, p.stdout, p.stderr


def tied_names(model, path):
    """{PyTorch name (named_parameters' first name of a tensor): the name the export gave it}.
    A tied tensor has several module paths (wte.weight / lm_head.weight); the exporters pick
    different ones (TorchScript the first, dynamo the last), so names are translated through this."""
    import onnx
    inits = {i.name for i in onnx.load(path, load_external_data=False).graph.initializer}
    by_id = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        by_id.setdefault(id(p), []).append(n)
    out = {}
    for names in by_id.values():
        hit = [n for n in names if n in inits]
        out[names[0]] = hit[0] if hit else names[0]
    return out


def grad_case(tmp, name, label, path, model, inputs, model_inputs, extra, ref_loss, frozen):
    """Returns (ok, message)."""
    tag = f"{name}_{label}"
    in_path = os.path.join(tmp, tag + ".in.safetensors")
    out_path = os.path.join(tmp, tag + ".grads.safetensors")
    st_io.save(in_path, {k: v.numpy() for k, v in inputs.items()})
    to_onnx = tied_names(model, path)
    from_onnx = {v: k for k, v in to_onnx.items()}
    extra = [",".join(to_onnx.get(n, n) for n in a.split(",")) if i and extra[i - 1] == "--frozen"
             else a for i, a in enumerate(extra)]
    rc, out, err = run_onyx(["grad", path, "--inputs", in_path, "--output", out_path] + extra)
    if rc != 0:
        lines = (err.strip() or out.strip()).splitlines()
        return False, f"onyx exited {rc}: {lines[-1] if lines else '(no output)'}"
    got = {from_onnx.get(k, k): v for k, v in st_io.load(out_path).items()}
    dropout = "--no-dropout" not in extra
    loss32, ref32 = torch_reference(model, inputs, model_inputs, ref_loss, set(frozen),
                                    torch.float32, dropout)
    want = {"loss": loss32, **ref32}
    notes, ok = [], True
    missing = sorted(set(want) - set(got))
    extra_keys = sorted(set(got) - set(want))
    if missing:
        ok = False
        notes.append(f"missing from onyx output: {missing[:6]}{'...' if len(missing) > 6 else ''}")
    if extra_keys:
        ok = False
        what = "frozen parameters got gradients" if set(extra_keys) & set(frozen) else "unexpected"
        notes.append(f"{what}: {extra_keys[:6]}")
    if frozen:
        n_grads = f"; {len(want) - 1} gradients;"
        if n_grads not in out:
            ok = False
            notes.append(f"stdout does not report '{n_grads[2:-1]}': {out.strip()}")
    worst, worst_abs, worst_name, bad = 0.0, 0.0, "", []
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
    msg = f"max rel err {worst:.2e} ({worst_name}; max abs {worst_abs:.2e}), {len(got)} tensors"
    if bad:
        msg += f"; {len(bad)} over tolerance: " + ", ".join(bad[:4]) + (" ..." if len(bad) > 4
                                                                       else "")
        # float64 reference: is onyx further from the exact value than PyTorch float32 is?
        loss64, ref64 = torch_reference(model, inputs, model_inputs, ref_loss, set(frozen),
                                        torch.float64, dropout)
        exact = {"loss": loss64, **ref64}
        e_onyx = max(rel_err(got[k], exact[k])[1] for k in exact if k in got
                     and got[k].shape == exact[k].shape)
        e_torch = max(rel_err(want[k], exact[k])[1] for k in exact)
        msg += f"; vs float64: onyx {e_onyx:.2e}, torch-f32 {e_torch:.2e}"
    if notes:
        msg += "; " + "; ".join(notes)
    return ok, msg


def no_rule_model(path, op):
    """loss = ReduceSum(<op>(x * w) + b): the loss depends on w only through `op`."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(5)
    nodes = [
        helper.make_node("Mul", ["x", "w"], ["scaled"], name="scale"),
        helper.make_node(op, ["scaled"], ["quantized"], name="quantize"),
        helper.make_node("Add", ["quantized", "b"], ["shifted"], name="shift"),
        helper.make_node("ReduceSum", ["shifted"], ["loss"], name="total", keepdims=0),
    ]
    graph = helper.make_graph(
        nodes, "no_rule",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
        initializer=[numpy_helper.from_array(rng.standard_normal((2, 3)).astype(np.float32), "w"),
                     numpy_helper.from_array(rng.standard_normal(3).astype(np.float32), "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, path)


def no_rule_case(tmp):
    """Returns (status, message), status in PASS / FAIL / SKIP."""
    outdir = os.path.join(tmp, "no_rule_out")
    os.makedirs(outdir)
    in_path = os.path.join(tmp, "no_rule.in.safetensors")
    st_io.save(in_path, {"x": np.linspace(-2, 2, 6, dtype=np.float32).reshape(2, 3) * 3.3})
    have_rules = []
    for op in ["Floor", "Ceil", "Round"]:
        path = os.path.join(tmp, f"no_rule_{op}.onnx")
        no_rule_model(path, op)
        rc, out, err = run_onyx(["run", path, "--inputs", in_path, "--output",
                                 os.path.join(tmp, f"no_rule_{op}.fwd.safetensors")])
        if rc != 0:
            return "FAIL", f"forward of the {op} model failed (exit {rc}): {err.strip()[-300:]}"
        out_path = os.path.join(outdir, "grads.safetensors")
        rc, out, err = run_onyx(["grad", path, "--inputs", in_path, "--output", out_path])
        if rc == 0 and "no gradient rule" not in err:
            have_rules.append(op)  # a (zero) gradient rule exists for this op: try the next one
            os.remove(out_path)
            continue
        problems = []
        if rc != 1:
            problems.append(f"exit status {rc}, expected 1")
        first = err.strip().splitlines()[0] if err.strip() else ""
        if not first.startswith("onyx: error:"):
            problems.append(f"stderr does not start with 'onyx: error:': {err.strip()[:200]!r}")
        if "no gradient rule" not in err or f"'{op}'" not in err:
            problems.append(f"message does not say 'no gradient rule' for '{op}'")
        if "quantize" not in err:
            problems.append("message does not name the node 'quantize'")
        if os.listdir(outdir):
            problems.append(f"files written: {os.listdir(outdir)}")
        if "loss" in out:
            problems.append(f"a step ran (stdout: {out.strip()[:200]!r})")
        if problems:
            return "FAIL", f"{op}: " + "; ".join(problems)
        note = f" ({', '.join(have_rules)} now have rules)" if have_rules else ""
        return "PASS", f"{op}: exit 1, {first[:150]}{note}"
    return "SKIP", f"Floor, Ceil and Round all have gradient rules now: no op left to test with"


def main():
    filt = sys.argv[1] if len(sys.argv) > 1 else ""
    if not (os.path.isfile(ONYX) and os.access(ONYX, os.X_OK)):
        print(f"FAIL setup: onyx binary not found at {ONYX} (set ONYX=...)")
        print("0 passed, 1 failed")
        return 1
    t0 = time.time()
    tmp = tempfile.mkdtemp(prefix="onyx-grad-parity-")
    passed = failed = skipped = 0

    def report(status, case, msg):
        nonlocal passed, failed, skipped
        print(f"{status} {case}: {msg}", flush=True)
        passed += status == "PASS"
        failed += status == "FAIL"
        skipped += status == "SKIP"

    try:
        models, input_sets = {}, {}
        for ename, (ctor, seed, make, in_names, out_names, dyn) in EXPORTS.items():
            if not any(e == ename and filt in f"{c}/{v[0]}" for c, e, *_ in CASES
                       for v in VARIANTS):
                continue
            torch.manual_seed(seed)
            models[ename] = ctor()
            input_sets[ename] = make(torch.Generator().manual_seed(100 + seed))
        for label, exporter, opset, fold in VARIANTS:
            paths = {}
            for cname, ename, extra, ref_loss, frozen in CASES:
                case = f"{cname}/{label}"
                if filt not in case:
                    continue
                ctor, seed, make, in_names, out_names, dyn = EXPORTS[ename]
                model, inputs = models[ename], input_sets[ename]
                if ename not in paths:
                    path = os.path.join(tmp, f"{ename}_{label}.onnx")
                    try:
                        export(copy.deepcopy(model).train(), tuple(inputs[k] for k in in_names),
                               path, exporter=exporter, opset=opset, input_names=in_names,
                               output_names=out_names, dynamic_axes=dyn, training=True,
                               fold=False)
                        paths[ename] = path
                    except Exception as e:  # an export failure is this test's problem: report
                        paths[ename] = None
                        report("FAIL", case, f"torch.onnx.export failed: {e}")
                        continue
                if paths[ename] is None:
                    report("FAIL", case, "torch.onnx.export failed (see above)")
                    continue
                try:
                    ok, msg = grad_case(tmp, cname, label, paths[ename], model, inputs, in_names,
                                        extra, ref_loss, frozen)
                except Exception as e:
                    ok, msg = False, f"{type(e).__name__}: {e}"
                report("PASS" if ok else "FAIL", case, msg)
        if filt in "no-rule":
            try:
                status, msg = no_rule_case(tmp)
            except Exception as e:
                status, msg = "FAIL", f"{type(e).__name__}: {e}"
            report(status, "no-rule", msg)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"({time.time() - t0:.1f}s)")
    print(f"{passed} passed, {failed} failed" + (f", {skipped} skipped" if skipped else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
