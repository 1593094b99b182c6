"""test_seq2seq.py — onyx's encoder–decoder builders (src/models/seq2seq.cc, t5.cc) against the
real Transformers classes WhisperForConditionalGeneration, BartForConditionalGeneration,
T5ForConditionalGeneration and MT5ForConditionalGeneration, each
randomly initialized from a small config (LayerNorm weights, biases and BART's final_logits_bias
randomized too, so their wiring shows), saved with save_pretrained, then
  - `onyx run FOLDER`: logits within 1e-4 (relative to the largest) of Transformers in eval mode
    (eager attention) at every position;
  - `onyx grad FOLDER --no-dropout`: the loss and every trained parameter's gradient within 1e-4
    (relative to that gradient's largest element) of loss.backward() in PyTorch; the parameters
    Transformers does not train (Whisper's encoder positions) get no gradient from onyx either.
The decoder's inputs are labels shifted right (decoder_start_token_id first, -100 read as
pad_token_id) unless the case gives decoder_input_ids.

Cases (one PASS / FAIL line each):
  whisper          ragged labels (-100 after each row's end), pad tokens among the decoder inputs
                   (the padding row of embed_tokens gets no gradient from them, as nn.Embedding's
                   padding_idx), tied proj_out
  whisper-prompt   decoder_input_ids given (a forced prompt of special tokens, as Whisper's
                   processor writes them) and labels that are not their shift
  bart             padded input_ids with attention_mask (the encoder's and the cross-attention's
                   mask), ragged labels, one shared token table for both stacks and the LM head
  bart-scaled      scale_embedding (tokens * sqrt(d_model)), relu, an untrained
                   final_logits_bias that is not zero
  whisper-wrong-length  input features not 2 * max_source_positions frames long, labels longer
                  than max_target_positions: clear errors
                   naming the input and both lengths, as Transformers refuses them
  t5               T5 (relu feed-forward, decoder output scaled by d_model^-0.5): relative
                   position buckets over 16 / 14 positions (8 buckets, max_distance 12: exact,
                   log-spaced and clipped distances), 2 encoder and 3 decoder blocks
  t5-v1.1-gated    feed_forward_proj gated-gelu, tie_word_embeddings false (no output scaling)
  mt5              MT5ForConditionalGeneration (gated-gelu, never scaled)
  whisper-timestamps-{short,long,beams,max-length}  `onyx generate --encoder_inputs
                   --return_timestamps` = Transformers' generate(return_timestamps=True,
                   return_segments=True): each row's tokens (timestamps included) and its segments'
                   start / end times and tokens, with the timestamp rules
                   (WhisperTimeStampLogitsProcessor, max_initial_timestamp_index) and the
                   window-by-window decoding: 3 rows of one window each (rows that end mid-speech
                   decode again from their last timestamp pair), features of ~3 windows
                   (long-form: timestamps on without the flag), beam search, and max_length
                   growing by the prompt's length at every window as Transformers grows it;
                   -audio: `--audio` WAV files (a 1-s window: max_source_positions 50): a 2.5-s
                   file (long-form, its whole spectrogram) alone and two short ones batched with
                   --return_timestamps, against WhisperFeatureExtractor(truncation=False,
                   padding="longest") / its 1-s padding and generate(return_timestamps=True)
  whisper-prompt-ids  `--prompt_ids` (<|startofprev|> and text tokens before every window's
                   prompt) = generate(prompt_ids=...), without timestamps and with them; without,
                   this model (it has timestamp tokens) still emits timestamp pairs, where
                   Transformers 5 splits the window and decodes again from the pair: onyx too;
                   `--initial_prompt TEXT` = WhisperProcessor.get_prompt_ids(TEXT) (a Whisper
                   tokenizer made from GPT-2's files); a special token in the text: exit 1
  {whisper,bart,t5}-generate-{greedy,beams}  `onyx generate --encoder_inputs` = Transformers'
                   generate() token for token, batched (BART's input padded), greedy and beam
                   search; Whisper's suppress_tokens / begin_suppress_tokens, BART's forced eos,
                   T5's relative position bias over the growing cache

Run: ONYX=build/onyx build/venv/bin/python tests/parity/test_seq2seq.py [filter]
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

ONYX = os.environ.get("ONYX", "build/onyx")
TOL = 1e-4
V = 97
torch.set_num_threads(1)


def randomize(m):
    with torch.no_grad():
        for n, p in m.named_parameters():
            if "norm" in n:
                p.normal_(1.0, 0.1)
            if n.endswith("bias"):
                p.normal_(0.0, 0.1)
        if hasattr(m, "final_logits_bias"):
            m.final_logits_bias.normal_(0.0, 0.1)
    return m


def whisper(**kw):
    base = dict(vocab_size=V, d_model=64, encoder_layers=2, decoder_layers=2,
                encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=96,
                decoder_ffn_dim=80, num_mel_bins=16, max_source_positions=12,
                max_target_positions=20, pad_token_id=1, bos_token_id=1, eos_token_id=1,
                decoder_start_token_id=2)
    base.update(kw)
    cfg = tr.WhisperConfig(**base)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    return randomize(tr.WhisperForConditionalGeneration(cfg))


def bart(**kw):
    base = dict(vocab_size=V, d_model=64, encoder_layers=2, decoder_layers=2,
                encoder_attention_heads=4, decoder_attention_heads=8, encoder_ffn_dim=96,
                decoder_ffn_dim=80, max_position_embeddings=32, dropout=0.0, pad_token_id=1,
                bos_token_id=0, eos_token_id=2, decoder_start_token_id=2)
    base.update(kw)
    cfg = tr.BartConfig(**base)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    return randomize(tr.BartForConditionalGeneration(cfg))


def t5(cls=None, **kw):
    cls = cls or tr.T5ForConditionalGeneration
    base = dict(vocab_size=V, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_decoder_layers=3,
                num_heads=4, relative_attention_num_buckets=8, relative_attention_max_distance=12,
                dropout_rate=0.0, pad_token_id=1, eos_token_id=2, decoder_start_token_id=1)
    base.update(kw)
    cfg = cls.config_class(**base)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    return randomize(cls(cfg))


def onyx(*args, check=True):
    p = subprocess.run([ONYX] + list(args), capture_output=True, text=True, timeout=300)
    if check and p.returncode != 0:
        raise AssertionError(f"onyx {args[0]} exited {p.returncode}: {p.stderr.strip()[-800:]}")
    return p


def ragged_labels(rng, b, t, ends):
    labels = rng.integers(3, V, (b, t)).astype(np.int64)
    for r, k in enumerate(ends):
        labels[r, k:] = -100
    return labels


def check(tmp, name, model, feeds):
    """onyx's logits, loss and gradients against the model's on `feeds`."""
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
    lerr = float(np.abs(got - ref).max() / np.abs(ref).max())
    out.loss.backward()
    onyx("grad", d, "--inputs", f"{d}/in.safetensors", "--output", f"{d}/g.safetensors",
         "--no-dropout")
    g = load_file(f"{d}/g.safetensors")
    loss_err = abs(float(g["loss"]) - out.loss.item()) / abs(out.loss.item())
    worst, wn, missing, extra = 0.0, "", [], []
    trained = 0
    # a key projection's bias gets a zero gradient (it adds the same to every score of a query):
    # rounding noise on both sides, measured against the largest gradient of the model instead
    floor = 1e-4 * max(float(p.grad.abs().max()) for p in model.parameters() if p.grad is not None)
    for n, p in model.named_parameters():
        if not p.requires_grad:
            if n in g:
                extra.append(n)
            continue
        trained += 1
        if n not in g:
            missing.append(n)
            continue
        ref_g = p.grad.numpy()
        e = float(np.abs(g[n] - ref_g).max() / max(np.abs(ref_g).max(), floor))
        if e > worst:
            worst, wn = e, n
    ok = lerr < TOL and loss_err < TOL and worst < TOL and not missing and not extra
    return ok, (f"logits rel {lerr:.1e}, loss rel {loss_err:.1e}, {trained} gradients, worst rel "
                f"{worst:.1e} ({wn})" + (f", missing {missing}" if missing else "")
                + (f", gradients for untrained {extra}" if extra else ""))


def case_whisper(tmp):
    rng = np.random.default_rng(0)
    feats = rng.normal(0, 1, (3, 16, 24)).astype(np.float32)
    labels = ragged_labels(rng, 3, 9, [9, 6, 4])
    return check(tmp, "whisper", whisper(), {"input_features": feats, "labels": labels})


def case_whisper_prompt(tmp):
    rng = np.random.default_rng(1)
    feats = rng.normal(0, 1, (2, 16, 24)).astype(np.float32)
    dec = rng.integers(3, V, (2, 7)).astype(np.int64)
    dec[:, :3] = [[2, 90, 91], [2, 92, 91]]  # start, language, task: Whisper's forced prompt
    labels = np.concatenate([dec[:, 1:], np.full((2, 1), 1, np.int64)], axis=1)
    labels[:, :2] = -100  # no loss on the prompt
    return check(tmp, "whisper-prompt", whisper(),
                 {"input_features": feats, "decoder_input_ids": dec, "labels": labels})


def bart_feeds(seed):
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, V, (3, 10)).astype(np.int64)
    mask = np.ones_like(ids)
    for r, k in [(1, 7), (2, 4)]:
        ids[r, k:] = 1
        mask[r, k:] = 0
    return {"input_ids": ids, "attention_mask": mask,
            "labels": ragged_labels(rng, 3, 8, [8, 5, 3])}


def case_bart(tmp):
    return check(tmp, "bart", bart(), bart_feeds(2))


def case_bart_scaled(tmp):
    return check(tmp, "bart-scaled", bart(scale_embedding=True, activation_function="relu"),
                 bart_feeds(3))


def t5_feeds(seed):
    """bart_feeds over 16 encoder and 14 decoder positions: relative distances past the exact
    buckets and past max_distance, both directions."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, V, (3, 16)).astype(np.int64)
    mask = np.ones_like(ids)
    for r, k in [(1, 11), (2, 6)]:
        ids[r, k:] = 1
        mask[r, k:] = 0
    return {"input_ids": ids, "attention_mask": mask,
            "labels": ragged_labels(rng, 3, 14, [14, 9, 4])}


