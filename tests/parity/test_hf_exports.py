"""test_hf_exports.py — Transformers' own models, exported to ONNX by torch 2.13, trained by onyx:
one forward + backward (`onyx grad`) against PyTorch's loss and gradients.

Models (random init from small configs, dropout 0, loss computed by the model from `labels`):
  bert     BertForSequenceClassification (SDPA attention, padded attention_mask)
  gpt2     GPT2LMHeadModel (Conv1D layers, fused c_attn split into q/k/v: the dynamo exporter
           writes that split as SplitToSequence + SequenceAt, which onyx lowers to Slices; tied
           LM head)
  llama    LlamaForCausalLM (RMSNorm, rotary embeddings, grouped-query attention, SwiGLU MLP)
  bart     BartForConditionalGeneration (encoder–decoder: cross-attention, labels shifted into
           decoder_input_ids inside the model; final_logits_bias a buffer: frozen)
  t5       T5ForConditionalGeneration (relative position bias, RMS-style norm; its attention
           stays unfused from the exports: a position bias and the mask are added apart)
  whisper  WhisperForConditionalGeneration (log-mel features through two Conv1d; the sinusoidal
           encoder positions requires_grad=False: frozen)
Each exported by the dynamo exporter (dynamo=True, default opset, optimize=False: see
exporters.py) and by the TorchScript exporter (dynamo=False, opset 17; Llama with
attn_implementation "eager" there, since that exporter cannot convert SDPA with grouped-query
heads). Parameters PyTorch does not train (requires_grad=False) and buffers are passed to
`onyx grad --frozen`, as the Python package freezes them. torch 2.13's dynamo exporter cannot
export T5ForConditionalGeneration (ConversionError while decomposing the FX graph): that case is
a SKIP saying so while the exporter fails that way, and is run when it does not. The line reports the fusions `onyx plan` applied; the fused attention must fire on
every layer of every export (ATTENTION_FUSED), and Llama's RMSNorm, SwiGLU and rotary fusions as
often as FUSED says, on both exporters' graphs. Every parameter gradient
and the loss must match PyTorch float32 within rtol 1e-4, atol 1e-6 (a tied tensor is compared
under whichever of its names the export kept). And `onyx grad --bf16` against PyTorch's CPU
autocast bf16: the loss within 1e-2, every gradient moved off float32's by the rounding, the
worst tensor's distance to autocast's within twice autocast's own distance from float32.

Run: ONYX=build/onyx build/venv/bin/python tests/parity/test_hf_exports.py [substring-filter]
Prints one line per case and ends with "N passed, M failed, K skipped".
"""
import json
import logging
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st_io  # noqa: E402
from exporters import export  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ONYX = os.environ.get("ONYX", os.path.join(REPO, "build", "onyx"))
RTOL, ATOL = 1e-4, 1e-6
B, T = 2, 12
# case -> fused attention nodes `onyx plan` must report (one per layer): every export, Llama's
# grouped-query attention included (rotary q/k, K/V heads repeated by Unsqueeze/Expand/Reshape).
ATTENTION_FUSED = {f"{m}/{e}": 2 for m in ("bert", "gpt2", "llama") for e in ("dynamo", "ts")}
# one encoder and one decoder layer: self, self and cross attention. T5's exports add a position
# bias (the trained one, or zeros in cross-attention) and the mask to the scores as two Adds, which
# attention_fusion leaves alone (no expectation: it stays unfused)
ATTENTION_FUSED.update({f"{m}/{e}": 3 for m in ("bart", "whisper") for e in ("dynamo", "ts")})
# exporter failures outside onyx, reported as SKIP while they happen: case -> what the error says
EXPORTER_FAILS = {"t5/dynamo": "Failed to decompose the FX graph"}
# model -> fusion -> count `onyx plan` must report on both exporters' graphs: Llama's RMSNorm (two
# per layer and the final norm), SwiGLU MLP (one per layer) and rotary embeddings (q and k).
FUSED = {"llama": {"rms_norm_fusion": 5, "swiglu_fusion": 2, "rotary_fusion": 4}}

