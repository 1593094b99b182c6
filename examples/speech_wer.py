"""The speech example's word error rate (issue #40): transcribes the held-out voices' utterances
(DATA/eval.jsonl) with `onyx generate MODEL --audio ...` (greedy) and scores the transcripts
against the manifest's: WER = word-level edit distance (substitutions + insertions + deletions) /
reference words, overall and per voice.

Usage: build/venv/bin/python examples/speech_wer.py DATA MODEL [--onyx build/onyx]
(MODEL: the trained output_dir or a checkpoint; its tokenizer.json decodes the ids)"""
import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile


def edit_distance(ref, hyp):
    """Levenshtein distance between two word lists."""
    prev = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        cur = [i]
        for j, h in enumerate(hyp, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (r != h)))
        prev = cur
    return prev[-1]


def transcribe(onyx, model, wavs):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out.jsonl")
        cmd = [onyx, "generate", model, "--output", out, "--batch_size", "50",
               "--max_new_tokens", "8"]
        for w in wavs:
            cmd += ["--audio", w]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        with open(out) as f:
            return [json.loads(line)["completion"] for line in f]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("data")
    ap.add_argument("model")
    ap.add_argument("--onyx", default="build/onyx")
    a = ap.parse_args()
    with open(os.path.join(a.data, "eval.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    hyps = transcribe(a.onyx, a.model, [os.path.join(a.data, r["audio"]) for r in rows])
    errors, words = collections.Counter(), collections.Counter()
    for r, h in zip(rows, hyps):
        ref = r["text"].lower().split()
        e = edit_distance(ref, h.lower().split())
        for key in ("all", r["voice"]):
            errors[key] += e
            words[key] += len(ref)
    for key in sorted(words, key=lambda k: (k != "all", k)):
        print(f"WER {key}: {errors[key] / words[key]:.3f} ({errors[key]} errors / {words[key]} words)")
    for r, h in list(zip(rows, hyps))[:5]:
        print(f"  {r['voice']}: '{r['text']}' -> '{h}'")
    return 0


if __name__ == "__main__":
    sys.exit(main())
