"""test_llama_family.py — onyx's Llama-family builders (src/models/llama.cc) against the real
Transformers classes: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM and
Qwen2ForSequenceClassification, each randomly initialized from a small config (RMSNorm weights
and biases randomized too, so their wiring shows), saved with save_pretrained, then
  - `onyx run FOLDER`: logits within 1e-4 (relative to the largest) of Transformers in eval mode
    (eager attention), at every unpadded position;
  - `onyx grad FOLDER --no-dropout`: the loss and every parameter's gradient within 1e-4
    (relative to that gradient's largest element) of loss.backward() in PyTorch.

Cases (one PASS / FAIL line each):
  llama-gqa        8 query heads over 2 key/value heads (4:1), untied lm_head, ragged padding
  llama-tied-bias  tied embeddings, attention_bias and mlp_bias, rope_type linear (factor 2)
  llama3-rope      rope_type llama3 (factor 8, low/high frequency factors, original length 16)
  llama-dynamic    rope_type dynamic at a sequence longer than max_position_embeddings (NTK
                   scaling active), one key/value head
  mistral-sliding  sliding_window 4 at sequence 11 (the window masks keys), GQA
  qwen2            q/k/v biases (and none on o_proj), GQA
  qwen2-seqcls     Qwen2ForSequenceClassification: the score at the last non-padding token
  llama-packed     two samples packed per row (position_ids restarting at 0): logits and every
                   gradient = Transformers' given the block-diagonal causal mask as a 4-D mask
                   (its eager / sdpa paths do not isolate packed samples from position_ids), and
                   a packed sample's logits = the sample's alone
  train-loss-falls `onyx train` on a Llama folder for 30 steps on token tensors (one repeated
                   sequence, so it is learnable): the logged loss falls below half its start

  bf16-loss-curve  `bf16: true` (bf16 GEMM inputs, float32 accumulation) for 200 steps: every
                   logged loss (10-step means) within 1% of onyx's float32 run and of PyTorch's
                   CPU autocast (bfloat16) training the same model the same way; the saved weights
                   float32 and the checkpoint's training_args.json bf16 true
  fp16-loss-curve  the same with `fp16: true` (emulated: float16-rounded GEMM inputs, float32
                   GEMMs) against PyTorch's CPU autocast float16 (Transformers' fp16=True on a
                   CPU: no gradient scaler)

  sft-completion-loss  `train_data: {type: sft}` with prompt / completion rows and GPT-2's
                   tokenizer: onyx's first loss = Transformers' on the rows tokenized by the
                   tokenizers library as TRL does (completion tokens only), 1e-5; and with
                   packing: true (rows of <= 40 tokens), = Transformers on the same packed rows
                   with the block-diagonal mask

Run: ONYX=build/onyx build/venv/bin/python tests/parity/test_llama_family.py [filter]
Ends with "N passed, M failed"; exits 1 if any case failed.
"""
import json
import os
import subprocess
import sys

import numpy as np
import torch
import transformers as tr
from case_runner import run_cases
from safetensors.numpy import load_file, save_file
from torch_train import train_like_onyx

ONYX = os.environ.get("ONYX", "build/onyx")
TOL = 1e-4
torch.set_num_threads(1)


def make(cls, **kw):
    base = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                num_attention_heads=8, max_position_embeddings=64)
    base.update(kw)
    cfg = cls.config_class(**base)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    m = cls(cfg)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if "norm" in n:
                p.normal_(1.0, 0.1)
            if n.endswith("bias"):
                p.normal_(0.0, 0.1)
    return m


