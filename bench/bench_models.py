"""bench_models.py — the benchmark models of train_bench.py, built from tests/parity/models.py.

SPECS holds the three small models (the test suite exports them: bench/make_exports.py,
tests/cli/test_plan.py, so keep it to these three); ALL_SPECS adds the two full-size ones the
benchmark also trains (bert-base, gpt2-small); BF16_SPECS adds the Llama bf16_bench.py trains. Each entry describes one model: its PyTorch module
(loss computed inside forward, returned as the only output, so the ONNX export has one scalar
output `loss`), batch size, the synthetic dataset it trains on, and the analytic FLOPs of one
training step.

  bert-mini  BERT-like post-LN encoder, H256 L4 A4 FFN1024, seq 128, vocab 30522, 2-label
             sequence classification (pooler + classifier on the [CLS] token), batch 16
  gpt2-tiny  GPT-2-like pre-LN causal LM, H256 L4 A4 FFN1024, seq 256, vocab 50257, LM head tied to
             the token embedding, shifted causal-LM cross entropy, batch 8
  vit-tiny   ViT-like pre-LN encoder, H192 L6 A3 FFN768, 28x28x1 images, 4x4 patches (49 + cls =
             50 tokens), 10 classes, batch 64
  bert-base  the same BERT at BERT-base size: H768 L12 A12 FFN3072, seq 128, vocab 30522, 2 labels,
             batch 8 (109.5M parameters)
  gpt2-small the same GPT-2 at GPT-2 small size (124M): H768 L12 A12 FFN3072, seq 256, vocab 50257,
             1024 positions, tied LM head, batch 4
  llama      the Llama of bench/llama_bench.py: Transformers' LlamaForCausalLM (sdpa attention),
             hidden 768, 12 layers, 12 heads over 4 key/value heads, SwiGLU 2048, vocab 32000,
             untied LM head (110M), seq 128, batch 4, Transformers' random init. Not exported: onyx
             trains the Hugging Face folder it is saved as (spec key hf_folder), as users do.

Dropout is 0 everywhere (TinyBert takes dropout=0.0; the GPT-2 and ViT blocks have none).
Weights are initialized as Hugging Face does for BERT / GPT-2 / ViT (hf_init: Linear, Conv and
Embedding weights ~ N(0, 0.02), biases 0, LayerNorm 1 and 0), so the losses start where real
models start (ln 50257 = 10.8 for the LM) rather than at models.py's PyTorch-default init (the LM's
N(0, 1) tied embedding gives logits of std ~16 and a first loss ~170).

FLOPs per training step (forward + backward, multiply-add = 2 FLOPs), counted analytically:
  6 * sum over every matmul weight W (Linear, patch Conv as a matmul, tied LM head) of
      numel(W) * (number of rows it multiplies: B*T for per-token layers, B for the BERT pooler and
      classifier, B*N_patches for the patch conv, B for the ViT head (cls token only))
  + 12 * L * B * T^2 * C   (attention: Q.K^T and P.V, 2*B*T^2*C each forward, x3 for fwd + bwd)
Biases, LayerNorm, softmax, GELU, embeddings gathers, the loss and the optimizer are not counted
(they are memory bound and a few % of the total). The factor 6 = 2 (forward) + 4 (backward: the
input gradient and the weight gradient, one GEMM each); it slightly over-counts the first layer,
whose input gradient is not needed.
"""
import functools
import os
import sys

import numpy as np
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "tests", "parity"))
from models import TinyBert, TinyGpt2, TinyVit  # noqa: E402


def hf_init(module, std=0.02):
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            nn.init.normal_(m.weight, 0.0, std)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, 0.0, std)
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
    return module


class BertMiniCls(nn.Module):
    H, L, A, FFN, T, VOCAB, LABELS = 256, 4, 4, 1024, 128, 30522, 2

    def __init__(self):
        super().__init__()
        self.bert = TinyBert(vocab=self.VOCAB, d=self.H, heads=self.A, ffn=self.FFN, layers=self.L,
                             max_pos=512, types=2, labels=self.LABELS, dropout=0.0)
        hf_init(self)

    def forward(self, input_ids, attention_mask, token_type_ids, labels):
        logits, _ = self.bert(input_ids, attention_mask, token_type_ids)
        return F.cross_entropy(logits, labels)


