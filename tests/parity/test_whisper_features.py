"""test_whisper_features.py — Whisper's log-mel input features (issue #40: src/data/wav.cc,
src/data/whisper_features.cc, `onyx whisper-features`) against Transformers 5.24's
WhisperFeatureExtractor (its torch path) on WAV files written here.

Cases (one PASS / FAIL line each):
  features       WAV files of several lengths and encodings — PCM16 mono 0.5 s, 3.2 s and 31 s
                 (cut to 30 s), PCM16 stereo (channels averaged), PCM 8-bit, 24-bit and 32-bit,
                 float32 and float64, a chunk with a fmt extension and an odd-sized chunk before the
                 data — each decoded here as soundfile does (integers / 2^(bits-1), channels
                 averaged) and given to WhisperFeatureExtractor(feature_size=80): every feature
                 within 1e-4 (absolute) of onyx's, shape (N, 80, 3000)
  mel-128        whisper-large-v3's 128 mel bins (--feature_size 128): within 1e-4
  resampled      WAV files at 8, 22.05, 44.1 and 48 kHz (PCM16 0.77 s, float32 4.2 s, 24-bit stereo
                 2 s, PCM16 31 s) against Transformers' speech-recognition pipeline's preprocessing:
                 `ffmpeg_read` (the ffmpeg command, -ac 1 -ar 16000) then WhisperFeatureExtractor:
                 every feature within 1e-4 (stereo: onyx averages the channels, as soundfile,
                 librosa and torchaudio do; ffmpeg's -ac 1 mixes them at -3 dB, (L + R) / sqrt(2),
                 so that file's pipeline samples are scaled by 1 / sqrt(2) first); and for the
                 mono files onyx's resampling equals
                 ffmpeg's sample for sample: the features of the file equal (exactly) onyx's own
                 features of ffmpeg's 16 kHz float32 rendering of it
  long-form      --no_truncation on files of 3.2, 31 and 45 s (one 44.1 kHz) against
                 WhisperFeatureExtractor(truncation=False, padding="longest"): every feature
                 within 1e-4, shape (3, 80, 4500); one 45 s file alone: (1, 80, 4500)
  errors         a file at 50 Hz (rates must be 100 Hz - 1 MHz), A-law encoding, a text file, a
                 header cut off: exit 1 naming the file and the reason, nothing written

Run: ONYX=build/onyx build/venv/bin/python tests/parity/test_whisper_features.py
Ends with "N passed, M failed"; exits 1 if any case failed.
"""
import os
import struct
import subprocess
import sys

import numpy as np
from case_runner import run_cases
from safetensors.numpy import load_file

ONYX = os.environ.get("ONYX", "build/onyx")
RATE = 16000


def wav_bytes(frames, code, bits, rate=RATE, extra_fmt=b"", junk=None):
    """A RIFF/WAVE file: `frames` (n, channels) already encoded as bytes per sample."""
    n, channels = frames.shape[0], frames.shape[1]
    if code == 3:
        data = frames.astype(np.float32 if bits == 32 else np.float64).tobytes()
    elif bits == 8:
        data = np.clip(np.round(frames * 128 + 128), 0, 255).astype(np.uint8).tobytes()
    elif bits == 24:
        ints = np.clip(np.round(frames * 2**23), -2**23, 2**23 - 1).astype(np.int32)
        data = b"".join(int(v).to_bytes(3, "little", signed=True) for v in ints.reshape(-1))
    else:
        dt = np.int16 if bits == 16 else np.int32
        scale = 2.0 ** (bits - 1)
        data = np.clip(np.round(frames * scale), -scale, scale - 1).astype(dt).tobytes()
    block = channels * bits // 8
    fmt = struct.pack("<HHIIHH", code, channels, rate, rate * block, block, bits)
    if extra_fmt:
        fmt += struct.pack("<H", len(extra_fmt)) + extra_fmt
    chunks = b"fmt " + struct.pack("<I", len(fmt)) + fmt
    if junk is not None:
        chunks += b"LIST" + struct.pack("<I", len(junk)) + junk + (b"\0" if len(junk) % 2 else b"")
    chunks += b"data" + struct.pack("<I", len(data)) + data
    return b"RIFF" + struct.pack("<I", 4 + len(chunks)) + b"WAVE" + chunks


def decoded(path):
    """The file's samples as soundfile / librosa read them: float, channels averaged."""
    raw = open(path, "rb").read()
    pos, fmt = 12, None
    while pos + 8 <= len(raw):
        cid, size = raw[pos:pos + 4], struct.unpack("<I", raw[pos + 4:pos + 8])[0]
        body = raw[pos + 8:pos + 8 + size]
        if cid == b"fmt ":
            fmt = struct.unpack("<HHIIHH", body[:16])
        elif cid == b"data":
            code, channels, _, _, _, bits = fmt
            if code == 3:
                x = np.frombuffer(body, np.float32 if bits == 32 else np.float64).astype(np.float64)
            elif bits == 8:
                x = (np.frombuffer(body, np.uint8).astype(np.float64) - 128) / 128
            elif bits == 24:
                b = np.frombuffer(body, np.uint8).reshape(-1, 3).astype(np.int32)
                v = b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16)
                x = np.where(v >= 2**23, v - 2**24, v) / 2.0**23
            else:
                x = np.frombuffer(body, np.int16 if bits == 16 else np.int32) / 2.0 ** (bits - 1)
            return x.reshape(-1, channels).mean(axis=1).astype(np.float32)
        pos += 8 + size + (size & 1)
    raise ValueError(path)