def case_wrong_length(tmp):
    d = os.path.join(tmp, "whisper-wrong")
    whisper().save_pretrained(d)
    rng = np.random.default_rng(4)
    save_file({"input_features": rng.normal(0, 1, (1, 16, 20)).astype(np.float32),
               "labels": np.array([[5, 6, 7]], np.int64)}, f"{d}/in.safetensors")
    p = onyx("run", d, "--inputs", f"{d}/in.safetensors", "--output", f"{d}/o.safetensors",
             check=False)
    err = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ""
    ok = p.returncode != 0 and "input_features" in err and "24" in err and "20" in err
    # labels longer than the decoder's 20 positions (max_target_positions)
    save_file({"input_features": rng.normal(0, 1, (1, 16, 24)).astype(np.float32),
               "labels": np.full((1, 25), 5, np.int64)}, f"{d}/in2.safetensors")
    p2 = onyx("grad", d, "--inputs", f"{d}/in2.safetensors", "--output", f"{d}/g.safetensors",
              check=False)
    err2 = p2.stderr.strip().splitlines()[-1] if p2.stderr.strip() else ""
    ok = ok and p2.returncode != 0 and "max_target_positions" in err2 and "25" in err2
    return ok, f"exit {p.returncode}: {err} | exit {p2.returncode}: {err2}"