class BertBaseCls(BertMiniCls):
    H, L, A, FFN = 768, 12, 12, 3072


class Gpt2TinyLm(nn.Module):
    H, L, A, T, VOCAB = 256, 4, 4, 256, 50257

    def __init__(self):
        super().__init__()
        self.gpt = TinyGpt2(vocab=self.VOCAB, d=self.H, heads=self.A, layers=self.L, n_pos=1024)
        hf_init(self)

    def forward(self, input_ids, labels):  # Transformers-style shifted LM loss
        logits = self.gpt(input_ids)
        v = logits.size(-1)
        return F.cross_entropy(logits[:, :-1, :].reshape(-1, v), labels[:, 1:].reshape(-1),
                               ignore_index=-100)


class Gpt2SmallLm(Gpt2TinyLm):
    H, L, A = 768, 12, 12


class LlamaBenchLm(nn.Module):
    """bench/llama_bench.py's Llama as a module whose forward returns the causal-LM loss."""
    T, VOCAB, H, L, HEADS, KV_HEADS, FFN = 128, 32000, 768, 12, 12, 4, 2048

    def __init__(self):
        super().__init__()
        import transformers as tr
        self.m = tr.LlamaForCausalLM(tr.LlamaConfig(
            hidden_size=self.H, num_hidden_layers=self.L, num_attention_heads=self.HEADS,
            num_key_value_heads=self.KV_HEADS, intermediate_size=self.FFN, vocab_size=self.VOCAB,
            max_position_embeddings=1024, tie_word_embeddings=False))

    def forward(self, input_ids, labels):
        return self.m(input_ids=input_ids, labels=labels).loss


class VitTinyCls(nn.Module):
    H, L, A, FFN, IMAGE, PATCH, CLASSES = 192, 6, 3, 768, 28, 4, 10

    def __init__(self):
        super().__init__()
        self.vit = TinyVit(image=self.IMAGE, patch=self.PATCH, chans=1, d=self.H, heads=self.A,
                           ffn=self.FFN, layers=self.L, classes=self.CLASSES)
        hf_init(self)  # cls_token and pos are N(0, 0.02) already

    def forward(self, pixel_values, labels):
        return F.cross_entropy(self.vit(pixel_values), labels)


# ------------------------------------------------------------------------------------------------
# Synthetic datasets: numpy arrays keyed by the exported input names, first dimension = sample.


