"""test_speech.py — speech recognition end to end (issue #40): examples/make_speech_data.py
synthesizes a small set (6 words, espeak-ng voices, sox noise), then

  audio-features  `onyx generate --audio WAV...` (features computed by onyx from the files) gives
                  the same ids as `--encoder_inputs` holding Transformers' WhisperFeatureExtractor
                  features of the same files (chunk_length 2 s): the audio path is the
                  extractor's, through a trained model
  train-speech    `onyx train` with `train_data: {type: speech, ...}` on the manifest: the loss
                  falls, predict_with_generate reports eval_gen_* metrics, and the run's folder
                  generates with --audio (transcripts decoded by the saved tokenizer)
  bad-audio       an A-law WAV in the manifest, a row without "text", a missing file: exit 1
                  naming the file / line and what is wrong; a 22.05 kHz WAV trains (resampled)

Run: ONYX=build/onyx build/venv/bin/python tests/cli/test_speech.py [filter]
Ends with "N passed, M failed"; exits 1 if any case failed.
"""
import json
import os
import shutil
import subprocess
import sys
import wave

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "tests", "parity"))
from case_runner import run_cases, with_shared  # noqa: E402

ONYX = os.path.abspath(os.environ.get("ONYX", os.path.join(REPO, "build", "onyx")))


def onyx(*args, check=True, cwd=None):
    p = subprocess.run([ONYX] + list(args), capture_output=True, text=True, timeout=900, cwd=cwd)
    if check and p.returncode != 0:
        raise AssertionError(f"onyx {args[0]} exited {p.returncode}: {p.stderr.strip()[-800:]}")
    return p


def setup(tmp):
    """The small data set and a model trained on it for 120 steps (shared by the cases)."""
    data = os.path.join(tmp, "speech")
    subprocess.run([sys.executable, os.path.join(REPO, "examples", "make_speech_data.py"), data,
                    "--words", "6", "--per-voice", "10"], check=True, capture_output=True)
    cfg = os.path.join(tmp, "train.yaml")
    with open(cfg, "w") as f:
        f.write(f"""model: {{config: {data}/model/config.json}}
train_data: {{type: speech, path: {data}/train.jsonl, tokenizer: {data}/processor}}
eval_data: {{type: speech, path: {data}/eval.jsonl, tokenizer: {data}/processor}}
output_dir: {tmp}/run
max_steps: 120
per_device_train_batch_size: 16
per_device_eval_batch_size: 16
learning_rate: 2.0e-3
warmup_steps: 10
logging_steps: 20
eval_strategy: steps
eval_steps: 120
predict_with_generate: true
save_strategy: "no"
disable_tqdm: true
""")
    onyx("train", cfg)
    with open(os.path.join(tmp, "run", "log_history.jsonl")) as f:
        logs = [json.loads(line) for line in f if line.strip()]
    return {"data": data, "run": os.path.join(tmp, "run"), "logs": logs, "tmp": tmp}


def rows(s, split):
    with open(os.path.join(s["data"], split + ".jsonl")) as f:
        return [json.loads(line) for line in f]


def read_wav16(path):
    """A 16-bit mono WAV's samples in [-1, 1), as soundfile reads them."""
    with wave.open(path) as w:
        assert w.getsampwidth() == 2 and w.getnchannels() == 1, path
        return np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.float32) / 32768.0


def case_audio_features(s):
    import transformers as tr
    from safetensors.numpy import save_file
    wavs = [os.path.join(s["data"], r["audio"]) for r in rows(s, "eval")[:6]]
    fe = tr.WhisperFeatureExtractor(feature_size=80, chunk_length=2)
    audio = [read_wav16(w) for w in wavs]
    feats = fe(audio, sampling_rate=16000, return_tensors="np")["input_features"]
    enc = os.path.join(s["tmp"], "enc.safetensors")
    save_file({"input_features": feats.astype(np.float32)}, enc)
    got = {}
    for name, flags in (("audio", sum([["--audio", w] for w in wavs], [])),
                        ("features", ["--encoder_inputs", enc])):
        out = os.path.join(s["tmp"], name + ".jsonl")
        onyx("generate", s["run"], "--output", out, *flags)
        with open(out) as f:
            got[name] = [json.loads(line)["completion_ids"] for line in f]
    ok = got["audio"] == got["features"] and len(got["audio"]) == len(wavs)
    return ok, (f"{len(wavs)} files: ids from onyx's features = from WhisperFeatureExtractor's "
                f"({sum(map(len, got['audio']))} tokens)" if ok else f"{got}")


def case_train(s):
    losses = [e["loss"] for e in s["logs"] if "loss" in e]
    evals = [e for e in s["logs"] if "eval_gen_token_accuracy" in e]
    out = os.path.join(s["tmp"], "gen.jsonl")
    r = rows(s, "eval")
    onyx("generate", s["run"], "--output", out, "--audio", os.path.join(s["data"], r[0]["audio"]))
    with open(out) as f:
        text = json.loads(f.readline())["completion"]
    ok = losses[-1] < 0.5 * losses[0] and evals and isinstance(text, str)
    return ok, (f"loss {losses[0]:.3f} -> {losses[-1]:.3f}; eval_gen_token_accuracy "
                f"{evals[-1]['eval_gen_token_accuracy']:.2f}; '{r[0]['text']}' -> '{text}'")


def case_bad_audio(s):
    tmp, data = s["tmp"], s["data"]
    good = rows(s, "train")[0]
    wav22, alaw = os.path.join(tmp, "r22.wav"), os.path.join(tmp, "alaw.wav")
    subprocess.run(["sox", os.path.join(data, good["audio"]), "-r", "22050", wav22], check=True)
    subprocess.run(["sox", os.path.join(data, good["audio"]), "-e", "a-law", alaw], check=True)
    cases = [({"audio": alaw, "text": "x"}, ["alaw.wav", "encoding 6 is not supported"]),
             ({"audio": good["audio"]}, ["line 1", "'text'"]),
             ({"audio": "nowhere.wav", "text": "x"}, ["nowhere.wav"]),
             ({"audio": wav22, "text": good["text"]}, None)]
    msgs = []
    for row, want in cases:
        man = os.path.join(data, "bad.jsonl")
        with open(man, "w") as f:
            f.write(json.dumps(row) + "\n")
        cfg = os.path.join(tmp, "bad.yaml")
        with open(cfg, "w") as f:
            f.write(f"model: {{config: {data}/model/config.json}}\ntrain_data: {{type: speech, "
                    f"path: {man}, tokenizer: {data}/processor}}\noutput_dir: {tmp}/bad\n"
                    "max_steps: 1\n")
        p = onyx("train", cfg, check=False)
        err = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ""
        if want is None:  # trains
            if p.returncode != 0:
                return False, f"{row}: exit {p.returncode}: {err}"
            msgs.append("22.05 kHz: trained")
            continue
        elif p.returncode == 0 or not all(w in err for w in want):
            return False, f"{row}: exit {p.returncode}: {err}"
        msgs.append(err[:90])
    return True, "; ".join(msgs)


def main():
    for tool in ("espeak-ng", "sox"):
        if not shutil.which(tool):
            print(f"FAIL setup: {tool} is not installed (scripts/setup.sh installs it)")
            print("0 passed, 1 failed")
            return 1
    shared = with_shared(setup)
    cases = [("audio-features", shared(case_audio_features)), ("train-speech", shared(case_train)),
             ("bad-audio", shared(case_bad_audio))]
    return run_cases(cases, "onyx-test-speech-")


if __name__ == "__main__":
    sys.exit(main())