def onyx(*args):
    p = subprocess.run([ONYX] + list(args), capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        raise AssertionError(f"onyx {args[0]} exited {p.returncode}: {p.stderr.strip()[-800:]}")
    return p


def check(tmp, name, model, feeds, valid, grads=True):
    d = os.path.join(tmp, name)
    model.save_pretrained(d)
    save_file(feeds, f"{d}/in.safetensors")
    onyx("run", d, "--inputs", f"{d}/in.safetensors", "--output", f"{d}/out.safetensors")
    got = load_file(f"{d}/out.safetensors")["logits"]
    model.train()  # dropout is 0 in these configs; train() as the gradient pass runs
    out = model(**{k: torch.tensor(v) for k, v in feeds.items()})
    ref = out.logits.detach().numpy()
    if got.shape != ref.shape:
        return False, f"logits shape {got.shape} vs Transformers {ref.shape}"
    lerr = float(np.abs(got - ref)[valid].max() / np.abs(ref).max())
    msg = f"logits rel {lerr:.1e}"
    ok = lerr < TOL
    if grads:
        out.loss.backward()
        onyx("grad", d, "--inputs", f"{d}/in.safetensors", "--output", f"{d}/g.safetensors",
             "--no-dropout")
        g = load_file(f"{d}/g.safetensors")
        loss_err = abs(float(g["loss"]) - out.loss.item()) / abs(out.loss.item())
        worst, wn, missing = 0.0, "", []
        for n, p in model.named_parameters():
            if n not in g:
                missing.append(n)
                continue
            ref_g = p.grad.numpy()
            e = float(np.abs(g[n] - ref_g).max() / (np.abs(ref_g).max() + 1e-30))
            if e > worst:
                worst, wn = e, n
        ok = ok and loss_err < TOL and worst < TOL and not missing
        msg += (f", loss rel {loss_err:.1e}, {sum(1 for _ in model.parameters())} gradients, "
                f"worst rel {worst:.1e} ({wn})" + (f", missing {missing}" if missing else ""))
    return ok, msg


def lm_feeds(b=3, t=11, seed=0, pad_rows=((1, 8), (2, 5))):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 97, (b, t)).astype(np.int64)
    mask = np.ones((b, t), np.int64)
    for r, k in pad_rows:
        mask[r, k:] = 0
    labels = ids.copy()
    labels[mask == 0] = -100
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}, mask.astype(bool)


def case_lm(tmp, name, cls, t=11, **kw):
    feeds, valid = lm_feeds(t=t)
    return check(tmp, name, make(cls, **kw), feeds, valid)


def packed_causal_mask(pos):
    """Transformers' 4-D additive mask (B,1,T,T) for packed rows: causal, and only within the
    sample (samples start where position_ids is 0)."""
    seg = np.cumsum(pos == 0, axis=1)
    t = pos.shape[1]
    keep = (seg[:, :, None] == seg[:, None, :]) & np.tril(np.ones((t, t), bool))
    return torch.tensor(np.where(keep[:, None], 0.0, np.finfo(np.float32).min).astype(np.float32))


def case_packed(tmp):
    """Two samples packed per row (position_ids restarting at 0): onyx reads the sample boundaries
    from position_ids, as flash-attention's variable-length path does for TRL's padding-free
    packing, so packed samples do not see each other. Transformers' eager and sdpa paths do not
    isolate them from position_ids alone (checked with 5.24), so the reference passes the same
    block-diagonal causal mask as a 4-D additive attention_mask."""
    m = make(tr.LlamaForCausalLM, num_key_value_heads=2)
    d = os.path.join(tmp, "packed")
    m.save_pretrained(d)
    rng = np.random.default_rng(5)
    ids = rng.integers(0, 97, (2, 12)).astype(np.int64)
    pos = np.array([list(range(5)) + list(range(7)), list(range(9)) + list(range(3))], np.int64)
    labels = ids.copy()
    labels[0, 5] = labels[1, 9] = -100  # no target across the boundary
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids), "position_ids": pos,
             "labels": labels}
    save_file(feeds, f"{d}/in.safetensors")
    onyx("run", d, "--inputs", f"{d}/in.safetensors", "--output", f"{d}/out.safetensors")
    onyx("grad", d, "--inputs", f"{d}/in.safetensors", "--output", f"{d}/g.safetensors",
         "--no-dropout")
    got, g = load_file(f"{d}/out.safetensors")["logits"], load_file(f"{d}/g.safetensors")
    m.train()
    mask4 = packed_causal_mask(pos)
    out = m(input_ids=torch.tensor(ids), position_ids=torch.tensor(pos), attention_mask=mask4,
            labels=torch.tensor(labels))
    out.loss.backward()
    ref = out.logits.detach().numpy()
    lerr = float(np.abs(got - ref).max() / np.abs(ref).max())
    gerr = max(float(np.abs(g[n] - p.grad.numpy()).max() / (np.abs(p.grad.numpy()).max() + 1e-30))
               for n, p in m.named_parameters())
    # the second sample alone gives the same logits as inside the pack: it sees nothing before it
    m.eval()
    with torch.no_grad():
        alone = m(input_ids=torch.tensor(ids[:1, 5:])).logits.numpy()
    serr = float(np.abs(got[0, 5:] - alone[0]).max() / np.abs(alone).max())
    ok = lerr < TOL and gerr < TOL and serr < TOL
    return ok, (f"logits rel {lerr:.1e}, gradients worst rel {gerr:.1e}; a packed sample = the "
                f"same sample alone (rel {serr:.1e})")