def generated_rows(out_file):
    with open(out_file) as f:
        return [json.loads(line)["completion_ids"] for line in f]


def until_eos(row, eos):
    """A Transformers row cut after its first eos (the rest is padding)."""
    row = [int(t) for t in row]
    return row[:row.index(eos) + 1] if eos in row else row


def gen_case(tmp, name, model, enc, hf_kwargs, flags, strip_start):
    """`onyx generate FOLDER --encoder_inputs` = Transformers' generate, token for token."""
    d = os.path.join(tmp, name)
    model.save_pretrained(d)
    save_file(enc, f"{d}/enc.safetensors")
    onyx("generate", d, "--encoder_inputs", f"{d}/enc.safetensors", "--output", f"{d}/out.jsonl",
         *flags)
    got = generated_rows(f"{d}/out.jsonl")
    with torch.no_grad():
        ref = model.generate(**{k: torch.tensor(v) for k, v in enc.items()}, **hf_kwargs)
    eos = model.generation_config.eos_token_id
    ref = [until_eos(r[1:] if strip_start else r, eos) for r in ref.tolist()]
    same = got == ref
    return same, (f"{len(got)} rows of {[len(r) for r in got]} tokens = Transformers'" if same else
                  f"onyx {got} vs Transformers {ref}")


def case_whisper_generate(tmp, beams):
    m = whisper(init_std=0.2, max_target_positions=40, suppress_tokens=[7],
                begin_suppress_tokens=[5, 1]).eval()
    rng = np.random.default_rng(6)
    enc = {"input_features": rng.normal(0, 1, (3, 16, 24)).astype(np.float32)}
    kw = {"max_new_tokens": 14, "num_beams": beams}
    # Whisper's generate returns the new tokens only (its decoder prompt stripped)
    return gen_case(tmp, f"whisper-gen-{beams}", m, enc, kw,
                    ["--max_new_tokens", "14", "--num_beams", str(beams)], strip_start=False)