def bert_data(n, rng, c=BertMiniCls):
    types = np.zeros((n, c.T), np.int64)
    types[:, c.T // 2:] = 1
    return {"input_ids": rng.integers(0, c.VOCAB, (n, c.T), dtype=np.int64),
            "attention_mask": np.ones((n, c.T), np.int64),
            "token_type_ids": types,
            "labels": rng.integers(0, c.LABELS, (n,), dtype=np.int64)}


def gpt2_data(n, rng, c=Gpt2TinyLm):
    ids = rng.integers(0, c.VOCAB, (n, c.T), dtype=np.int64)
    return {"input_ids": ids, "labels": ids.copy()}


def vit_data(n, rng):
    c = VitTinyCls
    return {"pixel_values": rng.standard_normal((n, 1, c.IMAGE, c.IMAGE)).astype(np.float32),
            "labels": rng.integers(0, c.CLASSES, (n,), dtype=np.int64)}


# ------------------------------------------------------------------------------------------------
# Analytic FLOPs per training step (see the module docstring).


def _encoder_layer_matmul_params(h, ffn):
    return 4 * h * h + 2 * h * ffn  # q, k, v, o + fc1, fc2


def bert_flops(b, c=BertMiniCls):
    tokens = b * c.T
    per_token = c.L * _encoder_layer_matmul_params(c.H, c.FFN)
    per_seq = c.H * c.H + c.H * c.LABELS  # pooler + classifier, on the [CLS] row only
    return 6 * (per_token * tokens + per_seq * b) + 12 * c.L * b * c.T ** 2 * c.H


def gpt2_flops(b, c=Gpt2TinyLm):
    tokens = b * c.T
    per_token = c.L * _encoder_layer_matmul_params(c.H, 4 * c.H) + c.H * c.VOCAB  # + tied LM head
    return 6 * per_token * tokens + 12 * c.L * b * c.T ** 2 * c.H


def llama_flops(b, c=LlamaBenchLm):
    kv = c.H * c.KV_HEADS // c.HEADS  # k and v projections' width (GQA)
    per_token = c.L * (2 * c.H * c.H + 2 * c.H * kv + 3 * c.H * c.FFN) + c.H * c.VOCAB
    return 6 * per_token * b * c.T + 12 * c.L * b * c.T ** 2 * c.H


def vit_flops(b):
    c = VitTinyCls
    n_patch = (c.IMAGE // c.PATCH) ** 2
    t = n_patch + 1
    patch_params = c.H * c.PATCH * c.PATCH  # Conv2d(1, H, 4, stride 4) as a [B*49, 16] x [16, H] matmul
    return (6 * (c.L * _encoder_layer_matmul_params(c.H, c.FFN) * b * t + patch_params * b * n_patch
                 + c.H * c.CLASSES * b)
            + 12 * c.L * b * t ** 2 * c.H)


# name -> spec. `inputs`: exported input names in forward() order; `axes`: dynamic (batch) axes.
SPECS = {
    "bert-mini": dict(ctor=BertMiniCls, seed=1, batch=16, data=bert_data, flops=bert_flops,
                      inputs=["input_ids", "attention_mask", "token_type_ids", "labels"],
                      desc="BERT-like H256 L4 A4, seq 128, vocab 30522, 2 labels, batch 16"),
    "gpt2-tiny": dict(ctor=Gpt2TinyLm, seed=2, batch=8, data=gpt2_data, flops=gpt2_flops,
                      inputs=["input_ids", "labels"],
                      desc="GPT-2-like H256 L4 A4, seq 256, vocab 50257, tied LM head, batch 8"),
    "vit-tiny": dict(ctor=VitTinyCls, seed=3, batch=64, data=vit_data, flops=vit_flops,
                     inputs=["pixel_values", "labels"],
                     desc="ViT-like H192 L6 A3, 28x28x1, 4x4 patches, 10 classes, batch 64"),
}
ALL_SPECS = dict(SPECS)
ALL_SPECS.update({
    "bert-base": dict(ctor=BertBaseCls, seed=4, batch=8,
                      data=functools.partial(bert_data, c=BertBaseCls),
                      flops=functools.partial(bert_flops, c=BertBaseCls),
                      inputs=["input_ids", "attention_mask", "token_type_ids", "labels"],
                      desc="BERT-base H768 L12 A12, seq 128, vocab 30522, 2 labels, batch 8"),
    "gpt2-small": dict(ctor=Gpt2SmallLm, seed=5, batch=4,
                       data=functools.partial(gpt2_data, c=Gpt2SmallLm),
                       flops=functools.partial(gpt2_flops, c=Gpt2SmallLm),
                       inputs=["input_ids", "labels"],
                       desc="GPT-2 small (124M) H768 L12 A12, seq 256, vocab 50257, tied LM head, "
                            "batch 4"),
})
# bf16_bench.py's models: ALL_SPECS and the Llama, which is not exported (so not train_bench's:
# ORT Training needs the ONNX file)
BF16_SPECS = dict(ALL_SPECS)
BF16_SPECS.update({
    "llama": dict(ctor=LlamaBenchLm, seed=6, batch=4,
                  data=functools.partial(gpt2_data, c=LlamaBenchLm), flops=llama_flops,
                  inputs=["input_ids", "labels"], hf_folder=True,
                  desc="Llama 110M (llama_bench.py) H768 L12 GQA 12:4 SwiGLU 2048, seq 128, "
                       "vocab 32000, batch 4"),
})
for _s in BF16_SPECS.values():
    _s["axes"] = {k: {0: "batch"} for k in _s["inputs"]}


def no_decay(name, param):
    """onyx's rule (train::hf_decay_mask with generic_onnx): no weight decay for biases,
    LayerNorm-like names, and every tensor of rank <= 1."""
    n = name.lower()
    return (param.dim() <= 1 or "bias" in n or "layernorm" in n or "layer_norm" in n or "ln_" in n
            or "norm" in n)


def param_groups(model, weight_decay):
    decay, other = [], []
    for n, p in model.named_parameters():  # tied weights appear once
        (other if no_decay(n, p) else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": other, "weight_decay": 0.0}]
