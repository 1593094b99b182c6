"""test_clip_text.py — onyx's CLIPTextModel (Stable Diffusion's text encoder; issue #41) against
Transformers' own class: tiny random configs saved by `save_pretrained` (Transformers 5's names) and
with Stable Diffusion's "text_model."-prefixed names, run by `onyx run FOLDER` on padded batches;
last_hidden_state and pooler_output within rtol 1e-4 / atol 1e-5 of PyTorch in eval mode. The
pooler's eos_token_id is either a real id (the first eos in each row) or the legacy 2 (the largest
id), as Transformers picks it.

Run: ONYX=build/onyx build/venv/bin/python tests/parity/test_clip_text.py
Prints one line per case and ends with "N passed, M failed, K skipped"; exits 1 if any failed.
"""
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st_io  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ONYX = os.environ.get("ONYX", os.path.join(REPO, "build", "onyx"))
RTOL, ATOL = 1e-4, 1e-5
torch.set_num_threads(1)


def tiny_clip(eos, act="quick_gelu", layers=2):
    from transformers import CLIPTextConfig, CLIPTextModel
    torch.manual_seed(0)
    cfg = CLIPTextConfig(vocab_size=120, hidden_size=32, intermediate_size=48, num_hidden_layers=layers,
                         num_attention_heads=4, max_position_embeddings=16, hidden_act=act, bos_token_id=118,
                         eos_token_id=eos, pad_token_id=1)
    model = CLIPTextModel(cfg).eval()
    with torch.no_grad():  # LayerNorms and biases random too, so their wiring shows
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    return model


def batch(eos, seed):
    """A right-padded batch (padding = eos, as CLIPTokenizer pads) and its attention mask."""
    g = torch.Generator().manual_seed(seed)
    lengths = [11, 6, 3]
    ids = torch.full((3, 11), eos if eos != 2 else 119, dtype=torch.int64)
    mask = torch.zeros((3, 11), dtype=torch.int64)
    for r, n in enumerate(lengths):
        ids[r, 0] = 118
        ids[r, 1:n - 1] = torch.randint(3, 110, (n - 2,), generator=g)
        ids[r, n - 1] = eos if eos != 2 else 119  # legacy configs: the eos is the largest id
        mask[r, :n] = 1
    return ids, mask


def compare(got, ref, what):
    err = np.abs(got - ref) - (ATOL + RTOL * np.abs(ref))
    if got.shape != ref.shape:
        return f"{what}: shape {got.shape} != {ref.shape}"
    if (err > 0).any():
        return f"{what}: max |diff| {np.abs(got - ref).max():.3e} beyond rtol {RTOL} / atol {ATOL}"
    return ""


def run_case(name, eos, prefixed, act="quick_gelu", use_mask=True):
    model = tiny_clip(eos, act)
    with tempfile.TemporaryDirectory() as tmp:
        folder = os.path.join(tmp, "text_encoder")
        model.save_pretrained(folder)
        if prefixed:  # Stable Diffusion's text_encoder folders: Transformers 4's names
            path = os.path.join(folder, "model.safetensors")
            tensors = st_io.load(path)
            st_io.save(path, {"text_model." + k: v for k, v in tensors.items()}, {"format": "pt"})
        ids, mask = batch(eos, 1)
        if not use_mask:
            mask = torch.ones_like(mask)
        with torch.no_grad():
            out = model(input_ids=ids, attention_mask=mask if use_mask else None)
        inputs, result = os.path.join(tmp, "in.safetensors"), os.path.join(tmp, "out.safetensors")
        st_io.save(inputs, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})
        p = subprocess.run([ONYX, "run", folder, "--inputs", inputs, "--output", result],
                           capture_output=True, text=True, timeout=300)
        if p.returncode != 0:
            return False, f"onyx run failed: {p.stderr.strip()[-800:]}"
        got = st_io.load(result)
        for key, ref in (("last_hidden_state", out.last_hidden_state), ("pooler_output", out.pooler_output)):
            if key not in got:
                return False, f"onyx's output has no {key} (has {sorted(got)})"
            msg = compare(got[key], ref.numpy(), key)
            if msg:
                return False, msg
        diff = max(float(np.abs(got[k] - r.numpy()).max())
                   for k, r in (("last_hidden_state", out.last_hidden_state), ("pooler_output", out.pooler_output)))
        return True, f"max |diff| {diff:.1e}"


def main():
    cases = [
        ("clip-text-eos-id", dict(eos=117, prefixed=False)),
        ("clip-text-sd-names", dict(eos=117, prefixed=True)),
        ("clip-text-legacy-eos-2", dict(eos=2, prefixed=True)),
        ("clip-text-gelu-no-mask", dict(eos=117, prefixed=False, act="gelu", use_mask=False)),
    ]
    passed = failed = 0
    for name, kw in cases:
        try:
            ok, msg = run_case(name, **kw)
        except Exception as e:  # a case that cannot run is a failure, not a skip
            ok, msg = False, f"{type(e).__name__}: {e}"
        print(f"{'PASS' if ok else 'FAIL'} {name}: {msg}", flush=True)
        passed += ok
        failed += not ok
    print(f"{passed} passed, {failed} failed, 0 skipped")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
