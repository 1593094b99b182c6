"""test_forward_parity.py — forward-pass parity between PyTorch and `onyx run`.

Builds small reference models in PyTorch (random init, fixed seeds, eval mode): a BERT-like post-LN
encoder, a GPT-2-like pre-LN causal LM with tied embeddings, a ViT-like encoder and an MLP. Each is
exported with torch.onnx.export at opset 14 (constant folding on) and opset 17 (constant folding
off, so the runtime must fold PyTorch's Shape->Gather->Concat->Reshape subgraphs itself), with
dynamic batch/sequence axes. Every exported file is run twice, at two different batch sizes /
sequence lengths, and every graph output is compared with PyTorch's within rtol 1e-4, atol 1e-5.

Run: ONYX=build/onyx /usr/bin/python3 tests/parity/test_forward_parity.py
Prints one line per case and ends with "N passed, M failed"; exits 1 if any case failed.
"""
import math
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

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ONYX = os.environ.get("ONYX", os.path.join(REPO, "build", "onyx"))
RTOL, ATOL = 1e-4, 1e-5

warnings.filterwarnings("ignore")
torch.set_num_threads(1)


# ----------------------------------------------------------------------------------------------
# Models


class SelfAttention(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.h, self.dh = heads, d // heads
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))

    def split(self, x):  # [B,T,D] -> [B,H,T,Dh], sizes taken from the tensor (dynamic in ONNX)
        b, t = x.size(0), x.size(1)
        return x.view(b, t, self.h, self.dh).permute(0, 2, 1, 3)

    def forward(self, x, additive_mask=None, causal=False):
        q, k, v = self.split(self.q(x)), self.split(self.k(x)), self.split(self.v(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.dh)
        if additive_mask is not None:
            scores = scores + additive_mask
        if causal:
            t = x.size(1)
            keep = torch.tril(torch.ones(t, t, dtype=torch.bool, device=x.device))
            scores = scores.masked_fill(~keep, torch.finfo(scores.dtype).min)
        p = torch.softmax(scores, dim=-1)
        ctx = torch.matmul(p, v).permute(0, 2, 1, 3).contiguous()
        ctx = ctx.view(ctx.size(0), ctx.size(1), self.h * self.dh)
        return self.o(ctx)


class BertLayer(nn.Module):  # post-LN, GELU (erf)
    def __init__(self, d, heads, ffn):
        super().__init__()
        self.attn = SelfAttention(d, heads)
        self.ln1 = nn.LayerNorm(d, eps=1e-12)
        self.fc1, self.fc2 = nn.Linear(d, ffn), nn.Linear(ffn, d)
        self.ln2 = nn.LayerNorm(d, eps=1e-12)
        self.drop = nn.Dropout(0.1)

    def forward(self, x, mask):
        x = self.ln1(x + self.drop(self.attn(x, mask)))
        return self.ln2(x + self.drop(self.fc2(F.gelu(self.fc1(x)))))


class TinyBert(nn.Module):
    def __init__(self, vocab=60, d=32, heads=4, ffn=64, layers=2, max_pos=40, types=2, labels=3):
        super().__init__()
        self.word = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(max_pos, d)
        self.tok_type = nn.Embedding(types, d)
        self.ln = nn.LayerNorm(d, eps=1e-12)
        self.layers = nn.ModuleList(BertLayer(d, heads, ffn) for _ in range(layers))
        self.pool = nn.Linear(d, d)
        self.cls = nn.Linear(d, labels)

    def forward(self, input_ids, attention_mask, token_type_ids):
        t = input_ids.size(1)
        pos_ids = torch.arange(t, dtype=torch.long, device=input_ids.device).unsqueeze(0)
        x = self.word(input_ids) + self.pos(pos_ids) + self.tok_type(token_type_ids)
        x = self.ln(x)
        ext = attention_mask[:, None, None, :].to(x.dtype)
        ext = (1.0 - ext) * -10000.0
        for layer in self.layers:
            x = layer(x, ext)
        pooled = torch.tanh(self.pool(x[:, 0]))
        return self.cls(pooled), x


def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class GptBlock(nn.Module):  # pre-LN, gelu_new
    def __init__(self, d, heads):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = SelfAttention(d, heads)
        self.fc, self.proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        x = x + self.attn(self.ln1(x), causal=True)
        return x + self.proj(gelu_new(self.fc(self.ln2(x))))


class TinyGpt2(nn.Module):
    def __init__(self, vocab=70, d=32, heads=4, layers=2, n_pos=40):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(n_pos, d)
        self.blocks = nn.ModuleList(GptBlock(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied embeddings

    def forward(self, input_ids):
        t = input_ids.size(-1)
        pos = torch.arange(0, t, dtype=torch.long, device=input_ids.device).unsqueeze(0)
        x = self.wte(input_ids) + self.wpe(pos)
        for b in self.blocks:
            x = b(x)
        return self.lm_head(self.ln_f(x))


class VitBlock(nn.Module):  # pre-LN, GELU (erf)
    def __init__(self, d, heads, ffn):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d, eps=1e-6), nn.LayerNorm(d, eps=1e-6)
        self.attn = SelfAttention(d, heads)
        self.fc1, self.fc2 = nn.Linear(d, ffn), nn.Linear(ffn, d)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class TinyVit(nn.Module):
    def __init__(self, image=28, patch=4, chans=1, d=32, heads=4, ffn=64, layers=2, classes=10):
        super().__init__()
        n = (image // patch) ** 2
        self.patch = nn.Conv2d(chans, d, kernel_size=patch, stride=patch)
        self.cls_token = nn.Parameter(torch.randn(1, 1, d) * 0.02)
        self.pos = nn.Parameter(torch.randn(1, n + 1, d) * 0.02)
        self.blocks = nn.ModuleList(VitBlock(d, heads, ffn) for _ in range(layers))
        self.ln = nn.LayerNorm(d, eps=1e-6)
        self.head = nn.Linear(d, classes)

    def forward(self, pixel_values):
        b = pixel_values.size(0)
        x = self.patch(pixel_values).flatten(2).transpose(1, 2)  # [B, N, D]
        x = torch.cat([self.cls_token.expand(b, -1, -1), x], dim=1) + self.pos
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x)[:, 0])


class TinyMlp(nn.Module):
    def __init__(self, d_in=16, hidden=32, d_out=5):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                                 nn.Tanh(), nn.Linear(hidden, d_out))

    def forward(self, x):
        return torch.softmax(self.net(x), dim=-1)


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
EXPORTS = [(14, True), (17, False)]  # (opset, do_constant_folding)


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
            for opset, fold in EXPORTS:
                variant = f"{mname}/opset{opset}{'' if fold else '-nofold'}"
                path = os.path.join(tmp, variant.replace("/", "_") + ".onnx")
                try:
                    with torch.no_grad():
                        torch.onnx.export(model, tuple(input_sets[0].values()), path,
                                          input_names=list(input_sets[0]), output_names=out_names,
                                          dynamic_axes=dyn, opset_version=opset,
                                          do_constant_folding=fold)
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
