"""test_hf_models.py — parity of onyx's Hugging Face builders with PyTorch modules that have
Transformers' exact module structure and parameter names, written here so that each module's wiring
is visible (tests/parity/test_hf_trainer.py and test_hf_exports.py use the real transformers
classes): BertForSequenceClassification / ...ForTokenClassification / ...ForMaskedLM,
RobertaForSequenceClassification, DistilBertForSequenceClassification, GPT2LMHeadModel (Conv1D,
tied lm_head) and ViTForImageClassification.

Each model is randomly initialized (biases and LayerNorm parameters too, so their wiring shows),
its state_dict written as model.safetensors (with the tied copies and buffers a Transformers
checkpoint carries) next to a config.json; then
  - `onyx run FOLDER --inputs IN --output OUT` at two (batch, sequence) shapes: "logits" within
    rtol 1e-4 / atol 1e-5 of PyTorch in eval mode;
  - `onyx grad FOLDER --inputs IN --output OUT --no-dropout`, when `onyx grad` accepts a folder:
    the loss and every parameter's gradient within rtol 1e-4 / atol 1e-6 (else skipped, saying why).

Run: ONYX=build/onyx build/venv/bin/python tests/parity/test_hf_models.py
Prints one line per case and ends with "N passed, M failed, K skipped"; exits 1 if any failed.
"""
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st_io  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ONYX = os.environ.get("ONYX", os.path.join(REPO, "build", "onyx"))
RTOL, ATOL = 1e-4, 1e-5            # forward
GRAD_RTOL, GRAD_ATOL = 1e-4, 1e-6  # loss and gradients
FMIN = torch.finfo(torch.float32).min

torch.set_num_threads(1)


def act_fn(name):
    if name == "gelu":
        return F.gelu
    if name in ("gelu_new", "gelu_pytorch_tanh"):  # Transformers' NewGELUActivation
        return lambda x: 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))
    if name == "relu":
        return F.relu
    raise ValueError(name)


def extended_mask(mask):
    """Transformers' get_extended_attention_mask: (B,T) -> (B,1,1,T) additive."""
    m = mask[:, None, None, :].to(torch.float32)
    return (1.0 - m) * FMIN


class Cfg:
    def __init__(self, **kw):
        self.__dict__.update(kw)
        if "id2label" in kw:
            self.num_labels = len(kw["id2label"])


# ---- BERT / RoBERTa ---------------------------------------------------------------------------

class BertEmbeddings(nn.Module):
    def __init__(self, c, roberta):
        super().__init__()
        self.word_embeddings = nn.Embedding(c.vocab_size, c.hidden_size, padding_idx=c.pad_token_id)
        self.position_embeddings = nn.Embedding(c.max_position_embeddings, c.hidden_size,
                                                padding_idx=c.pad_token_id if roberta else None)
        self.token_type_embeddings = nn.Embedding(c.type_vocab_size, c.hidden_size)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.dropout = nn.Dropout(c.hidden_dropout_prob)
        self.register_buffer("position_ids", torch.arange(c.max_position_embeddings).expand((1, -1)))
        self.roberta, self.pad = roberta, c.pad_token_id

    def forward(self, input_ids, token_type_ids=None):
        t = input_ids.shape[1]
        if self.roberta:  # create_position_ids_from_input_ids
            m = input_ids.ne(self.pad).int()
            position_ids = (torch.cumsum(m, dim=1).type_as(m) * m).long() + self.pad
        else:
            position_ids = self.position_ids[:, :t]
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        emb = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
        emb = emb + self.position_embeddings(position_ids)
        return self.dropout(self.LayerNorm(emb))


class BertSelfAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.nh, self.hs = c.num_attention_heads, c.hidden_size // c.num_attention_heads
        self.query = nn.Linear(c.hidden_size, c.hidden_size)
        self.key = nn.Linear(c.hidden_size, c.hidden_size)
        self.value = nn.Linear(c.hidden_size, c.hidden_size)
        self.dropout = nn.Dropout(c.attention_probs_dropout_prob)

    def split(self, x):
        return x.view(x.size()[:-1] + (self.nh, self.hs)).permute(0, 2, 1, 3)

    def forward(self, h, mask):
        q, k, v = self.split(self.query(h)), self.split(self.key(h)), self.split(self.value(h))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.hs) + mask
        probs = self.dropout(F.softmax(scores, dim=-1))
        ctx = torch.matmul(probs, v).permute(0, 2, 1, 3).contiguous()
        return ctx.view(ctx.size()[:-2] + (self.nh * self.hs,))


