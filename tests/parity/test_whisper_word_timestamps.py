"""test_whisper_word_timestamps.py — Whisper's token and word timestamps
(src/generate/whisper_token_times.cc, whisper_words.cc) against Transformers 5:
WhisperForConditionalGeneration.generate(return_token_timestamps=True) and the
automatic-speech-recognition pipeline's return_timestamps="word".

Cases (one PASS / FAIL line each):
  tokens-{plain,timestamps}  the random timestamp Whisper of test_seq2seq.py (alignment heads
                   [0,1] [1,2] [1,0]), 6 rows of features, `onyx generate --return_token_timestamps`
                   (with and without --return_timestamps): the tokens and every token's time =
                   the segments' token_timestamps of generate(return_segments=True) within 1e-6
                   (rows end at different lengths: the padding counts in the normalization, and
                   without timestamps some rows are decoded again after a timestamp pair)
  tokens-long      one row of 70 frames (three windows): the times carry each window's offset
  tokens-beams     one row, num_beams 3
  words-{short,long}  a Whisper over GPT-2's BPE vocabulary with Whisper's special and timestamp
                   tokens (1-s windows), steered to say words with and without a leading space,
                   punctuation and the two byte tokens of one character: `onyx generate --audio
                   WAV... --word_timestamps` gives the same words with the same start and end
                   times as pipeline(return_timestamps="word") on the same samples — three
                   short files batched together, and a 2.6-s file decoded window by window
  words-beams      one short file alone with num_beams 5 (the pipeline's default): its second
                   window starts after the audio's end, where Transformers crops the weights
                   twice for a batch whose rows have one frame count (matched)
  words-chinese    --language zh on the three short files: split at characters (" caf", "é", "s")
                   = WhisperTokenizer._decode_asr's grouping with the language set to chinese,
                   on onyx's own tokens and times
  errors           no alignment_heads in generation_config.json, a head outside the model,
                   --word_timestamps on a BART: exit 1 naming the cause

Run: ONYX=build/onyx build/venv/bin/python tests/parity/test_whisper_word_timestamps.py [filter]
Ends with "N passed, M failed"; exits 1 if any case failed.
"""
import json
import os
import sys
import wave

import numpy as np
import torch
import transformers as tr
from case_runner import run_cases, with_shared
from safetensors.numpy import save_file

import test_seq2seq as s2s

HERE = os.path.dirname(os.path.abspath(__file__))
GPT2 = os.path.join(HERE, "..", "..", "..", "shared", "data", "gpt2-tokenizer")
HEADS = [[0, 1], [1, 2], [1, 0]]
EOS = 1  # the random Whisper's eos (= pad)


def token_model(tmp, name):
    m = s2s.timestamp_whisper()
    m.generation_config.alignment_heads = HEADS
    d = os.path.join(tmp, name)
    m.save_pretrained(d)
    return m, d


def onyx_rows(d, *flags):
    s2s.onyx("generate", d, "--output", f"{d}/out.jsonl", *flags)
    with open(f"{d}/out.jsonl") as f:
        return [json.loads(line) for line in f]


def compare_token_times(got, ref):
    """onyx's rows against generate(return_segments=True)'s segments: tokens and times."""
    worst, msgs, n = 0.0, [], 0
    for r, segs in enumerate(ref["segments"]):
        toks = [int(t) for s in segs for t in s["tokens"].tolist()]
        times = [float(t) for s in segs for t in s["token_timestamps"].tolist()]
        g = got[r]
        if g["completion_ids"] != toks or len(g["token_timestamps"]) != len(times):
            msgs.append(f"row {r}: onyx {g['completion_ids']} vs {toks}")
            continue
        if times:
            worst = max(worst, float(np.abs(np.array(g["token_timestamps"]) - times).max()))
        n += len(times)
    ok = not msgs and worst <= 1e-6 and n > 0
    spread = {round(t, 2) for g in got for t in g["token_timestamps"]}
    ok &= len(spread) > 3  # the times are not all alike
    return ok, "; ".join(msgs) or f"{n} token times, largest difference {worst:.1e}, " \
                                  f"{len(spread)} distinct"


