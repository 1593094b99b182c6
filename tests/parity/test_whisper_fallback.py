"""test_whisper_fallback.py — Whisper's temperature fallback (src/generate/whisper_fallback.cc)
against Transformers' WhisperForConditionalGeneration.generate(temperature=..., logprob_threshold=,
compression_ratio_threshold=, no_speech_threshold=) on the random timestamp Whisper of
test_seq2seq.py (97 tokens, <|nospeech|> = no_timestamps_token_id - 1), 8 one-window rows.

Cases (one PASS / FAIL line each):
  metrics-{timestamps,plain}  `onyx generate --output` reports per segment the window's
                   avg_logprob, compression_ratio and no_speech_prob: = Transformers' own
                   _retrieve_avg_logprobs (processed scores of the generated tokens, eos included),
                   _retrieve_compression_ratio (zlib) and WhisperNoSpeechDetection's probability
                   (softmax of the raw logits after <|startoftranscript|>), within 1e-4; with
                   timestamps (<|startoftranscript|> ends the prompt: the first pass's logits)
                   and without (<|notimestamps|> after it: one more prefill)
  skip-{timestamps,plain}  temperature 0, logprob_threshold 0 (every window is unlikely) and
                   no_speech_threshold the median of the rows' no-speech probabilities: the rows
                   above it skipped (no segment), the others' tokens and segments = Transformers'
  fallback         --temperature 0,1 with logprob_threshold between the rows' greedy averages:
                   the rows at or above it keep Transformers' greedy tokens (temperature 0 in the
                   segments), the rows below are decoded again by sampling (temperature 1), as
                   Transformers decides; then compression_ratio_threshold likewise
  errors           no_speech_threshold without logprob_threshold, a negative temperature, the
                   thresholds on a BART model: exit 1 naming the flag

Sampled tokens cannot equal Transformers' (its torch.multinomial draws, onyx's own generator), so
the fallback case compares decisions: which rows were decoded again and at which temperature.

Run: ONYX=build/onyx build/venv/bin/python tests/parity/test_whisper_fallback.py [filter]
Ends with "N passed, M failed"; exits 1 if any case failed.
"""
import json
import os
import sys

import numpy as np
import torch
from case_runner import run_cases
from safetensors.numpy import save_file
from transformers.models.whisper.generation_whisper import WhisperGenerationMixin as HFWhisper

import test_seq2seq as s2s

V, EOS, NEW = s2s.V, 1, 8


def setup(tmp, name):
    """The model saved, 8 rows of features, and the per-row reference quantities."""
    m = s2s.timestamp_whisper()
    d = os.path.join(tmp, name)
    m.save_pretrained(d)
    x = np.random.default_rng(21).normal(0, 1, (8, 16, 24)).astype(np.float32)
    save_file({"input_features": x}, f"{d}/enc.safetensors")
    return m, d, x


def run_onyx(d, *flags):
    s2s.onyx("generate", d, "--encoder_inputs", f"{d}/enc.safetensors", "--output",
             f"{d}/out.jsonl", "--max_new_tokens", str(NEW), *flags)
    with open(f"{d}/out.jsonl") as f:
        return [json.loads(line) for line in f]


def no_speech_probs(m, x, prompt):
    """WhisperNoSpeechDetection's value per row: softmax of the logits at <|startoftranscript|>."""
    ids = torch.tensor([prompt] * len(x))
    with torch.no_grad():
        logits = m(input_features=torch.tensor(x), decoder_input_ids=ids).logits[:, 0]
    token = m.generation_config.no_timestamps_token_id - 1
    return logits.float().softmax(-1)[:, token].tolist()


def window_metrics(result, prompt_len):
    """Transformers' avg logprob and compression ratio of one window's decoding (its `result`):
    the generated tokens with the eos but without the padding after it, as _need_fallback."""
    toks = result["sequences"][prompt_len:]
    n = len(toks)
    while n > 1 and toks[n - 1] == EOS and toks[n - 2] == EOS:
        n -= 1
    toks = toks[:n]
    avg = float(HFWhisper._retrieve_avg_logprobs(result["scores"], toks, 0.0))
    return avg, HFWhisper._retrieve_compression_ratio(toks, V)


def hf_generate(m, x, timestamps, **kw):
    with torch.no_grad():
        return m.generate(torch.tensor(x), max_new_tokens=NEW, return_timestamps=timestamps,
                          return_segments=True, **kw)


def prompt_of(timestamps):
    return [2] if timestamps else [2, V - 27]  # <|startoftranscript|> (<|notimestamps|>)


def case_metrics(tmp, timestamps):
    m, d, x = setup(tmp, f"metrics-{timestamps}")
    flags = ["--return_timestamps"] if timestamps else []
    got = run_onyx(d, *flags, "--logprob_threshold", "-1000", "--no_speech_threshold", "0.99")
    ref = hf_generate(m, x, timestamps, temperature=0.0, logprob_threshold=-1000.0)
    ns = no_speech_probs(m, x, prompt_of(timestamps))
    worst, n = 0.0, 0
    for r in range(len(x)):
        want = [window_metrics(s["result"], len(prompt_of(timestamps))) for s in ref["segments"][r]]
        segs = got[r]["segments"]
        assert len(segs) == len(want), f"row {r}: {len(segs)} segments vs {len(want)}"
        for s, (avg, ratio) in zip(segs, want):
            worst = max(worst, abs(s["avg_logprob"] - avg), abs(s["compression_ratio"] - ratio),
                        abs(s["no_speech_prob"] - ns[r]) if s is segs[0] else 0.0)
            assert s["temperature"] == 0, s
            n += 1
    return worst <= 1e-4, f"{n} segments of 8 rows: largest difference {worst:.1e}"