def case_whisper_language(tmp):
    """A multilingual Whisper's prompt as Transformers' generate builds it from the generation
    config (lang_to_id, task_to_id, no_timestamps_token_id, forced_decoder_ids [[1, null], [2,
    transcribe]]): with no language each row's language detected (= detect_language), then
    transcribe and <|notimestamps|>; --language (a name, a code) and --task translate as
    generate(language=, task=); the new tokens equal Transformers' in each. An English-only model
    refuses --language, as Transformers refuses it."""
    m = whisper(init_std=0.2, max_target_positions=40).eval()
    langs = {"<|en|>": V - 7, "<|de|>": V - 6, "<|fr|>": V - 5, "<|ja|>": V - 4}
    with torch.no_grad():  # language logits that vary with the audio: rows detect differently
        m.proj_out.weight[V - 7:V - 3] = 8 * torch.randn(
            4, 64, generator=torch.Generator().manual_seed(3))
    g = m.generation_config
    g.lang_to_id, g.task_to_id = langs, {"transcribe": V - 3, "translate": V - 2}
    g.is_multilingual, g.no_timestamps_token_id = True, V - 1
    g.forced_decoder_ids = [[1, None], [2, V - 3]]
    d = os.path.join(tmp, "whisper-lang")
    m.save_pretrained(d)
    rng = np.random.default_rng(8)
    feats = rng.normal(0, 1, (4, 16, 24)).astype(np.float32)
    save_file({"input_features": feats}, f"{d}/enc.safetensors")
    x = torch.tensor(feats)
    with torch.no_grad():
        detected = m.detect_language(x).tolist()
    ok, msgs = True, []
    for flags, kw, lang, task in (([], {}, None, V - 3),
                                  (["--language", "german", "--task", "translate"],
                                   {"language": "german", "task": "translate"}, V - 6, V - 2),
                                  (["--language", "fr"], {"language": "fr"}, V - 5, V - 3),
                                  (["--num_beams", "3"], {"num_beams": 3}, None, V - 3)):
        onyx("generate", d, "--encoder_inputs", f"{d}/enc.safetensors", "--output",
             f"{d}/out.jsonl", "--max_new_tokens", "8", *flags)
        with open(f"{d}/out.jsonl") as f:
            rows = [json.loads(line) for line in f]
        with torch.no_grad():
            ref = m.generate(x, max_new_tokens=8, **kw).tolist()
        want_prompts = [[2, detected[r] if lang is None else lang, task, V - 1] for r in range(4)]
        got_new = [r["completion_ids"] for r in rows]
        want_new = [until_eos(r, 1) for r in ref]
        good = [r["prompt_ids"] for r in rows] == want_prompts and got_new == want_new
        ok &= good
        msgs.append(f"{' '.join(flags) or 'detected'}: prompts {[r['prompt_ids'] for r in rows]}"
                    + ("" if good else f" (want {want_prompts}); new {got_new} vs {want_new}"))
    g.is_multilingual = False
    m.save_pretrained(d)
    p = onyx("generate", d, "--encoder_inputs", f"{d}/enc.safetensors", "--language", "de",
             check=False)
    err = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ""
    ok &= p.returncode != 0 and "English-only" in err
    msgs.append(f"English-only --language: exit {p.returncode}: {err}")
    return ok, "; ".join(msgs)