def case_seqcls(tmp):
    m = make(tr.Qwen2ForSequenceClassification, num_key_value_heads=2, pad_token_id=0,
             num_labels=3)
    rng = np.random.default_rng(1)
    ids = rng.integers(1, 97, (3, 9)).astype(np.int64)
    ids[1, 6:] = 0
    ids[2, 3:] = 0
    feeds = {"input_ids": ids, "attention_mask": (ids != 0).astype(np.int64),
             "labels": np.array([0, 1, 2], np.int64)}
    # The padding row of embed_tokens gets no gradient in PyTorch (nn.Embedding padding_idx);
    # onyx's BERT and Llama embeddings accumulate it (docs/ARCHITECTURE.md, known limits), so
    # compare the logits only here and the gradients on the causal-LM cases.
    return check(tmp, "qwen2-seqcls", m, feeds, np.ones((3, 3), bool), grads=False)


def case_train(tmp):
    m = make(tr.LlamaForCausalLM, num_key_value_heads=2)
    d = os.path.join(tmp, "train-llama")
    m.save_pretrained(d)
    rng = np.random.default_rng(2)
    ids = np.tile(rng.integers(0, 97, (1, 16)), (64, 1)).astype(np.int64)  # learnable: repeated
    save_file({"input_ids": ids, "attention_mask": np.ones_like(ids), "labels": ids},
              f"{d}/train.safetensors")
    cfg = {"model": d, "train_data": f"{d}/train.safetensors", "output_dir": f"{d}/out",
           "max_steps": 30, "per_device_train_batch_size": 8, "learning_rate": 3e-3,
           "logging_steps": 5, "save_strategy": "no", "disable_tqdm": True}
    with open(f"{d}/cfg.yaml", "w") as f:
        for k, v in cfg.items():
            f.write(f"{k}: {json.dumps(v)}\n")
    onyx("train", f"{d}/cfg.yaml")
    with open(f"{d}/out/log_history.jsonl") as f:
        losses = [json.loads(l)["loss"] for l in f if '"loss"' in l]
    ok = len(losses) >= 6 and losses[-1] < 0.5 * losses[0]
    return ok, f"losses {losses[0]:.3f} -> {losses[-1]:.3f} over 30 steps"


def case_bf16(tmp, low="bf16"):
    """`low` is "bf16" or "fp16" (emulated float16: Transformers trains with float16 autocast on
    a CPU, no gradient scaler there)."""
    m = make(tr.LlamaForCausalLM, num_key_value_heads=2)
    d = os.path.join(tmp, low + "-llama")
    m.save_pretrained(d)
    rng = np.random.default_rng(4)
    ids = rng.integers(0, 97, (64, 16)).astype(np.int64)
    save_file({"input_ids": ids, "attention_mask": np.ones_like(ids), "labels": ids},
              f"{d}/train.safetensors")
    steps, batch, lr, every = 200, 8, 1e-3, 10
    curves = {}
    for tag, on in (("f32", False), ("bf16", True)):
        cfg = {"model": d, "train_data": f"{d}/train.safetensors", "output_dir": f"{d}/{tag}",
               "max_steps": steps, "per_device_train_batch_size": batch, "learning_rate": lr,
               "logging_steps": every, "save_strategy": "steps", "save_steps": steps,
               "disable_tqdm": True, "train_sampling_strategy": "sequential", low: on}
        with open(f"{d}/{tag}.yaml", "w") as f:
            for k, v in cfg.items():
                f.write(f"{k}: {json.dumps(v)}\n")
        onyx("train", f"{d}/{tag}.yaml")
        with open(f"{d}/{tag}/log_history.jsonl") as f:
            curves[tag] = [json.loads(l)["loss"] for l in f if '"loss"' in l]
    # PyTorch: the same model and schedule under CPU autocast bf16 (float16)
    losses = train_like_onyx(m, {"input_ids": ids, "labels": ids}, steps, batch, lr,
                             autocast_dtype=torch.bfloat16 if low == "bf16" else torch.float16)
    curves["torch"] = [float(np.mean(losses[i:i + every])) for i in range(0, steps, every)]
    n = len(curves["torch"])
    if any(len(c) != n for c in curves.values()):
        return False, f"logged {[len(c) for c in curves.values()]} losses, expected {n}"
    vs_f32 = max(abs(a - b) / b for a, b in zip(curves["bf16"], curves["f32"]))
    vs_torch = max(abs(a - b) / b for a, b in zip(curves["bf16"], curves["torch"]))
    saved = load_file(f"{d}/bf16/model.safetensors")
    f32_saved = all(v.dtype == np.float32 for v in saved.values())
    with open(f"{d}/bf16/checkpoint-{steps}/training_args.json") as f:
        flag = json.load(f).get(low) is True
    ok = vs_f32 < 1e-2 and vs_torch < 1e-2 and f32_saved and flag and \
        curves["bf16"][-1] < curves["bf16"][0] and curves["bf16"] != curves["f32"]
    return ok, (f"{steps} steps, losses {curves['bf16'][0]:.4f} -> {curves['bf16'][-1]:.4f}: vs "
                f"float32 worst rel {vs_f32:.1e}, vs PyTorch autocast {vs_torch:.1e}; weights "
                f"saved float32: {f32_saved}; training_args.json {low}: {flag}")