def case_tokens(tmp, kind):
    m, d = token_model(tmp, f"tokens-{kind}")
    rows, frames = (1, 70) if kind == "long" else (1, 24) if kind == "beams" else (6, 24)
    x = np.random.default_rng(11).normal(0, 1, (rows, 16, frames)).astype(np.float32)
    save_file({"input_features": x}, f"{d}/enc.safetensors")
    flags, kw = ["--max_new_tokens", "16"], {"max_new_tokens": 16}
    if kind == "beams":
        flags, kw = flags + ["--num_beams", "3"], {**kw, "num_beams": 3}
    ts = kind in ("timestamps", "long")
    got = onyx_rows(d, "--encoder_inputs", f"{d}/enc.safetensors", "--return_token_timestamps",
                    *(["--return_timestamps"] if ts else []), *flags)
    with torch.no_grad():
        ref = m.generate(torch.tensor(x), return_token_timestamps=True, return_timestamps=ts,
                         return_segments=True, **kw)
    return compare_token_times(got, ref)


# ---- words: a Whisper over GPT-2's byte-level BPE ----------------------------------------------

SPECIALS = ["<|startoftranscript|>", "<|en|>", "<|de|>", "<|translate|>", "<|transcribe|>",
            "<|startoflm|>", "<|startofprev|>", "<|nospeech|>", "<|notimestamps|>", "<|zh|>"]
WINDOW_S, RATE = 1, 16000
# tokens the model is biased to: words with and without a leading space, punctuation (closing,
# opening, alone) and "é" as its two byte tokens
# (a timestamp's time is its index * 0.02 s)
SCRIPT = ["<|0.00|>", " the", " caf", "Ã", "©", "s", " sat", ",", " \"", "ting", "'", "-", " a",
          "!", "<|0.30|>", "<|0.30|>", " on", " the", " mat", ".", " (", "well", ")", "<|0.60|>",
          "<|0.60|>", " cat", "<|0.90|>", "<|0.90|>"]
BYTE_TOKENS = {"Ã", "©"}  # GPT-2's tokens of the bytes C3 A9: "é"


def steer(m, tok, eos):
    """Makes the decoder say SCRIPT, one token per position after the 3-token prompt: every
    sub-layer's output projection zeroed, so its hidden state is its token's and its position's
    embeddings, a position's embedding 12 times its scripted token's; the scripted tokens' rows
    orthonormal, every other text token's zero (the special tokens' stay random)."""
    ids = [[tok.convert_tokens_to_ids(w)] if w in BYTE_TOKENS else
           tok.convert_tokens_to_ids(tok.tokenize(w)) for w in SCRIPT]
    assert all(len(i) == 1 for i in ids), [w for w, i in zip(SCRIPT, ids) if len(i) != 1]
    ids = [i[0] for i in ids]
    with torch.no_grad():
        dec = m.model.decoder
        for layer in dec.layers:
            for lin in (layer.self_attn.out_proj, layer.encoder_attn.out_proj, layer.fc2):
                lin.weight.zero_()
                lin.bias.zero_()
        emb = dec.embed_tokens.weight
        unique = sorted(set(ids))
        q, _ = torch.linalg.qr(torch.randn(emb.shape[1], len(unique),
                                           generator=torch.Generator().manual_seed(1)))
        rows = dict(zip(unique, q.T))
        emb[:eos] = 0
        for i, r in rows.items():
            emb[i] = r
        for t, i in enumerate(ids):
            dec.embed_positions.weight[3 + t] = 12 * rows[i]
        dec.layer_norm.weight.fill_(1.0)
        dec.layer_norm.bias.zero_()


