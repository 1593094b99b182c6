"""test_gguf.py — `onyx export ... --output model.gguf` (issue #38): a trained Llama-family model
(LoRA merged; a 4-bit QLoRA base dequantized first) as the GGUF file llama.cpp reads, checked by
reading it back with the PyPI `gguf` package (llama.cpp's own reader/writer library).

Models: tiny Llama / Qwen2 (GQA 2:1), with the tokenizers trained here in Llama 3's byte-level
style, Qwen2's, and SentencePiece-style byte fallback (tests/data/make_tokenizer_references.py),
LoRA r 4 on q/k/v/o trained 2 steps by `onyx train`.

Cases (one PASS / FAIL line each):
  llama3-<type>    f32, f16, bf16, q8_0, q4_0: every tensor under llama.cpp's name (token_embd,
                   blk.N.attn_q, ..., output_norm, output) equal to the merged weights after
                   decoding its type — F32 exactly, F16 = numpy's float16 rounding, BF16 = PyTorch's
                   bfloat16 rounding, Q8_0 and Q4_0 = gguf.quants.quantize's (ggml's reference
                   quantizers; under q4_0 the output head is Q8_0); q_proj / k_proj permuted as llama.cpp's converter permutes them for
                   its rotary layout; 1-D tensors F32; the metadata (architecture, context and
                   embedding length, block count, feed-forward length, head counts, rope base, RMS
                   epsilon, file type) and the tokenizer (model gpt2, pre llama-bpe, tokens and
                   merges of tokenizer.json in id order, control types for special tokens, bos/eos
                   ids, chat template)
  qwen2            architecture qwen2: no permutation, q/k/v biases, pre qwen2
  sentencepiece    a byte-fallback tokenizer: model llama, scores, byte tokens typed 6, no merges
  llama3-rope      Llama 3's rope scaling: rope_freqs.weight as the converter computes it, the
                   rope base 500000
  qlora            a 4-bit (nf4, double quantization) QLoRA run: the merged weights are the
                   bitsandbytes-dequantized base plus the adapters' delta (1e-6)
In every case the GGUF's tensors are compared bit for bit with the merged model onyx writes as a
Hugging Face folder (`--merge-lora --output DIR`), and that merge with base + s B A (1e-6 relative:
onyx adds the float32 delta, PEFT rounds differently).
  errors           a LoRA checkpoint without --merge-lora, a GPT-2, an unknown --outtype: exit 1
                   naming why, no file

Run: ONYX=build/onyx build/venv/bin/python tests/parity/test_gguf.py [filter]
Ends with "N passed, M failed"; exits 1 if any case failed.
"""
import json
import os
import shutil
import subprocess
import sys
import warnings

import numpy as np
import torch
import transformers as tr
from case_runner import run_cases
from safetensors.numpy import load_file, save_file

warnings.filterwarnings("ignore")
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
ONYX = os.environ.get("ONYX", os.path.join(REPO, "build", "onyx"))
# the reference tokenizers test.sh trains beside the build (tests/data/make_tokenizer_references.py)
TOKENIZERS = os.environ.get("ONYX_TOKENIZER_REFS",
                            os.path.join(os.path.dirname(os.path.abspath(ONYX)), "llama-family-reference"))
if not os.path.isdir(TOKENIZERS):
    TOKENIZERS = os.path.join(REPO, "build", "llama-family-reference")
LAYER_NAMES = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
               "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
               "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
               "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def gguf_name(n):
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}
    if n in top:
        return top[n]
    parts = n.split(".")
    module, kind = ".".join(parts[3:-1]), parts[-1]
    return f"blk.{parts[2]}.{LAYER_NAMES[module]}.{kind}"