def case_sft(tmp):
    """`type: sft` data (prompt / completion JSONL, GPT-2's byte-level BPE) into a Llama: the
    first logged loss (learning_rate 0) equals Transformers' loss on the same rows tokenized by
    the tokenizers library, TRL's way: prompt + completion as one text, the prompt's tokens and
    the padding labelled -100, <|endoftext|> appended."""
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    tok_dir = os.path.join(repo, "build", "bpe-reference")
    if not os.path.exists(os.path.join(tok_dir, "vocab.json")):
        tok_dir = os.path.join(repo, "..", "shared", "data", "gpt2-tokenizer")
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders
    tk = Tokenizer(models.BPE.from_file(os.path.join(tok_dir, "vocab.json"),
                                        os.path.join(tok_dir, "merges.txt")))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    rows = [("Define the word dog:", " a domesticated carnivorous mammal"),
            ("Define the word run:", " move fast by using one's feet"),
            ("Translate 'chat':", " cat"),
            ("Q: what is two plus two?", " A: four, as everyone knows"),
            ("Part of speech of quickly:", " adverb"),
            ("Define the word tree:", " a tall perennial woody plant having a main trunk"),
            ("Antonym of hot:", " cold"),
            ("Define the word idea:", " a thought or suggestion as to a possible course of action")]
    d = os.path.join(tmp, "sft")
    os.makedirs(d)
    with open(os.path.join(d, "train.jsonl"), "w") as f:
        for p, c in rows:
            f.write(json.dumps({"prompt": p, "completion": c}) + "\n")
    m = make(tr.LlamaForCausalLM, vocab_size=50257, num_key_value_heads=2)
    m.save_pretrained(os.path.join(d, "model"))
    cfg = {"model": os.path.join(d, "model"),
           "train_data": {"type": "sft", "path": os.path.join(d, "train.jsonl"),
                          "tokenizer": os.path.join(tok_dir, "vocab.json")},
           "output_dir": os.path.join(d, "out"), "max_steps": 1, "learning_rate": 0.0,
           "per_device_train_batch_size": 8, "train_sampling_strategy": "sequential",
           "logging_steps": 1, "save_strategy": "no", "disable_tqdm": True}
    with open(os.path.join(d, "cfg.yaml"), "w") as f:
        for k, v in cfg.items():
            f.write(f"{k}: {json.dumps(v)}\n")
    onyx("train", os.path.join(d, "cfg.yaml"))
    with open(os.path.join(d, "out", "log_history.jsonl")) as f:
        onyx_loss = next(json.loads(l)["loss"] for l in f if '"loss"' in l)
    eos = tk.token_to_id("<|endoftext|>")
    seqs, labs = [], []
    for p, c in rows:
        ids = tk.encode(p + c).ids + [eos]
        n_prompt = len(tk.encode(p).ids)
        seqs.append(ids)
        labs.append([-100] * n_prompt + ids[n_prompt:])
    L = -(-max(len(x) for x in seqs) // 16) * 16
    ids = np.full((len(rows), L), eos, np.int64)
    labels = np.full((len(rows), L), -100, np.int64)
    mask = np.zeros((len(rows), L), np.int64)
    for i, (x, y) in enumerate(zip(seqs, labs)):
        ids[i, :len(x)], labels[i, :len(y)], mask[i, :len(x)] = x, y, 1
    with torch.no_grad():
        ref = m(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                labels=torch.tensor(labels)).loss.item()
    err = abs(onyx_loss - ref) / ref
    n_loss = int((labels[:, 1:] != -100).sum())
    # packing: the same rows packed into rows of <= 40 tokens (first fit, in order)
    cfg["train_data"] = dict(cfg["train_data"], packing=True, max_length=40)
    cfg["output_dir"] = os.path.join(d, "out-packed")
    with open(os.path.join(d, "cfg.yaml"), "w") as f:
        for k, v in cfg.items():
            f.write(f"{k}: {json.dumps(v)}\n")
    onyx("train", os.path.join(d, "cfg.yaml"))
    with open(os.path.join(d, "out-packed", "log_history.jsonl")) as f:
        packed_loss = next(json.loads(l)["loss"] for l in f if '"loss"' in l)
    rows_ids, rows_lab, rows_pos = [], [], []
    for x, y in zip(seqs, labs):
        if not rows_ids or len(rows_ids[-1]) + len(x) > 40:
            rows_ids.append([]), rows_lab.append([]), rows_pos.append([])
        elif y:
            y = [-100] + y[1:]
        rows_ids[-1] += x
        rows_lab[-1] += y
        rows_pos[-1] += list(range(len(x)))
    L = -(-max(len(x) for x in rows_ids) // 16) * 16
    R = len(rows_ids)
    pids = np.full((R, L), eos, np.int64)
    plab = np.full((R, L), -100, np.int64)
    ppos = np.zeros((R, L), np.int64)
    for i in range(R):
        n = len(rows_ids[i])
        pids[i, :n], plab[i, :n], ppos[i, :n] = rows_ids[i], rows_lab[i], rows_pos[i]
    mask4 = packed_causal_mask(ppos)
    with torch.no_grad():
        pref = m(input_ids=torch.tensor(pids), position_ids=torch.tensor(ppos),
                 attention_mask=mask4, labels=torch.tensor(plab)).loss.item()
    perr = abs(packed_loss - pref) / pref
    ok = err < 1e-5 and perr < 1e-5
    return ok, (f"8 prompt/completion rows, {n_loss} completion tokens carry loss: onyx "
                f"{onyx_loss:.6f} vs Transformers {ref:.6f} (rel {err:.1e}); packed into {R} rows "
                f"of <= 40: {packed_loss:.6f} vs {pref:.6f} (rel {perr:.1e})")


def main():
    cases = [
        ("llama-gqa", lambda t: case_lm(t, "llama-gqa", tr.LlamaForCausalLM, num_key_value_heads=2)),
        ("llama-tied-bias", lambda t: case_lm(
            t, "llama-tied-bias", tr.LlamaForCausalLM, num_key_value_heads=4,
            tie_word_embeddings=True, attention_bias=True, mlp_bias=True,
            rope_parameters={"rope_type": "linear", "rope_theta": 500.0, "factor": 2.0})),
        ("llama3-rope", lambda t: case_lm(
            t, "llama3-rope", tr.LlamaForCausalLM, num_key_value_heads=2,
            rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                             "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                             "original_max_position_embeddings": 16})),
        ("llama-dynamic", lambda t: case_lm(
            t, "llama-dynamic", tr.LlamaForCausalLM, num_attention_heads=4, num_key_value_heads=1,
            max_position_embeddings=8,
            rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0})),
        ("mistral-sliding", lambda t: case_lm(t, "mistral-sliding", tr.MistralForCausalLM,
                                              num_key_value_heads=2, sliding_window=4)),
        ("qwen2", lambda t: case_lm(t, "qwen2", tr.Qwen2ForCausalLM, num_key_value_heads=2)),
        ("qwen2-seqcls", case_seqcls),
        ("llama-packed", case_packed),
        ("train-loss-falls", case_train),
        ("bf16-loss-curve", case_bf16),
        ("fp16-loss-curve", lambda tmp: case_bf16(tmp, "fp16")),
        ("sft-completion-loss", case_sft),
    ]
    return run_cases(cases, "onyx-test-llama-")


if __name__ == "__main__":
    sys.exit(main())