def timestamp_whisper(**kw):
    """A Whisper whose last 26 tokens are timestamps (<|0.00|> .. <|0.50|>, after
    <|notimestamps|> = V - 27), the first timestamp at most <|0.02|>."""
    m = whisper(init_std=0.2, max_target_positions=40, **kw).eval()
    g = m.generation_config
    g.no_timestamps_token_id, g.max_initial_timestamp_index = V - 27, 1
    return m


def case_whisper_timestamps(tmp, kind):
    m = timestamp_whisper()
    frames = 70 if kind == "long" else 24
    rows = 1 if kind == "long" else 6
    x = np.random.default_rng(11).normal(0, 1, (rows, 16, frames)).astype(np.float32)
    flags, kw = ["--max_new_tokens", "16"], {"max_new_tokens": 16}
    if kind == "beams":
        flags, kw = flags + ["--num_beams", "3"], {**kw, "num_beams": 3}
    if kind == "max-length":
        m.generation_config.max_length = 6
        flags, kw = [], {}
    if kind != "long":
        flags.append("--return_timestamps")
    d = os.path.join(tmp, f"whisper-ts-{kind}")
    m.save_pretrained(d)
    save_file({"input_features": x}, f"{d}/enc.safetensors")
    onyx("generate", d, "--encoder_inputs", f"{d}/enc.safetensors", "--output", f"{d}/out.jsonl",
         *flags)
    with open(f"{d}/out.jsonl") as f:
        got = [json.loads(line) for line in f]
    with torch.no_grad():
        ref = m.generate(torch.tensor(x), return_timestamps=True, return_segments=True, **kw)
    tb = V - 26
    ok, n_segments, msgs = len(got) == rows, 0, []
    for r in range(rows):
        want_tokens = [int(t) for t in ref["sequences"][r].tolist()]
        while want_tokens and want_tokens[-1] == 1:  # right padding (pad = eos: never a token)
            want_tokens.pop()
        want_segs = [(round(float(s["start"]), 2), round(float(s["end"]), 2),
                      [int(t) for t in s["tokens"].tolist()]) for s in ref["segments"][r]]
        got_segs = [(s["start"], s["end"]) for s in got[r]["segments"]]
        same = (got[r]["completion_ids"] == want_tokens
                and got_segs == [(a, b) for a, b, _ in want_segs]
                and sum(len(t) for _, _, t in want_segs) == len(want_tokens))
        ok &= same
        n_segments += len(want_segs)
        if not same:
            msgs.append(f"row {r}: onyx {got[r]['completion_ids']} {got_segs} vs Transformers "
                        f"{want_tokens} {[(a, b) for a, b, _ in want_segs]}")
    pairs = sum(1 for r in got for a, b in zip(r["completion_ids"], r["completion_ids"][1:])
                if a >= tb and b >= tb)
    ok &= n_segments > rows and pairs > 0  # segments were split, windows decoded again
    return ok, (f"{rows} rows x {frames} frames: {n_segments} segments, {pairs} timestamp pairs, "
                f"tokens and times = Transformers'" if ok else "; ".join(msgs) or
                f"too few segments ({n_segments}) or pairs ({pairs}) to test")