def signal(seconds, channels=1, seed=0):
    """A chirp with a tone and a little noise, peak ~0.8: speech-like energy spread over bins."""
    t = np.arange(int(seconds * RATE)) / RATE
    rng = np.random.default_rng(seed)
    cols = [0.5 * np.sin(2 * np.pi * (200 + 1500 * t / max(seconds, 1e-3) * (c + 1)) * t)
            + 0.25 * np.sin(2 * np.pi * 440 * t) + 0.02 * rng.standard_normal(t.size)
            for c in range(channels)]
    return np.stack(cols, axis=1)


FILES = [  # name, seconds, channels, encoding, bits, extras
    ("pcm16-0.5s", 0.5, 1, 1, 16, {}),
    ("pcm16-3.2s", 3.2, 1, 1, 16, {}),
    ("pcm16-31s", 31.0, 1, 1, 16, {}),
    ("pcm16-stereo", 5.0, 2, 1, 16, {}),
    ("pcm8", 1.0, 1, 1, 8, {}),
    ("pcm24", 2.0, 1, 1, 24, {}),
    ("pcm32", 2.5, 1, 1, 32, {}),
    ("float32", 12.345, 1, 3, 32, {}),
    ("float64", 0.75, 1, 3, 64, {}),
    ("fmt-extension-and-junk", 1.5, 1, 1, 16, {"extra_fmt": b"\0\0", "junk": b"INFOabc"}),
]


def write_files(tmp):
    paths = []
    for i, (name, secs, ch, code, bits, extra) in enumerate(FILES):
        p = os.path.join(tmp, name + ".wav")
        with open(p, "wb") as f:
            f.write(wav_bytes(signal(secs, ch, seed=i), code, bits, **extra))
        paths.append(p)
    return paths