def word_setup(tmp):
    d = os.path.join(tmp, "words")
    with open(os.path.join(GPT2, "vocab.json"), encoding="utf-8") as f:
        vocab = json.load(f)
    with open(os.path.join(GPT2, "merges.txt"), encoding="utf-8") as f:
        merges = [tuple(line.split()) for line in f.read().splitlines()[1:] if line.strip()]
    base = tr.WhisperTokenizer(vocab=vocab, merges=merges)
    base.add_special_tokens({"additional_special_tokens": SPECIALS})
    base.pad_token = "<|endoftext|>"
    stamps = [f"<|{i * 0.02:.2f}|>" for i in range(WINDOW_S * 50 + 1)]
    base.add_tokens(stamps)
    base.save_pretrained(d)
    tok = tr.WhisperTokenizer.from_pretrained(d)
    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIALS}
    V = len(tok)
    eos = tok.convert_tokens_to_ids("<|endoftext|>")
    cfg = tr.WhisperConfig(vocab_size=V, d_model=64, encoder_layers=2, decoder_layers=2,
                           encoder_attention_heads=4, decoder_attention_heads=4,
                           encoder_ffn_dim=96, decoder_ffn_dim=80, num_mel_bins=16,
                           max_source_positions=50 * WINDOW_S, max_target_positions=48,
                           pad_token_id=eos, bos_token_id=eos, eos_token_id=eos,
                           decoder_start_token_id=ids["<|startoftranscript|>"], 
                           begin_suppress_tokens=[220, eos], suppress_tokens=[])
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    m = s2s.randomize(tr.WhisperForConditionalGeneration(cfg)).eval()
    steer(m, tok, eos)
    g = m.generation_config
    g.decoder_start_token_id = ids["<|startoftranscript|>"]
    g.lang_to_id = {t: ids[t] for t in ("<|en|>", "<|de|>", "<|zh|>")}
    g.task_to_id = {"translate": ids["<|translate|>"], "transcribe": ids["<|transcribe|>"]}
    g.is_multilingual = True
    g.no_timestamps_token_id = ids["<|notimestamps|>"]
    g.prev_sot_token_id = ids["<|startofprev|>"]
    g.max_initial_timestamp_index = 50
    g.alignment_heads = HEADS
    g.suppress_tokens, g.begin_suppress_tokens = [], [220, eos]
    g.language, g.task = "en", "transcribe"
    m.save_pretrained(d)
    fe = tr.WhisperFeatureExtractor(feature_size=16, chunk_length=WINDOW_S)
    fe.save_pretrained(d)
    rng = np.random.default_rng(5)
    audio = {}
    for name, seconds in (("a", 0.43), ("b", 0.71), ("c", 1.0), ("long", 2.6)):
        n = int(seconds * RATE)
        t = np.arange(n) / RATE
        x = 0.3 * np.sin(2 * np.pi * (180 + 90 * np.sin(3 * t)) * t) + 0.05 * rng.normal(size=n)
        pcm = np.clip(x * 32767, -32768, 32767).astype(np.int16)
        path = os.path.join(d, f"{name}.wav")
        with wave.open(path, "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(RATE)
            w.writeframes(pcm.tobytes())
        audio[name] = (path, pcm.astype(np.float32) / 32768.0)
    pipe = tr.pipeline("automatic-speech-recognition", model=m, tokenizer=tok,
                       feature_extractor=fe, device="cpu")
    return d, audio, pipe, tok


shared_words = with_shared(word_setup)


def pipeline_words(pipe, arrays, batch_size, beams):
    # (Transformers 5's pipeline defaults to num_beams 5; onyx to the model's generation config)
    out = pipe([{"raw": a, "sampling_rate": RATE} for a in arrays], return_timestamps="word",
               batch_size=batch_size, generate_kwargs={"max_new_tokens": 30, "num_beams": beams})
    return [[(c["text"], round(float(c["timestamp"][0]), 2), round(float(c["timestamp"][1]), 2))
             for c in o["chunks"]] for o in out]


def case_words(shared, kind):
    d, audio, pipe, _ = shared
    names = {"short": ["a", "b", "c"], "long": ["long"], "beams": ["b"]}[kind]
    beams = 5 if kind == "beams" else 1
    got = onyx_rows(d, "--audio", *[audio[n][0] for n in names], "--word_timestamps",
                    "--max_new_tokens", "30", "--num_beams", str(beams))
    want = pipeline_words(pipe, [audio[n][1] for n in names], len(names), beams)
    msgs, n, punct = [], 0, 0
    for name, g, w in zip(names, got, want):
        mine = [(x["text"], round(x["start"], 2), round(x["end"], 2)) for x in g["words"]]
        if mine != w:
            msgs.append(f"{name}: onyx {mine} vs {w}")
        n += len(w)
        punct += sum(any(c in t for c in ",.!()\"'-") for t, _, _ in w)
    ok = not msgs and n >= 6 and punct > 0
    return ok, "; ".join(msgs) or f"{n} words of {len(names)} files ({punct} with punctuation) " \
                                  f"= the pipeline's, e.g. {want[0][:4]}"


def case_words_chinese(shared):
    """--language zh: the words split at characters, = the pipeline's grouping
    (WhisperTokenizer._decode_asr) on onyx's tokens and times with the tokenizer's language set
    to chinese (the pipeline itself never sees the language: generate() strips its token)."""
    d, audio, _, tok = shared
    names = ["a", "b", "c"]
    got = onyx_rows(d, "--audio", *[audio[n][0] for n in names], "--word_timestamps",
                    "--max_new_tokens", "30", "--language", "zh")
    tok.language = "chinese"
    msgs, n = [], 0
    try:
        for name, g in zip(names, got):
            _, out = tok._decode_asr([{"tokens": torch.tensor([g["completion_ids"]]),
                                       "token_timestamps": torch.tensor([g["token_timestamps"]])}],
                                     return_timestamps="word", return_language=False,
                                     time_precision=0.02)
            want = [(c["text"], round(float(c["timestamp"][0]), 2),
                     round(float(c["timestamp"][1]), 2)) for c in out["chunks"]]
            mine = [(x["text"], round(x["start"], 2), round(x["end"], 2)) for x in g["words"]]
            if mine != want:
                msgs.append(f"{name}: onyx {mine} vs {want}")
            n += len(want)
    finally:
        tok.language = None
    words = [w["text"] for g in got for w in g["words"]]
    ok = not msgs and n > 0 and "é" in words and "s" in words  # split at characters
    return ok, "; ".join(msgs) or f"{n} words of {len(names)} files = _decode_asr's, e.g. " \
                                  f"{words[:14]}"


def case_errors(tmp):
    m, d = token_model(tmp, "errors")
    x = np.random.default_rng(3).normal(0, 1, (1, 16, 24)).astype(np.float32)
    save_file({"input_features": x}, f"{d}/enc.safetensors")
    bare = os.path.join(tmp, "no-heads")
    m.generation_config.alignment_heads = None
    m.save_pretrained(bare)
    save_file({"input_features": x}, f"{bare}/enc.safetensors")
    outside = os.path.join(tmp, "outside")
    m.generation_config.alignment_heads = [[0, 1], [2, 0]]
    m.save_pretrained(outside)
    save_file({"input_features": x}, f"{outside}/enc.safetensors")
    bart = os.path.join(tmp, "bart")
    s2s.bart().save_pretrained(bart)
    save_file({"input_ids": np.array([[0, 5, 6, 2]], dtype=np.int64)}, f"{bart}/enc.safetensors")
    msgs, ok = [], True
    for model, flags, needle in ((bare, ["--return_token_timestamps"], "alignment_heads"),
                                 (outside, ["--return_token_timestamps"], "alignment head [2, 0]"),
                                 (d, ["--word_timestamps"], "tokenizer"),
                                 (bart, ["--word_timestamps"], "Whisper")):
        p = s2s.onyx("generate", model, "--encoder_inputs", f"{model}/enc.safetensors", *flags,
                     check=False)
        err = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ""
        good = p.returncode == 1 and needle in err
        ok &= good
        msgs.append(f"{os.path.basename(model)} {' '.join(flags)}: exit {p.returncode}"
                    + ("" if good else f": {err}"))
    return ok, "; ".join(msgs)


def main():
    cases = [(f"tokens-{k}", lambda t, k=k: case_tokens(t, k))
             for k in ("plain", "timestamps", "long", "beams")]
    cases += [(f"words-{k}", shared_words(lambda s, k=k: case_words(s, k)))
              for k in ("short", "long", "beams")]
    cases.append(("words-chinese", shared_words(case_words_chinese)))
    cases.append(("errors", case_errors))
    sys.exit(run_cases(cases, "onyx-word-ts-"))


if __name__ == "__main__":
    main()
