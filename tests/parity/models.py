"""models.py — small PyTorch reference models shared by the parity tests.

A BERT-like post-LN encoder (TinyBert), a GPT-2-like pre-LN causal LM with tied embeddings
(TinyGpt2), a ViT-like encoder (TinyVit) and an MLP (TinyMlp). Used by test_forward_parity.py
(eval mode) and test_grad_parity.py (training-mode export, dropout p=0).
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


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
    def __init__(self, d, heads, ffn, dropout=0.1):
        super().__init__()
        self.attn = SelfAttention(d, heads)
        self.ln1 = nn.LayerNorm(d, eps=1e-12)
        self.fc1, self.fc2 = nn.Linear(d, ffn), nn.Linear(ffn, d)
        self.ln2 = nn.LayerNorm(d, eps=1e-12)
        self.drop = nn.Dropout(dropout)

    def forward(self, x, mask):
        x = self.ln1(x + self.drop(self.attn(x, mask)))
        return self.ln2(x + self.drop(self.fc2(F.gelu(self.fc1(x)))))


class TinyBert(nn.Module):
    def __init__(self, vocab=60, d=32, heads=4, ffn=64, layers=2, max_pos=40, types=2,
                 labels=3, dropout=0.1):
        super().__init__()
        self.word = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(max_pos, d)
        self.tok_type = nn.Embedding(types, d)
        self.ln = nn.LayerNorm(d, eps=1e-12)
        self.layers = nn.ModuleList(BertLayer(d, heads, ffn, dropout) for _ in range(layers))
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


class MlpCls(nn.Module):
    """TinyMlp with its cross entropy inside: (x, labels) -> (loss, logits), for the CLI tests."""

    def __init__(self):
        super().__init__()
        self.mlp = TinyMlp(d_in=16, hidden=32, d_out=3)

    def forward(self, x, labels):
        logits = self.mlp.net(x)
        return F.cross_entropy(logits, labels), logits