def case_whisper_timestamps_audio(tmp):
    import wave
    m = timestamp_whisper(max_source_positions=50)
    d = os.path.join(tmp, "whisper-ts-audio")
    m.save_pretrained(d)
    fe = tr.WhisperFeatureExtractor(feature_size=16, chunk_length=1)
    rng = np.random.default_rng(12)
    audio, paths = [], []
    for i, secs in enumerate((2.5, 0.6, 0.9)):
        t = np.arange(int(secs * 16000)) / 16000
        x = 0.3 * np.sin(2 * np.pi * (300 + 200 * i + 500 * t) * t) + 0.05 * rng.standard_normal(t.size)
        pcm = np.round(np.clip(x, -1, 1) * 32767).astype(np.int16)
        paths.append(os.path.join(d, f"a{i}.wav"))
        with wave.open(paths[-1], "wb") as w:
            w.setnchannels(1), w.setsampwidth(2), w.setframerate(16000), w.writeframes(pcm.tobytes())
        audio.append(pcm.astype(np.float32) / 32768)
    onyx("generate", d, *sum([["--audio", p] for p in paths], []), "--return_timestamps",
         "--max_new_tokens", "16", "--output", f"{d}/out.jsonl")
    with open(f"{d}/out.jsonl") as f:
        got = [json.loads(line) for line in f]
    long_in = fe(audio[0], sampling_rate=16000, truncation=False, padding="longest",
                 return_tensors="pt").input_features
    short_in = fe(audio[1:], sampling_rate=16000, return_tensors="pt").input_features
    want = []
    with torch.no_grad():
        for x in (long_in, short_in):
            out = m.generate(x, return_timestamps=True, return_segments=True, max_new_tokens=16)
            for r in range(x.shape[0]):
                toks = [int(t) for t in out["sequences"][r].tolist()]
                while toks and toks[-1] == 1:
                    toks.pop()
                want.append((toks, [(round(float(s["start"]), 2), round(float(s["end"]), 2))
                                    for s in out["segments"][r]]))
    have = [(r["completion_ids"], [(s["start"], s["end"]) for s in r["segments"]]) for r in got]
    ok = have == want and long_in.shape[-1] == 250 and len(want[0][1]) > 1
    return ok, (f"3 files ({long_in.shape[-1]} frames long-form + 2 batched): "
                f"{sum(len(s) for _, s in want)} segments = Transformers'" if ok else
                f"onyx {have} vs Transformers {want}")


def case_whisper_prompt_ids(tmp):
    m = timestamp_whisper()
    m.generation_config.prev_sot_token_id = V - 28
    d = os.path.join(tmp, "whisper-prompt-ids")
    m.save_pretrained(d)
    x = np.random.default_rng(13).normal(0, 1, (3, 16, 24)).astype(np.float32)
    save_file({"input_features": x}, f"{d}/enc.safetensors")
    prev = [V - 28, 10, 11, 12, 13]
    ok, msgs = True, []
    for ts in (False, True):
        onyx("generate", d, "--encoder_inputs", f"{d}/enc.safetensors", "--output",
             f"{d}/out.jsonl", "--max_new_tokens", "10", "--prompt_ids",
             ",".join(map(str, prev)), *(["--return_timestamps"] if ts else []))
        with open(f"{d}/out.jsonl") as f:
            rows = [json.loads(line) for line in f]
        with torch.no_grad():
            ref = m.generate(torch.tensor(x), max_new_tokens=10, prompt_ids=torch.tensor(prev),
                             return_timestamps=ts, return_segments=ts)
        want = []  # the windows' tokens, right-padded with pad = eos (never a token): unpadded
        for r in (ref["sequences"] if ts else ref).tolist():
            while r and r[-1] == 1:
                r.pop()
            want.append(r)
        got = [r["completion_ids"] for r in rows]
        good = got == want and all(r["prompt_ids"][:5] == prev for r in rows)
        ok &= good
        msgs.append(f"{'timestamps' if ts else 'plain'}: {[len(r) for r in got]} tokens" +
                    ("" if good else f" onyx {got} vs {want}"))
    return ok, "; ".join(msgs)