def case_skip(tmp, timestamps):
    m, d, x = setup(tmp, f"skip-{timestamps}")
    ns = no_speech_probs(m, x, prompt_of(timestamps))
    threshold = float(np.median(ns))
    flags = ["--return_timestamps"] if timestamps else []
    got = run_onyx(d, *flags, "--temperature", "0", "--logprob_threshold", "0",
                   "--no_speech_threshold", repr(threshold))
    ref = hf_generate(m, x, timestamps, temperature=0.0, logprob_threshold=0.0,
                      no_speech_threshold=threshold)
    ok, skipped, msgs = True, 0, []
    for r in range(len(x)):
        want = [int(t) for t in ref["sequences"][r].tolist()]
        while want and want[-1] == EOS:
            want.pop()
        want_times = [(round(float(s["start"]), 2), round(float(s["end"]), 2))
                      for s in ref["segments"][r]]
        got_times = [(s["start"], s["end"]) for s in got[r]["segments"]]
        same = got[r]["completion_ids"] == want and got_times == want_times
        should = ns[r] > threshold
        same &= (not want_times) == should
        skipped += should
        ok &= same
        if not same:
            msgs.append(f"row {r} (no-speech {ns[r]:.4f} vs {threshold:.4f}): onyx "
                        f"{got[r]['completion_ids']} {got_times} vs {want} {want_times}")
    ok &= 0 < skipped < len(x)
    return ok, (f"{skipped} of 8 rows skipped as silent, the rest = Transformers'" if ok
                else "; ".join(msgs) or f"{skipped} rows skipped: the case needs some of each")


def split_rows(values):
    """A threshold strictly between the lower and the upper half of `values`."""
    v = sorted(values)
    return (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2


def case_fallback(tmp):
    m, d, x = setup(tmp, "fallback")
    greedy = hf_generate(m, x, True, temperature=0.0, logprob_threshold=-1000.0)
    first = [window_metrics(greedy["segments"][r][0]["result"], 1) for r in range(len(x))]
    msgs, ok = [], True
    for key, values, again in (("logprob", [a for a, _ in first], lambda v, t: v < t),
                               ("compression_ratio", [c for _, c in first], lambda v, t: v > t)):
        threshold = split_rows(values)
        if len({round(v, 9) for v in values}) < 2:
            return False, f"every row's {key} is {values[0]}: the case cannot split them"
        got = run_onyx(d, "--return_timestamps", "--temperature", "0,1", "--seed", "3",
                       f"--{key}_threshold", repr(threshold))
        ref = hf_generate(m, x, True, temperature=(0.0, 1.0), **{f"{key}_threshold": threshold})
        retried = 0
        for r in range(len(x)):
            redo = again(values[r], threshold)
            temps = {s["temperature"] for s in got[r]["segments"][:1]}
            good = temps == ({1.0} if redo else {0.0})
            if not redo:  # Transformers' greedy tokens
                want = [int(t) for t in ref["sequences"][r].tolist()]
                while want and want[-1] == EOS:
                    want.pop()
                good &= got[r]["completion_ids"] == want
            retried += redo
            ok &= good
            if not good:
                msgs.append(f"{key} row {r} ({values[r]:.4f} vs {threshold:.4f}): onyx "
                            f"temperature {temps}, {got[r]['completion_ids']}")
        msgs.append(f"{key} threshold {threshold:.4f}: {retried} of 8 rows sampled again")
    return ok, "; ".join(msgs)


def case_errors(tmp):
    m, d, x = setup(tmp, "errors")
    bart = os.path.join(tmp, "bart")
    s2s.bart().save_pretrained(bart)
    save_file({"input_ids": np.array([[0, 5, 6, 2]], dtype=np.int64)}, f"{bart}/enc.safetensors")
    msgs, ok = [], True
    for model, flags, needle in (
            (d, ["--no_speech_threshold", "0.6"], "logprob_threshold"),
            (d, ["--temperature", "0,-0.2", "--logprob_threshold", "-1"], "temperature"),
            (bart, ["--logprob_threshold", "-1"], "Whisper"),
            (bart, ["--temperature", "0,0.5"], "Whisper")):
        p = s2s.onyx("generate", model, "--encoder_inputs", f"{model}/enc.safetensors", *flags,
                     check=False)
        err = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ""
        good = p.returncode == 1 and needle in err
        ok &= good
        msgs.append(f"{' '.join(flags)}: exit {p.returncode}" + ("" if good else f": {err}"))
    return ok, "; ".join(msgs)


def main():
    cases = [
        ("metrics-timestamps", lambda t: case_metrics(t, True)),
        ("metrics-plain", lambda t: case_metrics(t, False)),
        ("skip-timestamps", lambda t: case_skip(t, True)),
        ("skip-plain", lambda t: case_skip(t, False)),
        ("fallback", case_fallback),
        ("errors", case_errors),
    ]
    return run_cases(cases, "onyx-test-whisper-fallback-")


if __name__ == "__main__":
    sys.exit(main())
