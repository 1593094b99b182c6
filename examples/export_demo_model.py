"""Demo for `scripts/demo.sh`: exports a small GPT-2-style causal LM from Debian's PyTorch 1.13 to
ONNX (opset 17, dynamic batch/sequence), writes a batch of real text (WordNet glosses when the
wordnet-base package is installed, else this file's own text) as byte-level token ids, and with
--check compares onyx's logits with PyTorch's."""
import json
import math
import os
import struct
import sys

import numpy as np
import torch
from torch import nn

OUT = sys.argv[1]
CHECK = "--check" in sys.argv
torch.manual_seed(0)
V, C, H, L, T, B = 256, 128, 4, 2, 64, 4  # byte vocabulary


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1 = nn.LayerNorm(C)
        self.attn = nn.Linear(C, 3 * C)
        self.proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C)
        self.fc = nn.Linear(C, 4 * C)
        self.fc_proj = nn.Linear(4 * C, C)

    def forward(self, x, mask):
        b, t, _ = x.shape
        q, k, v = self.attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = [z.view(b, t, H, C // H).transpose(1, 2) for z in (q, k, v)]
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // H)
        att = att.masked_fill(mask[:, :, :t, :t] == 0, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, C)
        x = x + self.proj(y)
        h = self.fc(self.ln_2(x))
        h = 0.5 * h * (1 + torch.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h ** 3)))
        return x + self.fc_proj(h)


class TinyGPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(T, C)
        self.h = nn.ModuleList([Block() for _ in range(L)])
        self.ln_f = nn.LayerNorm(C)
        self.register_buffer("mask", torch.tril(torch.ones(T, T)).view(1, 1, T, T))

    def forward(self, input_ids):
        t = input_ids.shape[1]
        pos = torch.arange(t, dtype=torch.long).unsqueeze(0)
        x = self.wte(input_ids) + self.wpe(pos)
        for blk in self.h:
            x = blk(x, self.mask)
        return self.ln_f(x) @ self.wte.weight.t()  # tied LM head


def text_batch():
    src = "/usr/share/wordnet/data.noun"
    lines = []
    if os.path.exists(src):
        with open(src, encoding="latin-1") as f:
            lines = [ln.split("| ", 1)[1] for ln in f if "| " in ln][:B]
    while len(lines) < B:
        lines.append(open(__file__).read()[len(lines) * 200:])
    ids = np.zeros((B, T), dtype=np.int64)
    for i, ln in enumerate(lines):
        b = ln.encode("utf-8")[:T].ljust(T, b" ")
        ids[i] = np.frombuffer(b, dtype=np.uint8)
    return ids


def save_safetensors(path, tensors):
    header, blobs, pos = {}, [], 0
    for name, arr in tensors.items():
        arr = np.ascontiguousarray(arr)
        dt = {np.float32: "F32", np.int64: "I64"}[arr.dtype.type]
        header[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [pos, pos + arr.nbytes]}
        blobs.append(arr.tobytes())
        pos += arr.nbytes
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def load_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        dt = {"F32": np.float32, "I64": np.int64}[e["dtype"]]
        out[name] = np.frombuffer(data[8 + n + b:8 + n + end], dtype=dt).reshape(e["shape"])
    return out


model = TinyGPT().eval()
ids = text_batch()
if not CHECK:
    torch.onnx.export(model, (torch.from_numpy(ids),), os.path.join(OUT, "model.onnx"),
                      input_names=["input_ids"], output_names=["logits"], opset_version=17,
                      dynamic_axes={"input_ids": {0: "batch", 1: "seq"}}, dynamo=False)
    save_safetensors(os.path.join(OUT, "inputs.safetensors"), {"input_ids": ids})
    print(f"exported {sum(p.numel() for p in model.parameters())} parameters to {OUT}/model.onnx")
else:
    with torch.no_grad():
        ref = model(torch.from_numpy(ids)).numpy()
    got = load_safetensors(os.path.join(OUT, "outputs.safetensors"))["logits"]
    err = np.max(np.abs(got - ref) / (np.abs(ref) + 1e-5))
    ok = np.allclose(got, ref, rtol=1e-4, atol=1e-5)
    print(f"onyx logits {list(got.shape)} vs PyTorch: max rel err {err:.2e} -> {'MATCH' if ok else 'MISMATCH'}")
    sys.exit(0 if ok else 1)