def case_whisper_condition(tmp):
    """--condition_on_prev_tokens = generate(condition_on_prev_tokens=True): 8 one-window rows with
    timestamps cut at 6 new tokens (one of them decodes a second window, after its history), one
    ~3-window row, and prompt_ids with it (the prompt's text opens the history), and three
    ~3-window rows at once, conditioned on histories of different lengths (left-padded)."""
    m = timestamp_whisper()
    m.generation_config.prev_sot_token_id = V - 28
    d = os.path.join(tmp, "whisper-condition")
    m.save_pretrained(d)
    rng = np.random.default_rng(15)
    ok, msgs = True, []
    for name, shape, prev, new in (("8 rows", (8, 16, 24), None, 6),
                                   ("long", (1, 16, 70), None, 16),
                                   ("long + prompt_ids", (1, 16, 70), [V - 28, 10, 11, 12], 16),
                                   ("3 long rows", (3, 16, 70), None, 16)):
        x = rng.normal(0, 1, shape).astype(np.float32)
        save_file({"input_features": x}, f"{d}/enc.safetensors")
        flags = ["--prompt_ids", ",".join(map(str, prev))] if prev else []
        onyx("generate", d, "--encoder_inputs", f"{d}/enc.safetensors", "--output",
             f"{d}/out.jsonl", "--max_new_tokens", str(new), "--return_timestamps",
             "--condition_on_prev_tokens", *flags)
        with open(f"{d}/out.jsonl") as f:
            got = [(r["completion_ids"], [(s["start"], s["end"]) for s in r["segments"]])
                   for r in map(json.loads, f)]
        kw = {"prompt_ids": torch.tensor(prev)} if prev else {}
        if shape[0] > 1 and shape[2] > 50:  # batched long-form: Transformers asks for the mask
            kw["attention_mask"] = torch.ones(shape[0], shape[2], dtype=torch.long)
        with torch.no_grad():
            ref = m.generate(torch.tensor(x), max_new_tokens=new, return_timestamps=True,
                             return_segments=True, condition_on_prev_tokens=True, **kw)
        want = []
        for r in range(shape[0]):
            toks = [int(t) for t in ref["sequences"][r].tolist()]
            while toks and toks[-1] == 1:
                toks.pop()
            want.append((toks, [(round(float(s["start"]), 2), round(float(s["end"]), 2))
                                for s in ref["segments"][r]]))
        good = got == want
        if shape[0] == 3:  # the rows' histories must differ in length for the case to count
            good &= len({len(toks) for toks, _ in want}) > 1 and all(len(s) > 1 for _, s in want)
        ok &= good
        windows = sum(len(s) for _, s in want)
        msgs.append(f"{name}: {windows} segments, {[len(t) for t, _ in want]} tokens" +
                    ("" if good else f" onyx {got} vs {want}"))
    return ok, "; ".join(msgs)


def case_whisper_initial_prompt(tmp):
    gpt2 = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../shared/data/gpt2-tokenizer")
    tok = tr.WhisperTokenizerFast.from_pretrained(gpt2)
    tok.add_special_tokens({"additional_special_tokens": ["<|startoftranscript|>",
                                                          "<|startofprev|>", "<|notimestamps|>"]})
    m = whisper(vocab_size=len(tok), decoder_start_token_id=len(tok) - 3).eval()
    d = os.path.join(tmp, "whisper-initial-prompt")
    m.save_pretrained(d)
    tok.save_pretrained(d)
    x = np.random.default_rng(14).normal(0, 1, (1, 16, 24)).astype(np.float32)
    save_file({"input_features": x}, f"{d}/enc.safetensors")
    text = "  Hello world, Onyx! "
    onyx("generate", d, "--encoder_inputs", f"{d}/enc.safetensors", "--output", f"{d}/out.jsonl",
         "--max_new_tokens", "3", "--initial_prompt", text)
    with open(f"{d}/out.jsonl") as f:
        got = json.loads(f.readline())["prompt_ids"]
    want = [int(t) for t in tok.get_prompt_ids(text)]
    p = onyx("generate", d, "--encoder_inputs", f"{d}/enc.safetensors", "--initial_prompt",
             "say <|startoftranscript|>", check=False)
    err = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ""
    ok = got[:len(want)] == want and p.returncode == 1 and "special token" in err
    return ok, f"prompt {got[:len(want)]} (get_prompt_ids {want}); special token: {err[-80:]}"


