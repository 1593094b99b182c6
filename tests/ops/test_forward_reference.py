"""test_forward_reference.py — the op table's forward mode against a float64 reference.

`onyx_tests --gtest_filter='Rows/OpForward.*'` with ONYX_OP_TABLE_DIR set writes every row of
tests/ops/cases_*.inc as a one-node model (<row>.onnx, the row's inputs as initializers) and onyx's
float32 outputs (<row>.safetensors: y0, y1, ...). Here each model is run again with its float32
initializers widened to float64 (except inputs the ONNX type constraints fix to float32, e.g.
Resize's scales) by the ONNX reference implementation (onnx.reference.ReferenceEvaluator, from the
pinned PyPI onnx), with NumPy float64 implementations of the onyx- and com.microsoft-domain ops
below (written here from the kernels' documented semantics); a row with a fusion pattern is
checked against its unfused form (<row>.reference.onnx, standard ops only), so a new fused op
needs no NumPy code here. onyx's outputs are compared:
  float outputs   |onyx - ref| <= 1e-5 + 1e-4 * |ref| elementwise (numpy.allclose), NaN/inf equal
  other outputs   equal, with the same dtype
  random ops      (OpTraits::random, written by onyx_tests: Dropout, ...) only shapes
One PASS / FAIL line per row; rows whose op the reference cannot run are FAIL, not skipped.

With ONYX_OP_TABLE_CUDA=1 (scripts/device_check.sh, on a machine with a CUDA device) the rows
whose op has a CUDA kernel also write the op's outputs on the device (<row>.cuda.safetensors,
`Rows/OpCuda.*`), and those are compared with the same reference and the same tolerances: one
more PASS / FAIL line per such row ("on cuda").

Run: ONYX=build/onyx build/venv/bin/python tests/ops/test_forward_reference.py [substring-filter]
Ends with "N passed, M failed, K skipped"; exits 1 if any row failed.
"""
import math
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun
from safetensors import safe_open
from safetensors.numpy import load_file

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ONYX = os.environ.get("ONYX", os.path.join(ROOT, "build", "onyx"))
TESTS = os.path.join(os.path.dirname(ONYX), "onyx_tests")
FILTER = sys.argv[1] if len(sys.argv) > 1 else ""

# (op, input index) that stay float32 when the model is widened: their ONNX type is tensor(float).
KEEP_F32 = {("Resize", 2)}


# ---- float64 references for the onyx and com.microsoft ops --------------------------------------
def gelu(x, tanh):
    if tanh:
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    erf = np.vectorize(math.erf)
    return 0.5 * x * (1 + erf(x / math.sqrt(2)))