def permute(w, n_head):
    """llama.cpp's convert_hf_to_gguf.py LlamaModel.permute (its rotary layout)."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 32, "rope_theta": 500000.0}


def llama3_rope_factors(rope, head_dim):
    """llama.cpp's convert_hf_to_gguf.py: Llama 3's rope scaling as one factor per frequency."""
    import math
    base, factor = rope["rope_theta"], rope["factor"]
    low, high, old = rope["low_freq_factor"], rope["high_freq_factor"], rope["original_max_position_embeddings"]
    freqs = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    out = []
    for f in freqs.tolist():
        wavelen = 2 * math.pi / f
        if wavelen < old / high:
            out.append(1)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def make_model(tmp, name, model_type, tokenizer, rope=None):
    """A tiny model folder with the reference tokenizer `tokenizer`; returns (folder, config)."""
    tok_path = os.path.join(TOKENIZERS, tokenizer, "tokenizer.json")
    tok = json.load(open(tok_path))
    n_vocab = max([*tok["model"]["vocab"].values(), *[a["id"] for a in tok.get("added_tokens", [])]]) + 1
    n_vocab = (n_vocab + 31) // 32 * 32  # unused rows: [PAD<i>] tokens, as llama.cpp writes them
    kw = dict(vocab_size=n_vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
              bos_token_id=1, eos_token_id=2)
    if rope:
        kw["rope_parameters"] = rope
    cfg = tr.Qwen2Config(**kw) if model_type == "qwen2" else tr.LlamaConfig(**kw)
    torch.manual_seed(0)
    model = (tr.Qwen2ForCausalLM if model_type == "qwen2" else tr.LlamaForCausalLM)(cfg)
    folder = os.path.join(tmp, name)
    model.save_pretrained(folder)
    shutil.copy(tok_path, folder)
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"chat_template": "{% for m in messages %}{{ m['content'] }}{% endfor %}",
                   "add_bos_token": True}, f)
    return folder, cfg


def train(tmp, name, folder, **over):
    """2 steps of LoRA on q/k/v/o with `over`; returns the output folder."""
    rng = np.random.default_rng(0)
    ids = rng.integers(3, 200, (8, 12)).astype(np.int64)
    data = os.path.join(tmp, name + "-data.safetensors")
    save_file({"input_ids": ids, "attention_mask": np.ones_like(ids), "labels": ids.copy()}, data)
    out = os.path.join(tmp, name + "-out")
    cfg = dict({"model": folder, "train_data": data, "output_dir": out, "max_steps": 2,
                "per_device_train_batch_size": 4, "learning_rate": 1e-2, "save_strategy": "no",
                "disable_tqdm": True,
                "lora": {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "k_proj", "v_proj",
                                                                     "o_proj"]}}, **over)
    path = os.path.join(tmp, name + ".yaml")
    with open(path, "w") as f:
        for k, v in cfg.items():
            f.write(f"{k}: {json.dumps(v)}\n")
    p = subprocess.run([ONYX, "train", path], capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise AssertionError(f"onyx train exited {p.returncode}: {p.stderr[-600:]}")
    return out


def merged_weights(out, base_folder, quantized=False):
    """The base plus each adapter's delta s * B A (PEFT's merge), the base dequantized by
    bitsandbytes when the run stored it 4-bit."""
    adapter = load_file(os.path.join(out, "adapter_model.safetensors"))
    acfg = json.load(open(os.path.join(out, "adapter_config.json")))
    s = acfg["lora_alpha"] / acfg["r"]
    if quantized:
        m = tr.AutoModelForCausalLM.from_pretrained(os.path.join(out, "base-only"))
        base = {}
        for k, v in m.state_dict().items():
            if v.dtype == torch.uint8 or "." in k and k.rsplit(".", 1)[1] in ("absmax", "quant_map"):
                continue
            base[k] = v.float().numpy()
        import bitsandbytes as bnb
        for n, mod in m.named_modules():
            if isinstance(mod, bnb.nn.Linear4bit):
                base[n + ".weight"] = bnb.functional.dequantize_4bit(
                    mod.weight.data, mod.weight.quant_state).float().numpy()
        base = {k: v for k, v in base.items() if not k.endswith(("absmax", "quant_map"))
                and ".quant_state." not in k and "nested_" not in k}
    else:
        base = load_file(os.path.join(base_folder, "model.safetensors"))
    merged = {k: v.astype(np.float32).copy() for k, v in base.items()}
    for k, a in adapter.items():
        if ".lora_A." not in k:
            continue
        b = adapter[k.replace(".lora_A.", ".lora_B.")]
        w = k.replace("base_model.model.", "").replace(".lora_A.weight", ".weight")
        merged[w] = (merged[w].astype(np.float64) + s * (b.astype(np.float64) @ a)).astype(np.float32)
    return merged


def export(out, path, *extra):
    return subprocess.run([ONYX, "export", out, "--merge-lora", "--output", path, *extra],
                          capture_output=True, text=True, timeout=600)


def read(path):
    import gguf
    r = gguf.GGUFReader(path)
    meta = {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}
    return meta, {t.name: t for t in r.tensors}


def decoded(t):
    """A GGUF tensor as float32 numpy (PyTorch's shape)."""
    import gguf
    shape = tuple(int(x) for x in reversed(t.shape))
    if t.tensor_type == gguf.GGMLQuantizationType.BF16:
        return (t.data.view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(shape)
    return gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape).astype(np.float32)


def expected(ref, gtype, head=False):
    """What a tensor of type gtype must decode to, given the float32 reference (`head`: the output
    head, which a q4_0 file holds as q8_0, where llama-quantize writes its k-quant Q6_K)."""
    import gguf
    if ref.ndim <= 1 or gtype == "f32":
        return ref
    if gtype == "f16":
        return ref.astype(np.float16).astype(np.float32)
    if gtype == "bf16":
        return torch.from_numpy(ref).bfloat16().float().numpy()
    qtype = gguf.GGMLQuantizationType.Q4_0 if gtype == "q4_0" and not head else \
        gguf.GGMLQuantizationType.Q8_0
    q = gguf.quants.quantize(ref, qtype)
    return gguf.quants.dequantize(q, qtype).reshape(ref.shape)


def check_tensors(merged, tensors, cfg, arch, gtype):
    """(list of problems, count checked)."""
    bad, n = [], 0
    for k, v in merged.items():
        g = gguf_name(k)
        if g not in tensors:
            bad.append(f"{g} missing")
            continue
        ref = v
        if arch == "llama" and ".q_proj." in k:
            ref = permute(v, cfg.num_attention_heads)
        if arch == "llama" and ".k_proj." in k:
            ref = permute(v, cfg.num_key_value_heads)
        got = decoded(tensors[g])
        want = expected(ref, gtype, head=g == "output.weight")
        if got.shape != want.shape or not np.array_equal(got, want):
            err = float(np.abs(got - want).max()) if got.shape == want.shape else got.shape
            bad.append(f"{g}: {err}")
        n += 1
    extra = set(tensors) - {gguf_name(k) for k in merged} - {"rope_freqs.weight"}
    if extra:
        bad.append(f"unexpected tensors {sorted(extra)[:3]}")
    return bad, n


def check_meta(meta, cfg, arch, tok_name, folder):
    tok = json.load(open(os.path.join(folder, "tokenizer.json")))
    want = {"general.architecture": arch, f"{arch}.block_count": cfg.num_hidden_layers,
            f"{arch}.context_length": cfg.max_position_embeddings,
            f"{arch}.embedding_length": cfg.hidden_size,
            f"{arch}.feed_forward_length": cfg.intermediate_size,
            f"{arch}.attention.head_count": cfg.num_attention_heads,
            f"{arch}.attention.head_count_kv": cfg.num_key_value_heads,
            f"{arch}.rope.dimension_count": cfg.hidden_size // cfg.num_attention_heads,
            "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
            "tokenizer.ggml.add_bos_token": True,
            "tokenizer.chat_template": "{% for m in messages %}{{ m['content'] }}{% endfor %}"}
    bad = [f"{k}={meta.get(k)!r} (want {v!r})" for k, v in want.items() if meta.get(k) != v]
    for k, v in {f"{arch}.rope.freq_base": cfg.rope_theta if hasattr(cfg, "rope_theta") else
                 cfg.rope_parameters["rope_theta"],
                 f"{arch}.attention.layer_norm_rms_epsilon": cfg.rms_norm_eps}.items():
        if k not in meta or abs(meta[k] - v) > 1e-6 * abs(v):
            bad.append(f"{k}={meta.get(k)} (want {v})")
    tokens = meta.get("tokenizer.ggml.tokens", [])
    by_id = {i: t for t, i in tok["model"]["vocab"].items()}
    by_id.update({a["id"]: a["content"] for a in tok.get("added_tokens", [])})
    if any(tokens[i] != t for i, t in by_id.items()) or len(tokens) != cfg.vocab_size:
        bad.append(f"tokens differ from tokenizer.json ({len(tokens)} for {cfg.vocab_size})")
    types = meta.get("tokenizer.ggml.token_type", [])
    special = [a["id"] for a in tok.get("added_tokens", []) if a.get("special")]
    if any(types[i] != 3 for i in special):
        bad.append("special tokens not typed control (3)")
    if tok_name == "sentencepiece":
        if meta.get("tokenizer.ggml.model") != "llama" or "tokenizer.ggml.merges" in meta:
            bad.append(f"model {meta.get('tokenizer.ggml.model')} (want llama, no merges)")
        byte_ids = [i for i, t in by_id.items() if len(t) == 6 and t.startswith("<0x")]
        if not byte_ids or any(types[i] != 6 for i in byte_ids):
            bad.append("byte tokens not typed 6")
    else:
        merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
        if meta.get("tokenizer.ggml.merges") != merges:
            bad.append("merges differ from tokenizer.json's")
        pre = {"llama3": "llama-bpe", "qwen2": "qwen2"}[tok_name]
        if meta.get("tokenizer.ggml.pre") != pre:
            bad.append(f"pre {meta.get('tokenizer.ggml.pre')} (want {pre})")
    return bad


FILE_TYPE = {"f32": 0, "f16": 1, "q4_0": 2, "q8_0": 7, "bf16": 32}


def case_export(model_type, tok_name, gtype, quantized=False, rope=None):
    def case(tmp):
        arch = "qwen2" if model_type == "qwen2" else "llama"
        name = f"{model_type}-{tok_name}-{gtype}{'-q' if quantized else ''}{'-rope' if rope else ''}"
        folder, cfg = make_model(tmp, name, model_type, tok_name, rope)
        over = {}
        if quantized:
            over["model_init_kwargs"] = {"quantization_config": {
                "load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
                "bnb_4bit_use_double_quant": True}}
        out = train(tmp, name, folder, **over)
        if quantized:  # the 4-bit base as Transformers opens it (no adapter beside it)
            os.makedirs(os.path.join(out, "base-only"))
            for f in ("model.safetensors", "config.json"):
                shutil.copy(os.path.join(out, f), os.path.join(out, "base-only"))
        path = os.path.join(tmp, name + ".gguf")
        p = export(out, path, "--outtype", gtype)
        if p.returncode != 0:
            return False, f"onyx export exited {p.returncode}: {p.stderr[-500:]}"
        meta, tensors = read(path)
        # the merged model onyx writes as a Hugging Face folder (its merge checked against PEFT's
        # by test_lora.py merge-export), and the GGUF's tensors bit for bit equal to it
        hf = os.path.join(tmp, name + "-merged")
        p = export(out, hf)
        if p.returncode != 0:
            return False, f"onyx export --merge-lora (folder) exited {p.returncode}: {p.stderr[-300:]}"
        merged = load_file(os.path.join(hf, "model.safetensors"))
        bad, n = check_tensors(merged, tensors, cfg, arch, gtype)
        # and the merge itself: the base (bitsandbytes-dequantized when 4-bit) plus s * B A
        ref = merged_weights(out, folder, quantized)
        worst = max(float(np.abs(merged[k] - ref[k]).max() / max(np.abs(ref[k]).max(), 1e-12))
                    for k in ref)
        if worst > 1e-6:
            bad.append(f"merged weights {worst:.1e} from base + s B A")
        bad += check_meta(meta, cfg, arch, tok_name, folder)
        if meta.get("general.file_type") != FILE_TYPE[gtype]:
            bad.append(f"file_type {meta.get('general.file_type')}")
        if rope:
            want = llama3_rope_factors(rope, cfg.hidden_size // cfg.num_attention_heads)
            got = decoded(tensors["rope_freqs.weight"]) if "rope_freqs.weight" in tensors else None
            if got is None or not np.allclose(got, want, rtol=1e-6):
                bad.append(f"rope_freqs {got} (want {want})")
        one_d = [t.name for t in tensors.values() if len(t.shape) == 1 and t.tensor_type != 0]
        bad += [f"{x} not F32" for x in one_d]
        return not bad, (f"{n} tensors equal to the merged weights as {gtype} (the merge within "
                         f"{worst:.0e} of base + s B A{', the base dequantized by bitsandbytes' if quantized else ''}), {len(meta)} "
                         f"metadata keys, {len(meta.get('tokenizer.ggml.tokens', []))} tokens"
                         + (f"; problems: {bad[:4]}" if bad else ""))
    return case


def case_errors(tmp):
    folder, _ = make_model(tmp, "err", "llama", "llama3")
    out = train(tmp, "err", folder)
    msgs, ok = [], True

    def expect(name, args, want):
        nonlocal ok
        path = os.path.join(tmp, name + ".gguf")
        p = subprocess.run([ONYX, "export", *args, "--output", path], capture_output=True,
                           text=True, timeout=300)
        good = p.returncode == 1 and want in p.stderr and not os.path.exists(path)
        ok = ok and good
        msgs.append(f"{name}: {'ok' if good else 'exit %d %r' % (p.returncode, p.stderr[-200:])}")

    gpt2 = os.path.join(tmp, "gpt2")
    tr.GPT2LMHeadModel(tr.GPT2Config(vocab_size=97, n_embd=64, n_layer=1, n_head=2)).save_pretrained(gpt2)
    expect("no-merge", [out], "--merge-lora")
    expect("gpt2", [gpt2], "gpt2")
    expect("outtype", [out, "--merge-lora", "--outtype", "q4_k"], "q4_k")
    return ok, "; ".join(msgs)


def main():
    cases = [(f"llama3-{t}", case_export("llama", "llama3", t))
             for t in ("f32", "f16", "bf16", "q8_0", "q4_0")]
    cases += [("qwen2", case_export("qwen2", "qwen2", "f16")),
              ("sentencepiece", case_export("llama", "sentencepiece", "f32")),
              ("llama3-rope", case_export("llama", "llama3", "f32", rope=LLAMA3_ROPE)),
              ("qlora", case_export("llama", "llama3", "f32", quantized=True)),
              ("errors", case_errors)]
    return run_cases(cases, "onyx-test-gguf-")


if __name__ == "__main__":
    sys.exit(main())