class BertResidualOutput(nn.Module):  # BertSelfOutput / BertOutput
    def __init__(self, c, d_in):
        super().__init__()
        self.dense = nn.Linear(d_in, c.hidden_size)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.dropout = nn.Dropout(c.hidden_dropout_prob)

    def forward(self, x, inp):
        return self.LayerNorm(self.dropout(self.dense(x)) + inp)


class BertAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.self = BertSelfAttention(c)
        self.output = BertResidualOutput(c, c.hidden_size)

    def forward(self, h, mask):
        return self.output(self.self(h, mask), h)


class BertIntermediate(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.dense = nn.Linear(c.hidden_size, c.intermediate_size)
        self.act = act_fn(c.hidden_act)

    def forward(self, x):
        return self.act(self.dense(x))


class BertLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.attention = BertAttention(c)
        self.intermediate = BertIntermediate(c)
        self.output = BertResidualOutput(c, c.intermediate_size)

    def forward(self, h, mask):
        a = self.attention(h, mask)
        return self.output(self.intermediate(a), a)


class BertEncoder(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.layer = nn.ModuleList([BertLayer(c) for _ in range(c.num_hidden_layers)])

    def forward(self, h, mask):
        for layer in self.layer:
            h = layer(h, mask)
        return h


class BertPooler(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.dense = nn.Linear(c.hidden_size, c.hidden_size)

    def forward(self, h):
        return torch.tanh(self.dense(h[:, 0]))


class BertModel(nn.Module):
    def __init__(self, c, roberta=False, pooler=True):
        super().__init__()
        self.embeddings = BertEmbeddings(c, roberta)
        self.encoder = BertEncoder(c)
        self.pooler = BertPooler(c) if pooler else None

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        h = self.encoder(self.embeddings(input_ids, token_type_ids), extended_mask(attention_mask))
        return h, (self.pooler(h) if self.pooler is not None else None)


class BertForSequenceClassification(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.bert = BertModel(c)
        self.dropout = nn.Dropout(c.hidden_dropout_prob)
        self.classifier = nn.Linear(c.hidden_size, c.num_labels)

    def forward(self, input_ids, attention_mask, token_type_ids):
        return self.classifier(self.dropout(self.bert(input_ids, attention_mask, token_type_ids)[1]))


class BertForTokenClassification(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.bert = BertModel(c, pooler=False)
        self.dropout = nn.Dropout(c.hidden_dropout_prob)
        self.classifier = nn.Linear(c.hidden_size, c.num_labels)

    def forward(self, input_ids, attention_mask, token_type_ids):
        return self.classifier(self.dropout(self.bert(input_ids, attention_mask, token_type_ids)[0]))


class BertPredictionHeadTransform(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.dense = nn.Linear(c.hidden_size, c.hidden_size)
        self.act = act_fn(c.hidden_act)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)

    def forward(self, x):
        return self.LayerNorm(self.act(self.dense(x)))


class BertLMPredictionHead(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.transform = BertPredictionHeadTransform(c)
        self.decoder = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        self.bias = nn.Parameter(torch.zeros(c.vocab_size))
        self.decoder.bias = self.bias

    def forward(self, x):
        return self.decoder(self.transform(x))


class BertOnlyMLMHead(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.predictions = BertLMPredictionHead(c)

    def forward(self, x):
        return self.predictions(x)


class BertForMaskedLM(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.bert = BertModel(c, pooler=False)
        self.cls = BertOnlyMLMHead(c)
        self.cls.predictions.decoder.weight = self.bert.embeddings.word_embeddings.weight  # tied

    def forward(self, input_ids, attention_mask, token_type_ids):
        return self.cls(self.bert(input_ids, attention_mask, token_type_ids)[0])


class RobertaClassificationHead(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.dense = nn.Linear(c.hidden_size, c.hidden_size)
        self.dropout = nn.Dropout(c.hidden_dropout_prob)
        self.out_proj = nn.Linear(c.hidden_size, c.num_labels)

    def forward(self, h):
        x = torch.tanh(self.dense(self.dropout(h[:, 0, :])))
        return self.out_proj(self.dropout(x))


class RobertaForSequenceClassification(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.roberta = BertModel(c, roberta=True, pooler=False)
        self.classifier = RobertaClassificationHead(c)

    def forward(self, input_ids, attention_mask):
        return self.classifier(self.roberta(input_ids, attention_mask)[0])


# ---- DistilBERT -------------------------------------------------------------------------------

class DistilEmbeddings(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.word_embeddings = nn.Embedding(c.vocab_size, c.dim, padding_idx=c.pad_token_id)
        self.position_embeddings = nn.Embedding(c.max_position_embeddings, c.dim)
        self.LayerNorm = nn.LayerNorm(c.dim, eps=1e-12)
        self.dropout = nn.Dropout(c.dropout)

    def forward(self, ids):
        pos = torch.arange(ids.size(1), dtype=torch.long)[None, :]
        return self.dropout(self.LayerNorm(self.word_embeddings(ids) + self.position_embeddings(pos)))


class MultiHeadSelfAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.nh, self.dim = c.n_heads, c.dim
        self.dropout = nn.Dropout(c.attention_dropout)
        self.q_lin, self.k_lin = nn.Linear(c.dim, c.dim), nn.Linear(c.dim, c.dim)
        self.v_lin, self.out_lin = nn.Linear(c.dim, c.dim), nn.Linear(c.dim, c.dim)

    def forward(self, x, mask):
        bs, t, _ = x.size()
        hs = self.dim // self.nh

        def shape(v):
            return v.view(bs, -1, self.nh, hs).transpose(1, 2)

        q = shape(self.q_lin(x)) / math.sqrt(hs)
        k, v = shape(self.k_lin(x)), shape(self.v_lin(x))
        scores = torch.matmul(q, k.transpose(2, 3))
        m = (mask == 0).view(bs, 1, 1, t).expand_as(scores)
        scores = scores.masked_fill(m, torch.tensor(torch.finfo(scores.dtype).min))
        w = self.dropout(F.softmax(scores, dim=-1))
        ctx = torch.matmul(w, v).transpose(1, 2).contiguous().view(bs, -1, self.nh * hs)
        return self.out_lin(ctx)


class FFN(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.dropout = nn.Dropout(c.dropout)
        self.lin1, self.lin2 = nn.Linear(c.dim, c.hidden_dim), nn.Linear(c.hidden_dim, c.dim)
        self.activation = act_fn(c.activation)

    def forward(self, x):
        return self.dropout(self.lin2(self.activation(self.lin1(x))))


class TransformerBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.attention = MultiHeadSelfAttention(c)
        self.sa_layer_norm = nn.LayerNorm(c.dim, eps=1e-12)
        self.ffn = FFN(c)
        self.output_layer_norm = nn.LayerNorm(c.dim, eps=1e-12)

    def forward(self, x, mask):
        sa = self.sa_layer_norm(self.attention(x, mask) + x)
        return self.output_layer_norm(self.ffn(sa) + sa)


class DistilTransformer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.layer = nn.ModuleList([TransformerBlock(c) for _ in range(c.n_layers)])

    def forward(self, x, mask):
        for layer in self.layer:
            x = layer(x, mask)
        return x


class DistilBertModel(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embeddings = DistilEmbeddings(c)
        self.transformer = DistilTransformer(c)

    def forward(self, ids, mask):
        return self.transformer(self.embeddings(ids), mask)


class DistilBertForSequenceClassification(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.distilbert = DistilBertModel(c)
        self.pre_classifier = nn.Linear(c.dim, c.dim)
        self.classifier = nn.Linear(c.dim, c.num_labels)
        self.dropout = nn.Dropout(c.seq_classif_dropout)

    def forward(self, input_ids, attention_mask):
        h = self.distilbert(input_ids, attention_mask)[:, 0]
        return self.classifier(self.dropout(F.relu(self.pre_classifier(h))))


# ---- GPT-2 ------------------------------------------------------------------------------------

class Conv1D(nn.Module):
    def __init__(self, nf, nx):
        super().__init__()
        self.nf = nf
        self.weight = nn.Parameter(torch.empty(nx, nf))
        self.bias = nn.Parameter(torch.zeros(nf))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, x):
        size_out = x.size()[:-1] + (self.nf,)
        return torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight).view(size_out)


class GPT2Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        n = c.n_positions
        self.register_buffer("bias", torch.tril(torch.ones((n, n), dtype=torch.bool)).view(1, 1, n, n))
        self.register_buffer("masked_bias", torch.tensor(-1e4))
        self.nh, self.hs, self.e = c.n_head, c.n_embd // c.n_head, c.n_embd
        self.c_attn = Conv1D(3 * c.n_embd, c.n_embd)
        self.c_proj = Conv1D(c.n_embd, c.n_embd)
        self.attn_dropout = nn.Dropout(c.attn_pdrop)
        self.resid_dropout = nn.Dropout(c.resid_pdrop)

    def split(self, x):
        return x.view(x.size()[:-1] + (self.nh, self.hs)).permute(0, 2, 1, 3)

    def forward(self, h, mask):
        q, k, v = self.c_attn(h).split(self.e, dim=2)
        q, k, v = self.split(q), self.split(k), self.split(v)
        w = torch.matmul(q, k.transpose(-1, -2))
        w = w / torch.full([], v.size(-1) ** 0.5, dtype=w.dtype)
        t = q.size(-2)
        causal = self.bias[:, :, :t, :t]
        w = torch.where(causal, w, torch.full([], FMIN, dtype=w.dtype))
        w = w + mask
        w = self.attn_dropout(F.softmax(w, dim=-1))
        a = torch.matmul(w, v).permute(0, 2, 1, 3).contiguous()
        a = a.view(a.size()[:-2] + (self.e,))
        return self.resid_dropout(self.c_proj(a))


class GPT2MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        inner = c.n_inner or 4 * c.n_embd
        self.c_fc = Conv1D(inner, c.n_embd)
        self.c_proj = Conv1D(c.n_embd, inner)
        self.act = act_fn(c.activation_function)
        self.dropout = nn.Dropout(c.resid_pdrop)

    def forward(self, x):
        return self.dropout(self.c_proj(self.act(self.c_fc(x))))


class GPT2Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln_1 = nn.LayerNorm(c.n_embd, eps=c.layer_norm_epsilon)
        self.attn = GPT2Attention(c)
        self.ln_2 = nn.LayerNorm(c.n_embd, eps=c.layer_norm_epsilon)
        self.mlp = GPT2MLP(c)

    def forward(self, h, mask):
        h = self.attn(self.ln_1(h), mask) + h
        return h + self.mlp(self.ln_2(h))


class GPT2Model(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.wte = nn.Embedding(c.vocab_size, c.n_embd)
        self.wpe = nn.Embedding(c.n_positions, c.n_embd)
        self.drop = nn.Dropout(c.embd_pdrop)
        self.h = nn.ModuleList([GPT2Block(c) for _ in range(c.n_layer)])
        self.ln_f = nn.LayerNorm(c.n_embd, eps=c.layer_norm_epsilon)

    def forward(self, input_ids, attention_mask):
        pos = torch.arange(input_ids.size(-1), dtype=torch.long)[None]
        h = self.drop(self.wte(input_ids) + self.wpe(pos))
        mask = extended_mask(attention_mask)
        for block in self.h:
            h = block(h, mask)
        return self.ln_f(h)


class GPT2LMHeadModel(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.transformer = GPT2Model(c)
        self.lm_head = nn.Linear(c.n_embd, c.vocab_size, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied

    def forward(self, input_ids, attention_mask):
        return self.lm_head(self.transformer(input_ids, attention_mask))


# ---- ViT --------------------------------------------------------------------------------------

class ViTPatchEmbeddings(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.projection = nn.Conv2d(c.num_channels, c.hidden_size, kernel_size=c.patch_size,
                                    stride=c.patch_size)

    def forward(self, x):
        return self.projection(x).flatten(2).transpose(1, 2)


class ViTEmbeddings(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.cls_token = nn.Parameter(torch.randn(1, 1, c.hidden_size))
        self.patch_embeddings = ViTPatchEmbeddings(c)
        n = (c.image_size // c.patch_size) ** 2
        self.position_embeddings = nn.Parameter(torch.randn(1, n + 1, c.hidden_size))
        self.dropout = nn.Dropout(c.hidden_dropout_prob)

    def forward(self, px):
        e = self.patch_embeddings(px)
        cls = self.cls_token.expand(px.shape[0], -1, -1)
        return self.dropout(torch.cat((cls, e), dim=1) + self.position_embeddings)


class ViTSelfOutput(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.dense = nn.Linear(c.hidden_size, c.hidden_size)
        self.dropout = nn.Dropout(c.hidden_dropout_prob)

    def forward(self, x):
        return self.dropout(self.dense(x))


class ViTAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.attention = BertSelfAttention(c)
        self.output = ViTSelfOutput(c)

    def forward(self, h):
        return self.output(self.attention(h, 0.0))


class ViTOutput(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.dense = nn.Linear(c.intermediate_size, c.hidden_size)
        self.dropout = nn.Dropout(c.hidden_dropout_prob)

    def forward(self, x, inp):
        return self.dropout(self.dense(x)) + inp


class ViTLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.attention = ViTAttention(c)
        self.intermediate = BertIntermediate(c)
        self.output = ViTOutput(c)
        self.layernorm_before = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.layernorm_after = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)

    def forward(self, h):
        h = self.attention(self.layernorm_before(h)) + h
        return self.output(self.intermediate(self.layernorm_after(h)), h)


class ViTEncoder(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.layer = nn.ModuleList([ViTLayer(c) for _ in range(c.num_hidden_layers)])

    def forward(self, h):
        for layer in self.layer:
            h = layer(h)
        return h


class ViTModel(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embeddings = ViTEmbeddings(c)
        self.encoder = ViTEncoder(c)
        self.layernorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)

    def forward(self, px):
        return self.layernorm(self.encoder(self.embeddings(px)))


class ViTForImageClassification(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.vit = ViTModel(c)
        self.classifier = nn.Linear(c.hidden_size, c.num_labels)

    def forward(self, pixel_values):
        return self.classifier(self.vit(pixel_values)[:, 0, :])


# ---- cases ------------------------------------------------------------------------------------

BERT_CFG = dict(model_type="bert", hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=48, hidden_act="gelu", hidden_dropout_prob=0.1,
                attention_probs_dropout_prob=0.1, max_position_embeddings=40, type_vocab_size=2,
                vocab_size=80, pad_token_id=0, layer_norm_eps=1e-12, initializer_range=0.02,
                id2label={"0": "A", "1": "B", "2": "C"})
ROBERTA_CFG = dict(BERT_CFG, model_type="roberta", pad_token_id=1, type_vocab_size=1,
                   layer_norm_eps=1e-5, max_position_embeddings=42)
DISTIL_CFG = dict(model_type="distilbert", dim=32, n_layers=2, n_heads=4, hidden_dim=64,
                  activation="gelu", dropout=0.1, attention_dropout=0.1, seq_classif_dropout=0.2,
                  max_position_embeddings=40, vocab_size=80, pad_token_id=0, initializer_range=0.02,
                  num_labels=2)
GPT2_CFG = dict(model_type="gpt2", n_embd=32, n_layer=2, n_head=4, n_inner=None,
                activation_function="gelu_new", resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1,
                layer_norm_epsilon=1e-5, n_positions=32, vocab_size=90, initializer_range=0.02)
VIT_CFG = dict(model_type="vit", hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
               intermediate_size=64, hidden_act="gelu", hidden_dropout_prob=0.0,
               attention_probs_dropout_prob=0.0, layer_norm_eps=1e-12, image_size=16, patch_size=4,
               num_channels=3, qkv_bias=True, initializer_range=0.02, num_labels=10)


def text_inputs(g, b, t, vocab, types=True, pad=0):
    ids = torch.randint(2, vocab, (b, t), generator=g)
    mask = torch.ones(b, t, dtype=torch.long)
    for i in range(1, b):  # later rows padded at the end
        n = min(2 * i, t - 1)
        mask[i, t - n:] = 0
        ids[i, t - n:] = pad
    d = {"input_ids": ids, "attention_mask": mask}
    if types:
        tt = torch.zeros(b, t, dtype=torch.long)
        tt[:, t // 2:] = 1
        d["token_type_ids"] = tt
    return d


def cls_labels(g, b, t, n):
    return torch.randint(0, n, (b,), generator=g)


# Token-level labels are -100 at padding, as Transformers' data collators make them. (A padding
# token that reaches the loss would also differ: nn.Embedding(padding_idx) gives the padding row no
# gradient, which a standard ONNX Gather cannot express.)
def tok_labels(g, b, t, n, inputs):
    y = torch.randint(0, n, (b, t), generator=g)
    y[:, 0] = -100
    y[inputs["attention_mask"] == 0] = -100
    return y


def mlm_labels(g, b, t, n, inputs):
    y = torch.full((b, t), -100, dtype=torch.long)
    y[:, 1::3] = torch.randint(0, n, (b, len(range(1, t, 3))), generator=g)
    y[inputs["attention_mask"] == 0] = -100
    return y


def lm_labels(ids):
    return ids.clone()


# name, class, config, arch, inputs(g, b, t), labels(g, b, t, inputs), loss kind, shapes
CASES = [
    ("bert-seqcls", BertForSequenceClassification, BERT_CFG, "BertForSequenceClassification",
     lambda g, b, t: text_inputs(g, b, t, 80), lambda g, b, t, i: cls_labels(g, b, t, 3), "ce",
     [(2, 7), (3, 12)]),
    ("bert-tokcls", BertForTokenClassification, BERT_CFG, "BertForTokenClassification",
     lambda g, b, t: text_inputs(g, b, t, 80), lambda g, b, t, i: tok_labels(g, b, t, 3, i), "ce",
     [(2, 6), (2, 11)]),
    ("bert-mlm", BertForMaskedLM, BERT_CFG, "BertForMaskedLM",
     lambda g, b, t: text_inputs(g, b, t, 80), lambda g, b, t, i: mlm_labels(g, b, t, 80, i), "ce",
     [(2, 8), (3, 5)]),
    ("roberta-seqcls", RobertaForSequenceClassification, ROBERTA_CFG,
     "RobertaForSequenceClassification",
     lambda g, b, t: text_inputs(g, b, t, 80, types=False, pad=1),
     lambda g, b, t, i: cls_labels(g, b, t, 3), "ce", [(2, 7), (3, 10)]),
    ("distilbert-seqcls", DistilBertForSequenceClassification, DISTIL_CFG,
     "DistilBertForSequenceClassification",
     lambda g, b, t: text_inputs(g, b, t, 80, types=False),
     lambda g, b, t, i: cls_labels(g, b, t, 2), "ce", [(2, 9), (3, 4)]),
    ("gpt2-lm", GPT2LMHeadModel, GPT2_CFG, "GPT2LMHeadModel",
     lambda g, b, t: text_inputs(g, b, t, 90, types=False),
     lambda g, b, t, i: lm_labels(i["input_ids"]), "causal", [(2, 9), (1, 16)]),
    ("vit-imgcls", ViTForImageClassification, VIT_CFG, "ViTForImageClassification",
     lambda g, b, t: {"pixel_values": torch.randn(b, 3, 16, 16, generator=g)},
     lambda g, b, t, i: cls_labels(g, b, t, 10), "ce", [(2, None), (5, None)]),
]


def randomize(model, g):
    """Random weights everywhere (LayerNorm weights around 1, padding rows zero), so every
    parameter's wiring shows in the outputs."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("LayerNorm.weight") or "layer_norm.weight" in name or \
                    "layernorm" in name and name.endswith("weight") or ".ln_" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
        for m in model.modules():
            if isinstance(m, nn.Embedding) and m.padding_idx is not None:
                m.weight[m.padding_idx].zero_()


def checkpoint(model):
    """The state_dict as Transformers saves it: tied copies and buffers included."""
    return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


def compare(got, want, rtol, atol):
    if got.shape != want.shape:
        return False, float("inf"), f"shape {got.shape} != {want.shape}"
    g64, w64 = got.astype(np.float64), want.astype(np.float64)
    if not np.all(np.isfinite(g64)):
        return False, float("inf"), "non-finite values"
    diff = np.abs(g64 - w64)
    ok = bool(np.all(diff <= atol + rtol * np.abs(w64)))
    return ok, float(np.max(diff / (np.abs(w64) + atol / rtol))) if diff.size else 0.0, ""


def torch_loss(kind, logits, labels):
    if kind == "causal":
        logits, labels = logits[..., :-1, :], labels[..., 1:]
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1), ignore_index=-100)


def onyx(*args):
    p = subprocess.run([ONYX, *args], capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        err = (p.stderr.strip() or p.stdout.strip()).splitlines()
        raise RuntimeError(f"onyx {args[0]} exited {p.returncode}: {err[-1] if err else '(no output)'}")
    return p.stdout


def grad_wired():
    """`onyx grad` takes a folder once the lead wires grad_hf_folder_cli into cmd_grad.cc."""
    p = subprocess.run([ONYX, "grad", "--help"], capture_output=True, text=True, timeout=60)
    return "folder" in (p.stdout + p.stderr).lower()


def main():
    if not (os.path.isfile(ONYX) and os.access(ONYX, os.X_OK)):
        print(f"FAIL setup: onyx binary not found at {ONYX} (set ONYX=...)")
        print("0 passed, 1 failed")
        return 1
    t0 = time.time()
    tmp = tempfile.mkdtemp(prefix="onyx-hf-parity-")
    passed = failed = skipped = 0
    do_grads = grad_wired()
    try:
        for ci, (name, cls, cfg, arch, make_in, make_lab, kind, shapes) in enumerate(CASES):
            torch.manual_seed(100 + ci)
            model = cls(Cfg(**cfg)).eval()
            g = torch.Generator().manual_seed(200 + ci)
            randomize(model, g)
            folder = os.path.join(tmp, name)
            os.makedirs(folder)
            st_io.save(os.path.join(folder, "model.safetensors"), checkpoint(model), {"format": "pt"})
            with open(os.path.join(folder, "config.json"), "w") as f:
                json.dump(dict(cfg, architectures=[arch]), f, indent=2)
            for b, t in shapes:
                case = f"{name}/B{b}" + (f"T{t}" if t else "")
                inputs = make_in(g, b, t)
                labels = make_lab(g, b, t, inputs)
                in_path = os.path.join(tmp, case.replace("/", "_") + ".in.safetensors")
                out_path = in_path.replace(".in.", ".out.")
                st_io.save(in_path, {k: v.numpy() for k, v in dict(inputs, labels=labels).items()})
                # forward
                try:
                    with torch.no_grad():
                        ref = model(**inputs).numpy()
                    onyx("run", folder, "--inputs", in_path, "--output", out_path)
                    got = st_io.load(out_path)
                    if "logits" not in got:
                        ok, msg = False, f"no 'logits' output (got {sorted(got)})"
                    else:
                        ok, rel, note = compare(got["logits"], ref, RTOL, ATOL)
                        msg = note or f"logits max rel err {rel:.2e}"
                except Exception as e:
                    ok, msg = False, f"{type(e).__name__}: {e}"
                print(f"{'PASS' if ok else 'FAIL'} {case} forward: {msg}", flush=True)
                passed += ok
                failed += not ok
                # gradients
                if not do_grads:
                    print(f"SKIP {case} gradients: `onyx grad` does not take a checkpoint folder yet "
                          f"(wire models::grad_hf_folder_cli into tools/onyx/cmd_grad.cc)")
                    skipped += 1
                    continue
                try:
                    model.zero_grad()
                    loss = torch_loss(kind, model(**inputs), labels)
                    loss.backward()
                    grad_path = in_path.replace(".in.", ".grad.")
                    onyx("grad", folder, "--inputs", in_path, "--output", grad_path, "--no-dropout")
                    got = st_io.load(grad_path)
                    ok, worst, notes = True, 0.0, []
                    want = {"loss": loss.detach().numpy().reshape(())}
                    for k, p in model.named_parameters():  # tied copies appear once, by first name
                        want[k] = p.grad.numpy()
                    for k, w in want.items():
                        if k not in got:
                            ok = False
                            notes.append(f"'{k}' missing")
                            continue
                        o, rel, note = compare(got[k].reshape(w.shape) if got[k].size == w.size else got[k],
                                               w, GRAD_RTOL, GRAD_ATOL)
                        worst = max(worst, rel)
                        if not o:
                            ok = False
                            notes.append(f"{k}: {note or f'max rel {rel:.2e}'}")
                    extra = sorted(set(got) - set(want))
                    if extra:
                        ok = False
                        notes.append(f"unexpected gradients {extra[:3]}")
                    msg = f"loss + {len(want) - 1} gradients, max rel err {worst:.2e}"
                    if notes:
                        msg += "; " + "; ".join(notes[:4])
                except Exception as e:
                    ok, msg = False, f"{type(e).__name__}: {e}"
                print(f"{'PASS' if ok else 'FAIL'} {case} gradients: {msg}", flush=True)
                passed += ok
                failed += not ok
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"({time.time() - t0:.1f}s)")
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