warnings.filterwarnings("ignore")
torch.set_num_threads(1)


class Skip(Exception):
    pass


class LossOf(torch.nn.Module):
    """The model's own loss as the single output (what a training export carries)."""

    def __init__(self, model, names):
        super().__init__()
        self.model, self.names = model, names

    def forward(self, input_ids, second, third=None):
        args = [input_ids, second] + ([] if third is None else [third])
        return self.model(**dict(zip(self.names, args))).loss


def models():
    import transformers as tr
    logging.getLogger("transformers").setLevel(logging.ERROR)
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(0, 100, (B, T), generator=g)
    am = torch.ones(B, T, dtype=torch.long)
    am[1, 8:] = 0
    out = {}
    torch.manual_seed(1)
    bert = tr.BertForSequenceClassification(tr.BertConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=64, num_labels=3, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0))
    out["bert"] = (bert, ["input_ids", "attention_mask", "labels"],
                   {"input_ids": ids, "attention_mask": am,
                    "labels": torch.randint(0, 3, (B,), generator=g)})
    torch.manual_seed(2)
    gpt2 = tr.GPT2LMHeadModel(tr.GPT2Config(
        vocab_size=100, n_embd=32, n_layer=2, n_head=4, n_positions=64, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0))
    out["gpt2"] = (gpt2, ["input_ids", "labels"], {"input_ids": ids, "labels": ids})
    torch.manual_seed(3)
    llama = tr.LlamaForCausalLM(tr.LlamaConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64,
        bos_token_id=0, eos_token_id=0))
    out["llama"] = (llama, ["input_ids", "labels"], {"input_ids": ids, "labels": ids})
    labels = torch.randint(3, 100, (B, 6), generator=g)
    labels[1, 4:] = -100
    seq2seq = {"input_ids": ids, "attention_mask": am, "labels": labels}
    common = dict(vocab_size=100, pad_token_id=1, decoder_start_token_id=2)
    torch.manual_seed(4)
    bart = tr.BartForConditionalGeneration(tr.BartConfig(
        d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=48, decoder_ffn_dim=48,
        max_position_embeddings=32, dropout=0.0, **common))
    out["bart"] = (bart, ["input_ids", "attention_mask", "labels"], seq2seq)
    torch.manual_seed(5)
    t5 = tr.T5ForConditionalGeneration(tr.T5Config(
        d_model=32, d_kv=8, d_ff=48, num_layers=1, num_heads=4, dropout_rate=0.0, **common))
    out["t5"] = (t5, ["input_ids", "attention_mask", "labels"], seq2seq)
    torch.manual_seed(6)
    whisper = tr.WhisperForConditionalGeneration(tr.WhisperConfig(
        d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=48, decoder_ffn_dim=48, num_mel_bins=8,
        max_source_positions=6, max_target_positions=16, **common))
    out["whisper"] = (whisper, ["input_features", "labels"],
                      {"input_features": torch.randn(B, 8, 12, generator=g), "labels": labels})
    return out


def untrained(wrapped, path):
    """What PyTorch does not train, as the export names it: buffers and requires_grad=False
    parameters that are initializers of the file (an exporter folds some buffers away)."""
    import onnx
    inits = {t.name for t in onnx.load(path, load_external_data=False).graph.initializer}
    names = [n for n, _ in wrapped.named_buffers()]
    names += [n for n, prm in wrapped.named_parameters() if not prm.requires_grad]
    return [n for n in names if n in inits]