def onyx_features(tmp, paths, name, *extra):
    out = os.path.join(tmp, name + ".safetensors")
    p = subprocess.run([ONYX, "whisper-features", *paths, "--output", out, *extra],
                       capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        raise AssertionError(f"onyx whisper-features exited {p.returncode}: {p.stderr[-600:]}")
    return load_file(out)["input_features"]


def reference(paths, feature_size):
    from transformers import WhisperFeatureExtractor
    fe = WhisperFeatureExtractor(feature_size=feature_size)
    return np.stack([fe(decoded(p), sampling_rate=RATE, return_tensors="np").input_features[0]
                     for p in paths])


def case_features(tmp):
    paths = write_files(tmp)
    got, want = onyx_features(tmp, paths, "f80"), reference(paths, 80)
    errs = np.abs(got - want).reshape(len(paths), -1).max(axis=1)
    worst = FILES[int(errs.argmax())][0]
    ok = got.shape == want.shape == (len(paths), 80, 3000) and errs.max() < 1e-4
    return ok, (f"{len(paths)} files {got.shape}: worst abs {errs.max():.1e} ({worst}); "
                f"values {want.min():.3f}..{want.max():.3f}")


def case_mel_128(tmp):
    paths = write_files(tmp)[1:3]
    got, want = onyx_features(tmp, paths, "f128", "--feature_size", "128"), reference(paths, 128)
    err = float(np.abs(got - want).max())
    return got.shape == want.shape == (2, 128, 3000) and err < 1e-4, f"{got.shape}: worst abs {err:.1e}"


RESAMPLED = [  # name, rate, seconds, channels, encoding, bits
    ("pcm16-8k", 8000, 0.7731, 1, 1, 16),
    ("float32-22k", 22050, 4.2, 1, 3, 32),
    ("pcm24-stereo-48k", 48000, 2.0, 2, 1, 24),
    ("pcm16-44k-31s", 44100, 31.0, 1, 1, 16),
]


def pipeline_features(path, channels):
    """What Transformers' ASR pipeline gives the model for an audio file: ffmpeg_read's samples
    (ffmpeg -ac 1 -ar 16000 -f f32le), then WhisperFeatureExtractor; a stereo file's samples
    brought from ffmpeg's (L + R) / sqrt(2) to the channels' mean."""
    from transformers import WhisperFeatureExtractor
    from transformers.pipelines.audio_utils import ffmpeg_read
    samples = ffmpeg_read(open(path, "rb").read(), RATE)
    if channels == 2:
        samples = (samples.astype(np.float64) * np.sqrt(0.5)).astype(np.float32)
    return WhisperFeatureExtractor(feature_size=80)(samples, sampling_rate=RATE,
                                                    return_tensors="np").input_features[0]


def case_resampled(tmp):
    paths, mono16k = [], []
    for i, (name, rate, secs, ch, code, bits) in enumerate(RESAMPLED):
        t = np.arange(int(secs * rate)) / rate
        x = np.stack([0.5 * np.sin(2 * np.pi * (300 + 900 * c + 2500 * t / secs) * t)
                      + 0.02 * np.random.default_rng(i).standard_normal(t.size)
                      for c in range(ch)], axis=1)
        p = os.path.join(tmp, name + ".wav")
        with open(p, "wb") as f:
            f.write(wav_bytes(x, code, bits, rate=rate))
        paths.append(p)
        if ch == 1:  # ffmpeg's own 16 kHz rendering, as a float32 WAV onyx reads unchanged
            q = os.path.join(tmp, name + "-ffmpeg16k.wav")
            subprocess.run(["ffmpeg", "-hide_banner", "-loglevel", "error", "-y", "-i", p, "-ac",
                            "1", "-ar", str(RATE), "-c:a", "pcm_f32le", q], check=True)
            mono16k.append(q)
    got = onyx_features(tmp, paths, "resampled")
    want = np.stack([pipeline_features(p, r[3]) for p, r in zip(paths, RESAMPLED)])
    errs = np.abs(got - want).reshape(len(paths), -1).max(axis=1)
    mono = [i for i, r in enumerate(RESAMPLED) if r[3] == 1]
    same = onyx_features(tmp, mono16k, "ffmpeg16k")
    exact = int((got[mono] != same).sum())
    ok = got.shape == want.shape and errs.max() < 1e-4 and exact == 0
    return ok, (f"{len(paths)} files against the pipeline: worst abs {errs.max():.1e} "
                f"({RESAMPLED[int(errs.argmax())][0]}); mono files vs ffmpeg's 16 kHz samples: "
                f"{exact} features differ")


def case_long_form(tmp):
    from transformers import WhisperFeatureExtractor
    from transformers.pipelines.audio_utils import ffmpeg_read
    specs = [("long-3.2s", RATE, 3.2), ("long-31s", RATE, 31.0), ("long-45s-44k", 44100, 45.0)]
    paths, samples = [], []
    for i, (name, rate, secs) in enumerate(specs):
        t = np.arange(int(secs * rate)) / rate
        x = (0.4 * np.sin(2 * np.pi * (250 + 40 * t) * t) * (1 + np.sin(2 * np.pi * 0.3 * t))
             + 0.02 * np.random.default_rng(20 + i).standard_normal(t.size))[:, None]
        p = os.path.join(tmp, name + ".wav")
        with open(p, "wb") as f:
            f.write(wav_bytes(x, 1, 16, rate=rate))
        paths.append(p)
        samples.append(ffmpeg_read(open(p, "rb").read(), RATE) if rate != RATE else decoded(p))
    fe = WhisperFeatureExtractor(feature_size=80)
    msgs, ok = [], True
    for group in (paths, paths[2:]):
        got = onyx_features(tmp, group, f"long{len(group)}", "--no_truncation")
        want = fe([samples[paths.index(p)] for p in group], sampling_rate=RATE, truncation=False,
                  padding="longest", return_tensors="np").input_features
        err = float(np.abs(got - want).max()) if got.shape == want.shape else float("inf")
        ok &= got.shape == want.shape and err < 1e-4
        msgs.append(f"{len(group)} files {got.shape} (want {want.shape}): worst abs {err:.1e}")
    return ok, "; ".join(msgs)


def case_errors(tmp):
    msgs, ok = [], True

    def expect(name, content, want):
        nonlocal ok
        p = os.path.join(tmp, name + ".wav")
        with open(p, "wb") as f:
            f.write(content)
        out = os.path.join(tmp, name + ".safetensors")
        r = subprocess.run([ONYX, "whisper-features", p, "--output", out], capture_output=True,
                           text=True, timeout=60)
        good = r.returncode == 1 and want in r.stderr and p in r.stderr and not os.path.exists(out)
        ok &= good
        msgs.append(f"{name}: {'ok' if good else 'exit %d %r' % (r.returncode, r.stderr[-200:])}")

    expect("rate-50", wav_bytes(signal(0.2), 1, 16, rate=50), "rates must be 100 Hz - 1 MHz")
    alaw = bytearray(wav_bytes(signal(0.2), 1, 16))
    alaw[20:22] = struct.pack("<H", 6)
    expect("alaw", bytes(alaw), "encoding 6 is not supported")
    expect("text", b"this is not audio at all", "not a RIFF/WAVE file")
    expect("cut-header", wav_bytes(signal(0.2), 1, 16)[:30], "does not fit the file")
    return ok, "; ".join(msgs)


def main():
    return run_cases([("features", case_features), ("mel-128", case_mel_128),
                      ("resampled", case_resampled), ("long-form", case_long_form),
                      ("errors", case_errors)],
                     "onyx-test-whisper-features-")


if __name__ == "__main__":
    sys.exit(main())
