"""test_forward_parity.py — forward-pass parity between PyTorch and `onyx run`.

Builds small reference models in PyTorch (random init, fixed seeds, eval mode): a BERT-like post-LN
encoder, a GPT-2-like pre-LN causal LM with tied embeddings, a ViT-like encoder and an MLP. Each is
exported three ways (exporters.py): the TorchScript exporter (dynamo=False) at opset 14 (constant
folding on) and opset 17 (constant folding off, so the runtime must fold PyTorch's
Shape->Gather->Concat->Reshape subgraphs itself), and the dynamo exporter (dynamo=True) at its
default opset, all with dynamic batch/sequence axes. Every exported file is run twice, at two different batch sizes /
sequence lengths, and every graph output is compared with PyTorch's within rtol 1e-4, atol 1e-5.
The models live in models.py (shared with test_grad_parity.py).

Run: ONYX=build/onyx build/venv/bin/python tests/parity/test_forward_parity.py
Prints one line per case and ends with "N passed, M failed"; exits 1 if any case failed.
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st_io  # noqa: E402
from models import TinyBert, TinyGpt2, TinyMlp, TinyVit  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ONYX = os.environ.get("ONYX", os.path.join(REPO, "build", "onyx"))
RTOL, ATOL = 1e-4, 1e-5

warnings.filterwarnings("ignore")
torch.set_num_threads(1)


# ----------------------------------------------------------------------------------------------
# Inputs: make(gen, B, T) -> {name: tensor}


def bert_inputs(g, b, t):
    ids = torch.randint(0, 60, (b, t), generator=g)
    mask = torch.ones(b, t, dtype=torch.long)
    for i in range(1, b):  # later rows padded at the end
        mask[i, t - min(i * 2, t - 1):] = 0
    types = torch.zeros(b, t, dtype=torch.long)
    types[:, t // 2:] = 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


def gpt_inputs(g, b, t):
    return {"input_ids": torch.randint(0, 70, (b, t), generator=g)}


def vit_inputs(g, b, _t):
    return {"pixel_values": torch.randn(b, 1, 28, 28, generator=g)}


def mlp_inputs(g, b, _t):
    return {"x": torch.randn(b, 16, generator=g)}


BT = {0: "batch", 1: "seq"}
MODELS = [
    # name, constructor, input maker, output names, dynamic axes, two (B, T) shapes
    ("bert", TinyBert, bert_inputs, ["logits", "last_hidden_state"],
     {"input_ids": BT, "attention_mask": BT, "token_type_ids": BT, "logits": {0: "batch"},
      "last_hidden_state": BT}, [(2, 7), (3, 12)]),
    ("gpt2", TinyGpt2, gpt_inputs, ["logits"], {"input_ids": BT, "logits": BT}, [(2, 9), (1, 16)]),
    ("vit", TinyVit, vit_inputs, ["logits"],
     {"pixel_values": {0: "batch"}, "logits": {0: "batch"}}, [(2, None), (5, None)]),
    ("mlp", TinyMlp, mlp_inputs, ["probs"], {"x": {0: "batch"}, "probs": {0: "batch"}},
     [(4, None), (1, None)]),
]
from exporters import VARIANTS, export  # noqa: E402


def compare(got, want):
    """Returns (ok, max relative error, max abs error, note). The relative error of an element is
    |got - want| / (|want| + atol/rtol), so the case passes exactly when it is <= rtol everywhere
    (the criterion |got - want| <= atol + rtol*|want| of numpy.allclose)."""
    if got.shape != want.shape:
        return False, float("inf"), float("inf"), f"shape {got.shape} != {want.shape}"
    if want.size == 0:
        return True, 0.0, 0.0, ""
    g64, w64 = got.astype(np.float64), want.astype(np.float64)
    if not np.all(np.isfinite(g64)):
        return False, float("inf"), float("inf"), "non-finite values"
    diff = np.abs(g64 - w64)
    ok = bool(np.all(diff <= ATOL + RTOL * np.abs(w64)))
    rel = float(np.max(diff / (np.abs(w64) + ATOL / RTOL)))
    return ok, rel, float(np.max(diff)), ""


def run_case(tmp, name, model_path, out_names, model, inputs):
    """Runs onyx on one input set; returns (ok, message)."""
    in_path = os.path.join(tmp, f"{name}.in.safetensors")
    out_path = os.path.join(tmp, f"{name}.out.safetensors")
    st_io.save(in_path, {k: v.numpy() for k, v in inputs.items()})
    with torch.no_grad():
        ref = model(**inputs)
    ref = ref if isinstance(ref, tuple) else (ref,)
    p = subprocess.run([ONYX, "run", model_path, "--inputs", in_path, "--output", out_path],
                       capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        err = (p.stderr.strip() or p.stdout.strip()).splitlines()
        return False, f"onyx exited {p.returncode}: {err[0] if err else '(no output)'}"
    got = st_io.load(out_path)
    worst_rel, worst_abs, ok, notes = 0.0, 0.0, True, []
    for oname, r in zip(out_names, ref):
        if oname not in got:
            ok = False
            notes.append(f"output '{oname}' missing (got {sorted(got)})")
            continue
        o_ok, rel, ab, note = compare(got[oname], r.numpy())
        worst_rel, worst_abs = max(worst_rel, rel), max(worst_abs, ab)
        if not o_ok:
            ok = False
            notes.append(f"{oname}: {note or f'max rel {rel:.2e} abs {ab:.2e}'}")
    msg = f"max rel err {worst_rel:.2e} (max abs {worst_abs:.2e})"
    if notes:
        msg += "; " + "; ".join(notes)
    return ok, msg


def main():
    if not (os.path.isfile(ONYX) and os.access(ONYX, os.X_OK)):
        print(f"FAIL setup: onyx binary not found at {ONYX} (set ONYX=...)")
        print("0 passed, 1 failed")
        return 1
    t0 = time.time()
    tmp = tempfile.mkdtemp(prefix="onyx-parity-")
    passed = failed = 0
    try:
        for mi, (mname, ctor, make, out_names, dyn, shapes) in enumerate(MODELS):
            torch.manual_seed(1234 + mi)
            model = ctor().eval()
            g = torch.Generator().manual_seed(99 + mi)
            input_sets = [make(g, b, t) for b, t in shapes]
            for label, exporter, opset, fold in VARIANTS:
                variant = f"{mname}/{label}{'' if fold else '-nofold'}"
                path = os.path.join(tmp, variant.replace("/", "_") + ".onnx")
                try:
                    with torch.no_grad():
                        export(model, tuple(input_sets[0].values()), path, exporter=exporter,
                               opset=opset, input_names=list(input_sets[0]),
                               output_names=out_names, dynamic_axes=dyn, fold=fold)
                except Exception as e:  # an export failure is this test's problem: report it
                    for b, t in shapes:
                        print(f"FAIL {variant}/B{b}" + (f"T{t}" if t else "")
                              + f": torch.onnx.export failed: {e}")
                        failed += 1
                    continue
                for (b, t), inputs in zip(shapes, input_sets):
                    case = f"{variant}/B{b}" + (f"T{t}" if t else "")
                    try:
                        ok, msg = run_case(tmp, case.replace("/", "_"), path, out_names, model,
                                           inputs)
                    except Exception as e:
                        ok, msg = False, f"{type(e).__name__}: {e}"
                    print(f"{'PASS' if ok else 'FAIL'} {case}: {msg}", flush=True)
                    passed += ok
                    failed += not ok
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"({time.time() - t0:.1f}s)")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