def case(tmp, name, exporter, model, names, inputs):
    # The TorchScript exporter cannot convert SDPA with grouped-query heads (enable_gqa): a user of
    # that exporter switches Llama to the eager attention, the same math.
    model.set_attn_implementation(
        "eager" if (exporter == "ts" and name in ("llama", "bart", "t5", "whisper")) else "sdpa")
    wrapped = LossOf(model, names).train()
    path = os.path.join(tmp, f"{name}_{exporter}.onnx")
    dyn = {k: {0: "batch"} for k in names}
    try:
        export(wrapped, tuple(inputs[k] for k in names), path, exporter=exporter,
               opset=17 if exporter == "ts" else None, input_names=names, output_names=["loss"],
               dynamic_axes=dyn, training=True, fold=False)
    except Exception as e:  # an exporter that cannot export this model: reported, not hidden
        known = EXPORTER_FAILS.get(f"{name}/{exporter}")
        if known and known in str(e):
            raise Skip(f"torch 2.13's {exporter} exporter fails on this model: {known} "
                       f"({type(e).__name__})")
        return False, f"torch.onnx.export({exporter}) failed: {type(e).__name__}: {str(e)[:200]}"
    in_path, out_path = path + ".in.safetensors", path + ".grads.safetensors"
    st_io.save(in_path, {k: v.numpy() for k, v in inputs.items()})
    frozen = untrained(wrapped, path)
    p = subprocess.run([ONYX, "grad", path, "--inputs", in_path, "--output", out_path, "--loss",
                        "loss"] + (["--frozen", ",".join(frozen)] if frozen else []),
                       capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        return False, f"onyx grad exited {p.returncode}: {p.stderr.strip().splitlines()[-1:]}"
    got = st_io.load(out_path)
    wrapped.zero_grad()
    loss = wrapped(*[inputs[k] for k in names])
    loss.backward()
    by_id = {}
    for n, prm in wrapped.named_parameters(remove_duplicate=False):
        if prm.requires_grad:
            by_id.setdefault(id(prm), (prm, []))[1].append(n)
    worst, worst_name, bad, missing = 0.0, "", [], []
    want_loss = loss.detach().numpy()
    lerr = abs(float(got["loss"]) - float(want_loss)) / (abs(float(want_loss)) + ATOL / RTOL)
    if lerr > RTOL:
        bad.append(f"loss {float(got['loss']):.6f} vs {float(want_loss):.6f}")
    for prm, aliases in by_id.values():
        key = next((a for a in aliases if a in got), None)
        if key is None:
            missing.append(aliases[0])
            continue
        w = prm.grad.detach().numpy().astype(np.float64)
        d = np.abs(got[key].astype(np.float64) - w)
        rel = float(np.max(d / (np.abs(w) + ATOL / RTOL))) if w.size else 0.0
        if rel > worst:
            worst, worst_name = rel, key
        if not np.all(d <= ATOL + RTOL * np.abs(w)):
            bad.append(f"{key} (rel {rel:.1e})")
    cfg = {"model": path, "loss": "loss", "train_data": in_path, "output_dir": path + ".out",
           "max_steps": 1, "per_device_train_batch_size": B, "save_strategy": "no",
           "eval_strategy": "no", "disable_tqdm": True}
    with open(path + ".json", "w") as f:
        json.dump(cfg, f)
    p = subprocess.run([ONYX, "plan", path + ".json"], capture_output=True, text=True, timeout=300)
    m = re.search(r"^fusions applied:(.*)$", p.stdout, re.M)
    fusions = m.group(1).strip() if m else f"(onyx plan exit {p.returncode})"
    names_all = {a for _, aliases in by_id.values() for a in aliases}
    extra = sorted(set(got) - {"loss"} - names_all)  # trained but not a parameter (a buffer)
    want_att = ATTENTION_FUSED.get(f"{name}/{exporter}")
    am = re.search(r"attention_fusion x(\d+)", fusions)
    att_ok = want_att is None or (am is not None and int(am.group(1)) == want_att)
    fused_bad = []
    for fusion, want in FUSED.get(name, {}).items():
        fm = re.search(fusion + r" x(\d+)", fusions)
        if fm is None or int(fm.group(1)) != want:
            fused_bad.append(f"{fusion} x{fm.group(1) if fm else 0} (want x{want})")
    bf16_ok, bf16_msg = bf16_grads(path, in_path, wrapped, names, inputs, got, by_id)
    ok = (not bad and not missing and not extra and p.returncode == 0 and att_ok and not fused_bad
          and bf16_ok)
    msg = (f"max rel err {worst:.2e} ({worst_name}), {len(got) - 1} gradients; {bf16_msg}; "
           f"fusions: {fusions}")
    if bad:
        msg += "; over tolerance: " + ", ".join(bad[:4])
    if missing:
        msg += f"; missing: {missing[:4]}"
    if extra:
        msg += f"; gradients for non-parameters: {extra[:4]}"
    if not att_ok:
        msg += f"; attention_fusion should fire {want_att} times"
    if fused_bad:
        msg += "; fusions not as expected: " + ", ".join(fused_bad)
    return ok, msg


def bf16_grads(path, in_path, wrapped, names, inputs, f32, by_id):
    """(ok, message): `onyx grad --bf16` on the export against PyTorch's CPU autocast bf16 on the
    module (Transformers' bf16=True): the loss within 1e-2; every gradient moved off onyx's
    float32 one (bf16 ran in every layer, the bias-free projections' plain MatMuls included);
    the worst tensor's relative Frobenius distance to autocast's within twice autocast's own
    distance from float32 (two bf16 runs that round at different places, autocast also keeping
    every Linear output bf16)."""
    out = path + ".bf16.safetensors"
    frozen = untrained(wrapped, path)
    p = subprocess.run([ONYX, "grad", path, "--inputs", in_path, "--output", out, "--loss", "loss",
                        "--bf16"] + (["--frozen", ",".join(frozen)] if frozen else []),
                       capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        return False, f"onyx grad --bf16 exited {p.returncode}: {p.stderr.strip()[-200:]}"
    got = st_io.load(out)
    wrapped.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = wrapped(*[inputs[k] for k in names])
    loss.float().backward()
    largest = max(float(np.sqrt(np.mean(f32[k].astype(np.float64) ** 2))) for k in f32 if k != "loss")
    effect = vs_torch = 0.0
    unmoved = []
    for prm, aliases in by_id.values():
        key = next((a for a in aliases if a in got), None)
        if key is None or prm.grad is None:
            continue
        ref32 = f32[key].astype(np.float64)
        if np.sqrt(np.mean(ref32 ** 2)) < 1e-6 * largest:  # zero but for rounding
            continue
        ac = prm.grad.detach().float().numpy().astype(np.float64)
        g = got[key].astype(np.float64)
        if np.array_equal(g, ref32):
            unmoved.append(key)
        n32 = np.linalg.norm(ref32)
        effect = max(effect, float(np.linalg.norm(ac - ref32) / n32))
        vs_torch = max(vs_torch, float(np.linalg.norm(g - ac) / n32))
    lrel = abs(float(got["loss"]) - float(loss)) / abs(float(loss))
    ok = lrel < 1e-2 and not unmoved and 0 < vs_torch <= 2 * effect
    return ok, (f"bf16 vs autocast: loss {lrel:.1e}, gradients {vs_torch:.1e} (autocast vs float32 "
                f"{effect:.1e})" + (f", unmoved by bf16: {unmoved[:3]}" if unmoved else ""))


def main():
    filt = sys.argv[1] if len(sys.argv) > 1 else ""
    t0 = time.time()
    tmp = tempfile.mkdtemp(prefix="onyx-hf-exports-")
    passed = failed = skipped = 0
    try:
        for name, (model, names, inputs) in models().items():
            for exporter in ("dynamo", "ts"):
                label = f"{name}/{exporter}"
                if filt not in label:
                    continue
                try:
                    ok, msg = case(tmp, name, exporter, model, names, inputs)
                except Skip as e:
                    print(f"SKIP {label}: {e}", flush=True)
                    skipped += 1
                    continue
                except Exception as e:
                    ok, msg = False, f"{type(e).__name__}: {e}"
                print(("PASS " if ok else "FAIL ") + label + ": " + msg, flush=True)
                passed += ok
                failed += not ok
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"({time.time() - t0:.1f}s)")
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