def layer_norm(x, scale, bias, axis, eps):
    axis = axis % x.ndim
    axes = tuple(range(axis, x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
    inv = 1 / np.sqrt(var + eps)
    y = (x - mean) * inv * scale
    if bias is not None:
        y = y + bias
    return y, mean, inv


class OnyxGelu(OpRun):
    op_domain = "onyx"

    def _run(self, x, approximate="none"):
        return (gelu(x, approximate == "tanh").astype(x.dtype),)


class OnyxLayerNormalization(OpRun):
    op_domain = "onyx"

    def _run(self, x, scale, bias=None, axis=-1, epsilon=1e-5, stash_type=1):
        y, mean, inv = layer_norm(x, scale, bias, axis, epsilon)
        return y, mean, inv


class OnyxMatMulT(OpRun):
    op_domain = "onyx"

    def _run(self, a, b, bias=None, transA=0, transB=0, alpha=1.0):
        if transA:
            a = np.swapaxes(a, -1, -2)
        if transB:
            b = np.swapaxes(b, -1, -2)
        y = alpha * np.matmul(a, b)
        if bias is not None:
            y = y + bias
        return (y.astype(a.dtype),)


class OnyxAttention(OpRun):
    op_domain = "onyx"

    def _run(self, q, k, v, mask=None, num_heads=1, scale=None, causal=0, dropout_ratio=0.0,
             seed=0, rng_key="", zero_masked_rows=0, num_kv_heads=None):
        B, Tq, C = q.shape
        Tk, Cv = k.shape[1], v.shape[2]
        H = num_heads
        Hk = H if num_kv_heads is None else num_kv_heads
        D, Dv = C // H, Cv // Hk
        qh = q.reshape(B, Tq, H, D).transpose(0, 2, 1, 3)
        # grouped-query attention: each key/value head serves H / Hk query heads (repeat_kv)
        kh = np.repeat(k.reshape(B, Tk, Hk, D).transpose(0, 2, 1, 3), H // Hk, axis=1)
        vh = np.repeat(v.reshape(B, Tk, Hk, Dv).transpose(0, 2, 1, 3), H // Hk, axis=1)
        s = (1 / math.sqrt(D) if scale is None else scale) * qh @ kh.transpose(0, 1, 3, 2)
        if mask is not None:
            s = s + mask
        if causal:
            s = np.where(np.tril(np.ones((Tq, Tk), dtype=bool)), s, -np.inf)
        m = s.max(axis=-1, keepdims=True)
        lse = m + np.log(np.exp(s - m).sum(axis=-1, keepdims=True))
        p = np.exp(s - lse)
        if zero_masked_rows:
            p = np.where(np.isfinite(lse), p, 0.0)
        o = (p @ vh).transpose(0, 2, 1, 3).reshape(B, Tq, H * Dv)
        return o.astype(q.dtype), lse[..., 0].astype(q.dtype)


class OnyxDropoutAdd(OpRun):
    # An inference run (what the forward mode does): out = y + residual, mask all true.
    op_domain = "onyx"

    def _run(self, y, residual, ratio=None, training_mode=None, seed=0, rng_key=""):
        return (y + residual).astype(y.dtype), np.ones(y.shape, dtype=bool)


class OnyxLinearCrossEntropy(OpRun):
    op_domain = "onyx"

    def _run(self, h, w, labels, bias=None, transB=1, ignore_index=None, reduction="mean",
             label_smoothing=0.0, chunk_rows=0):
        logits = h @ (w.T if transB else w)
        if bias is not None:
            logits = logits + bias
        V = logits.shape[1]
        m = logits.max(axis=1, keepdims=True)
        lse = (m + np.log(np.exp(logits - m).sum(axis=1, keepdims=True)))[:, 0]
        keep = np.ones(len(labels), dtype=bool) if ignore_index is None else labels != ignore_index
        t = np.where(keep, labels, 0).astype(np.int64)
        eps = label_smoothing
        per = lse - (1 - eps) * logits[np.arange(len(t)), t] - eps * logits.mean(axis=1)
        total = per[keep].sum()
        loss = total if reduction == "sum" else (total / keep.sum() if keep.sum() else np.nan)
        p = np.exp(logits - lse[:, None])
        onehot = np.zeros_like(p)
        onehot[np.arange(len(t)), t] = 1
        d = (p - (1 - eps) * onehot - eps / V) * keep[:, None]
        if reduction != "sum":
            d = d / max(keep.sum(), 1)
        dh = d @ (w if transB else w.T)
        dw = d.T @ h if transB else h.T @ d
        outs = [np.array(loss, dtype=h.dtype), dh.astype(h.dtype), dw.astype(h.dtype)]
        if bias is not None:
            outs.append(d.sum(axis=0).astype(h.dtype))
        return tuple(outs)


class OnyxLinearLogProbs(OpRun):
    op_domain = "onyx"

    def _run(self, h, w, labels, bias=None, transB=1, ignore_index=None, temperature=1.0,
             chunk_rows=0):
        z = h @ (w.T if transB else w)
        if bias is not None:
            z = z + bias
        z = z / temperature
        m = z.max(axis=1, keepdims=True)
        lse = (m + np.log(np.exp(z - m).sum(axis=1, keepdims=True)))[:, 0]
        keep = np.ones(len(labels), dtype=bool) if ignore_index is None else labels != ignore_index
        t = np.where(keep, labels, 0).astype(np.int64)
        p = np.exp(z - lse[:, None])
        rows = np.arange(len(t))
        logps = np.where(keep, z[rows, t] - lse, 0)
        entropy = np.where(keep, lse - (p * z).sum(axis=1), 0)
        mean = np.where(keep, z.mean(axis=1), 0)
        top1 = keep & (z.argmax(axis=1) == t)
        return (logps.astype(h.dtype), entropy.astype(h.dtype), mean.astype(h.dtype), top1)


class OnyxStopGradient(OpRun):
    op_domain = "onyx"

    def _run(self, x):
        return (x.copy(),)


class OnyxDrawNormal(OpRun):  # the given tensor passed through (the table's rows give one)
    op_domain = "onyx"

    def _run(self, given, like):
        return (given.copy(),)


class OnyxDrawIntegers(OpRun):
    op_domain = "onyx"

    def _run(self, given, like, high=None):
        return (given.copy(),)


class MsGelu(OpRun):
    op_domain = "com.microsoft"

    def _run(self, x):
        return (gelu(x, False).astype(x.dtype),)


class MsFastGelu(OpRun):
    op_domain = "com.microsoft"

    def _run(self, x, bias=None):
        return (gelu(x if bias is None else x + bias, True).astype(x.dtype),)


class MsBiasGelu(OpRun):
    op_domain = "com.microsoft"

    def _run(self, a, b):
        return (gelu(a + b, False).astype(a.dtype),)


# bitsandbytes' 4-bit code tables (its get_4bit_type: NF4's normal quantiles; FP4's values by bit
# pattern divided by 12).
NF4 = [-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
       -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
       0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
       0.7229568362236023, 1.0]
FP4 = [v / 12 for v in (0, 0.0625, 8, 12, 4, 6, 2, 3, -0.0, -0.0625, -8, -12, -4, -6, -2, -3)]


def dequantize_4bit(packed, absmax, nested_absmax, nested_map, quant_type, blocksize, shape,
                    nested_blocksize, offset):
    """bitsandbytes' dequantize_4bit: code[index] * absmax of the index's block (two indices per
    byte, the first in the high nibble); absmax = nested_map[code8] * nested_absmax + offset under
    double quantization."""
    code = np.array(NF4 if quant_type == "nf4" else FP4)
    p = packed.reshape(-1).astype(np.int64)
    idx = np.stack([p >> 4, p & 15], axis=1).reshape(-1)
    n = int(np.prod(shape))
    if absmax.dtype == np.uint8:
        b = np.arange(absmax.size) // nested_blocksize
        absmax = nested_map[absmax.astype(np.int64)] * nested_absmax[b] + offset
    scale = absmax[np.arange(n) // blocksize]
    return (code[idx[:n]] * scale).reshape(shape)


def quant_attrs(quant_type=b"nf4", blocksize=64, shape=None, nested_blocksize=256, offset=0.0):
    return dict(quant_type=quant_type.decode() if isinstance(quant_type, bytes) else quant_type,
                blocksize=blocksize, shape=list(shape), nested_blocksize=nested_blocksize,
                offset=offset)


class OnyxDequantize4Bit(OpRun):
    op_domain = "onyx"

    def _run(self, w, absmax, nested_absmax=None, nested_map=None, quant_type=b"nf4",
             blocksize=64, shape=None, nested_blocksize=256, offset=0.0, compute_dtype=None):
        a = quant_attrs(quant_type, blocksize, shape, nested_blocksize, offset)
        return (dequantize_4bit(w, absmax, nested_absmax, nested_map, **a),)


class OnyxMatMul4Bit(OpRun):
    op_domain = "onyx"

    def _run(self, x, w, absmax, nested_absmax=None, nested_map=None, bias=None,
             quant_type=b"nf4", blocksize=64, shape=None, nested_blocksize=256, offset=0.0,
             compute_dtype=None, transB=1):
        a = quant_attrs(quant_type, blocksize, shape, nested_blocksize, offset)
        W = dequantize_4bit(w, absmax, nested_absmax, nested_map, **a)
        y = np.matmul(x, W.T if transB else W)
        if bias is not None:
            y = y + bias
        return (y.astype(x.dtype),)


CUSTOM = {("onyx", "Gelu"): OnyxGelu, ("onyx", "LayerNormalization"): OnyxLayerNormalization,
          ("onyx", "MatMulT"): OnyxMatMulT, ("onyx", "Attention"): OnyxAttention,
          ("onyx", "DropoutAdd"): OnyxDropoutAdd,
          ("onyx", "LinearCrossEntropy"): OnyxLinearCrossEntropy,
          ("onyx", "LinearLogProbs"): OnyxLinearLogProbs, ("onyx", "StopGradient"): OnyxStopGradient,
          ("onyx", "DrawNormal"): OnyxDrawNormal, ("onyx", "DrawIntegers"): OnyxDrawIntegers,
          ("onyx", "Dequantize4Bit"): OnyxDequantize4Bit, ("onyx", "MatMul4Bit"): OnyxMatMul4Bit,
          ("com.microsoft", "Gelu"): MsGelu, ("com.microsoft", "FastGelu"): MsFastGelu,
          ("com.microsoft", "BiasGelu"): MsBiasGelu}


def custom_name(domain, op):
    # The evaluator resolves a class by op name, and these names clash with standard ops
    # (Attention, Gelu, LayerNormalization): the node and the class get a unique name.
    return "%s__%s" % (domain.replace(".", "_"), op)


def custom_ops():
    return [type(custom_name(d, op), (cls,), {"op_domain": d}) for (d, op), cls in CUSTOM.items()]


# ---- where onnx.reference is not the ONNX spec (or cannot run the case) -------------------------
# Each returns the outputs, or None to use the evaluator. Inputs are the widened arrays.
def attrs_of(node):
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def softmax_coerced(node, opset, x, log):
    # Below opset 13 Softmax / LogSoftmax coerce the input to 2-D at `axis` (default 1) and
    # normalize each row; onnx.reference implements only the opset-13 single-axis form.
    if opset >= 13:
        return None
    axis = attrs_of(node).get("axis", 1) % x.ndim
    rows = x.reshape(int(np.prod(x.shape[:axis])), -1)
    m = rows.max(axis=1, keepdims=True)
    lse = m + np.log(np.exp(rows - m).sum(axis=1, keepdims=True))
    out = rows - lse if log else np.exp(rows - lse)
    return [out.reshape(x.shape)]


def batch_norm_9(node, opset, x, scale, bias, mean, var):
    # onnx.reference's opset 9-13 BatchNormalization treats the momentum attribute (whose schema
    # default is always filled in) as training mode and normalizes with the batch statistics;
    # these opsets have no training mode: the running statistics are used.
    if opset >= 14:
        return None
    eps = attrs_of(node).get("epsilon", 1e-5)
    sh = (1, -1) + (1,) * (x.ndim - 2)
    return [(x - mean.reshape(sh)) / np.sqrt(var.reshape(sh) + eps) * scale.reshape(sh)
            + bias.reshape(sh)]


def mvn(node, opset, x):
    # The function body's epsilon constant is float32, so the widened model does not type-check.
    axes = tuple(attrs_of(node).get("axes", [0, 2, 3]))
    mean = x.mean(axis=axes, keepdims=True)
    var = (x * x).mean(axis=axes, keepdims=True) - mean * mean
    return [(x - mean) / (np.sqrt(var) + 1e-9)]


def gather_elements(node, opset, data, idx):
    # Indices may be smaller than data on the non-axis dims (the ONNX spec); the reference's
    # take_along_axis needs them equal.
    axis = attrs_of(node).get("axis", 0) % data.ndim
    pos = list(np.indices(idx.shape, sparse=True))
    pos[axis] = np.where(idx < 0, idx + data.shape[axis], idx)
    return [data[tuple(pos)]]


def scatter_elements(node, opset, data, idx, updates):
    # Scatter (opset 9-10, deprecated) has no reference; it is ScatterElements without reduction.
    axis = attrs_of(node).get("axis", 0) % data.ndim
    out = data.copy()
    pos = list(np.indices(idx.shape, sparse=True))
    pos[axis] = np.where(idx < 0, idx + data.shape[axis], idx)
    out[tuple(pos)] = updates
    return [out]


def one_hot(node, opset, indices, depth, values):
    # depth may be a one-element 1-D tensor; the reference needs a scalar.
    d = int(np.asarray(depth).reshape(-1)[0])
    axis = attrs_of(node).get("axis", -1)
    axis = axis + indices.ndim + 1 if axis < 0 else axis
    idx = np.where(indices < 0, indices + d, indices)
    hot = np.moveaxis(np.arange(d) == idx[..., None], -1, axis)
    return [np.where(hot, values[1], values[0]).astype(values.dtype)]


def pad_crop(node, opset, x, pads=None, value=None, axes=None):
    # Negative pads crop; the reference rejects them. Constant mode only (order does not matter).
    a = attrs_of(node)
    p = list(np.asarray(pads if pads is not None else a.get("pads")).reshape(-1))
    if min(p) >= 0 or a.get("mode", b"constant") not in (b"constant", "constant"):
        return None
    r = x.ndim
    ax = list(range(r)) if axes is None else [int(v) % r for v in axes]
    lo, hi = [0] * r, [0] * r
    for k, d in enumerate(ax):
        lo[d], hi[d] = p[k], p[k + len(ax)]
    crop = tuple(slice(-l if l < 0 else 0, x.shape[d] + h if h < 0 else None)
                 for d, (l, h) in enumerate(zip(lo, hi)))
    y = x[crop]
    fill = 0 if value is None or np.asarray(value).size == 0 else np.asarray(value).reshape(-1)[0]
    return [np.pad(y, [(max(l, 0), max(h, 0)) for l, h in zip(lo, hi)], constant_values=fill)]


def conv_transpose_groups(node, opset, x, w, b=None):
    # The reference's ConvTranspose handles group = 1 only: run it per group and concatenate.
    a = attrs_of(node)
    G = a.get("group", 1)
    if G == 1:
        return None
    xs, ws = np.split(x, G, axis=1), np.split(w, G, axis=0)
    bs = np.split(b, G) if b is not None else [None] * G
    outs = []
    for xg, wg, bg in zip(xs, ws, bs):
        inputs = [xg, wg] + ([bg] if bg is not None else [])
        names = ["x", "w", "b"][:len(inputs)]
        kw = {k: v for k, v in a.items() if k != "group"}
        n = onnx.helper.make_node("ConvTranspose", names, ["y"], **kw)
        g = onnx.helper.make_graph(
            [n], "g", [onnx.helper.make_tensor_value_info(nm, onnx.TensorProto.DOUBLE, None)
                       for nm in names],
            [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.DOUBLE, None)])
        m = onnx.helper.make_model(g, opset_imports=[onnx.helper.make_opsetid("", opset)])
        outs.append(ReferenceEvaluator(m).run(None, dict(zip(names, inputs)))[0])
    return [np.concatenate(outs, axis=1)]


OVERRIDES = {
    "Softmax": lambda n, o, x: softmax_coerced(n, o, x, False),
    "LogSoftmax": lambda n, o, x: softmax_coerced(n, o, x, True),
    "BatchNormalization": batch_norm_9,
    "MeanVarianceNormalization": mvn,
    "GatherElements": gather_elements,
    "Scatter": scatter_elements,
    "OneHot": one_hot,
    "Pad": pad_crop,
    "ConvTranspose": conv_transpose_groups,
}


def reference(model, ops):
    """The float64 reference outputs of a widened row model (one node, or a fused op's pattern)."""
    node = model.graph.node[0]
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    single = len(model.graph.node) == 1
    if single and node.domain in ("", "ai.onnx") and node.op_type in OVERRIDES:
        arrays = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
        args = [arrays[i] if i else None for i in node.input]
        out = OVERRIDES[node.op_type](node, opset, *args)
        if out is not None:
            return out
    for n in model.graph.node:
        if (n.domain, n.op_type) in CUSTOM:
            n.op_type = custom_name(n.domain, n.op_type)
    return ReferenceEvaluator(model, new_ops=ops).run(None, {})


# ---- widening and comparing ---------------------------------------------------------------------
def widened(model):
    keep = {n.input[i] for n in model.graph.node for (op, i) in KEEP_F32
            if n.op_type == op and i < len(n.input)}
    for init in model.graph.initializer:
        if init.data_type == onnx.TensorProto.FLOAT and init.name not in keep:
            arr = numpy_helper.to_array(init).astype(np.float64)
            init.CopyFrom(numpy_helper.from_array(arr, init.name))
    for out in model.graph.output:  # the evaluator infers output types itself
        out.ClearField("type")
    for n in model.graph.node:  # widen the pattern's float32 constants too
        for a in n.attribute:
            if a.type == onnx.AttributeProto.TENSOR and a.t.data_type == onnx.TensorProto.FLOAT:
                a.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(a.t).astype(np.float64),
                                                     a.t.name))
    return model


def compare(name, got, ref):
    if got.shape != ref.shape:
        return "shape %s, reference %s" % (got.shape, ref.shape)
    if np.issubdtype(got.dtype, np.floating):
        if not np.issubdtype(ref.dtype, np.floating):
            return "dtype %s, reference %s" % (got.dtype, ref.dtype)
        g64, r64 = got.astype(np.float64), ref.astype(np.float64)
        if not np.array_equal(np.isnan(g64), np.isnan(r64)):
            return "NaN at different places"
        ok = np.isclose(g64, r64, rtol=1e-4, atol=1e-5, equal_nan=True)
        if not ok.all():
            i = np.unravel_index(np.argmax(~ok), ok.shape)
            err = np.abs(g64 - r64)[~np.isnan(r64)].max() if g64.size else 0
            return "at %s: %r vs reference %r (max abs err %.3g)" % (i, g64[i], r64[i], err)
        return None
    if got.dtype != ref.dtype:
        return "dtype %s, reference %s" % (got.dtype, ref.dtype)
    if not np.array_equal(got, ref):
        i = np.unravel_index(np.argmax(got != ref), got.shape) if got.size else ()
        return "at %s: %r vs reference %r" % (i, got[i], ref[i])
    return None


def problems_of(row, got, refs, random):
    problems = []
    for k, ref in enumerate(refs):
        g = got.get("y%d" % k)
        if g is None:
            problems.append("y%d missing from onyx's outputs" % k)
            continue
        ref = np.asarray(ref)
        if random:
            if g.shape != ref.shape:
                problems.append("y%d shape %s, reference %s" % (k, g.shape, ref.shape))
            continue
        p = compare(row, g, ref)
        if p:
            problems.append("y%d %s" % (k, p))
    return problems


def main():
    passed = failed = cuda_rows = 0
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, ONYX_OP_TABLE_DIR=d)
        cuda = os.environ.get("ONYX_OP_TABLE_CUDA") == "1"
        modes = "Rows/OpForward.*:Rows/OpCuda.*" if cuda else "Rows/OpForward.*"
        r = subprocess.run([TESTS, "--gtest_filter=" + modes], env=env,
                           capture_output=True, text=True)
        if r.returncode != 0:
            print(r.stdout[-3000:], r.stderr[-2000:])
            print("FAIL onyx_tests forward mode exited %d" % r.returncode)
            failed += 1
        rows = sorted(f[:-5] for f in os.listdir(d)
                      if f.endswith(".onnx") and not f.endswith(".reference.onnx"))
        if not rows:
            print("FAIL no rows written to ONYX_OP_TABLE_DIR")
            failed += 1
        ops = custom_ops()
        for row in rows:
            if FILTER not in row:
                continue
            model = onnx.load(os.path.join(d, row + ".onnx"))
            node = model.graph.node[0]
            path = os.path.join(d, row + ".safetensors")
            got = load_file(path)
            with safe_open(path, "np") as f:  # OpTraits::random, as the kernel registered it
                random = (f.metadata() or {}).get("random") == "1"
            what = "%s%s" % (node.domain + "." if node.domain else "", node.op_type)
            ref_path = os.path.join(d, row + ".reference.onnx")
            from_pattern = os.path.exists(ref_path)  # a fused op's unfused form (standard ops)
            try:
                refs = reference(widened(onnx.load(ref_path)), ops) if from_pattern else \
                    reference(widened(model), ops)
            except Exception as e:  # noqa: BLE001 — the row fails with the evaluator's message
                print("FAIL %s (%s): the reference could not run it: %s" % (row, what,
                                                                          str(e).splitlines()[0]))
                failed += 1
                continue
            outputs = [("", got)]
            cuda_path = os.path.join(d, row + ".cuda.safetensors")
            if cuda and os.path.exists(cuda_path):
                outputs.append((" on cuda", load_file(cuda_path)))
                cuda_rows += 1
            for where, values in outputs:
                problems = problems_of(row, values, refs, random)
                if problems:
                    print("FAIL %s (%s)%s: %s" % (row, what, where, "; ".join(problems)))
                    failed += 1
                else:
                    print("PASS %s (%s)%s%s" % (row, what, where,
                                                " shapes only (random op)" if random else
                                                " against its unfused pattern" if from_pattern
                                                else ""))
                    passed += 1
        if os.environ.get("ONYX_OP_TABLE_CUDA") == "1" and not cuda_rows:
            print("FAIL ONYX_OP_TABLE_CUDA=1 but no row wrote outputs on cuda")
            failed += 1
    print("%d passed, %d failed, 0 skipped" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