def case_bart_generate(tmp, beams):
    m = bart(init_std=0.2, max_position_embeddings=40).eval()
    with torch.no_grad():  # eos likely enough that rows (and hypotheses) end at several lengths
        m.final_logits_bias[0, 2] += 2.0
    feeds = bart_feeds(7)
    enc = {"input_ids": feeds["input_ids"], "attention_mask": feeds["attention_mask"]}
    kw = {"max_new_tokens": 16, "num_beams": beams}
    if beams > 1:
        kw["length_penalty"] = 0.7
    flags = ["--max_new_tokens", "16", "--num_beams", str(beams)]
    if beams > 1:
        m.generation_config.num_beams = beams  # (saved with length_penalty, which needs it)
        m.generation_config.length_penalty = 0.7  # read by onyx from generation_config.json
    return gen_case(tmp, f"bart-gen-{beams}", m, enc, kw, flags, strip_start=True)


def case_t5_generate(tmp, beams):
    # (Transformers sizes its cache by num_layers: its generate fails when num_decoder_layers differs)
    m = t5(initializer_factor=3.0, num_decoder_layers=2).eval()
    with torch.no_grad():  # eos likely enough that rows end at several lengths
        m.shared.weight[2] *= 1.5
    feeds = t5_feeds(11)
    enc = {"input_ids": feeds["input_ids"], "attention_mask": feeds["attention_mask"]}
    flags = ["--max_new_tokens", "14", "--num_beams", str(beams)]
    return gen_case(tmp, f"t5-gen-{beams}", m, enc, {"max_new_tokens": 14, "num_beams": beams},
                    flags, strip_start=True)


def main():
    cases = [
        ("whisper", case_whisper),
        ("whisper-prompt", case_whisper_prompt),
        ("bart", case_bart),
        ("bart-scaled", case_bart_scaled),
        ("whisper-wrong-length", case_wrong_length),
        ("t5", lambda t: check(t, "t5", t5(), t5_feeds(8))),
        ("t5-v1.1-gated", lambda t: check(t, "t5-gated", t5(feed_forward_proj="gated-gelu",
                                                          tie_word_embeddings=False), t5_feeds(9))),
        ("mt5", lambda t: check(t, "mt5", t5(tr.MT5ForConditionalGeneration), t5_feeds(10))),
        ("whisper-generate-greedy", lambda t: case_whisper_generate(t, 1)),
        ("whisper-generate-beams", lambda t: case_whisper_generate(t, 3)),
        ("whisper-language", case_whisper_language),
        ("whisper-timestamps-short", lambda t: case_whisper_timestamps(t, "short")),
        ("whisper-timestamps-long", lambda t: case_whisper_timestamps(t, "long")),
        ("whisper-timestamps-beams", lambda t: case_whisper_timestamps(t, "beams")),
        ("whisper-timestamps-max-length", lambda t: case_whisper_timestamps(t, "max-length")),
        ("whisper-timestamps-audio", case_whisper_timestamps_audio),
        ("whisper-prompt-ids", case_whisper_prompt_ids),
        ("whisper-initial-prompt", case_whisper_initial_prompt),
        ("whisper-condition", case_whisper_condition),
        ("bart-generate-greedy", lambda t: case_bart_generate(t, 1)),
        ("bart-generate-beams", lambda t: case_bart_generate(t, 4)),
        ("t5-generate-greedy", lambda t: case_t5_generate(t, 1)),
        ("t5-generate-beams", lambda t: case_t5_generate(t, 3)),
    ]
    return run_cases(cases, "onyx-test-seq2seq-")


if __name__ == "__main__":
    sys.exit(main())
