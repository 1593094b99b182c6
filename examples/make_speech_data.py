"""Builds the speech example's data (issue #40): spoken words and two-word phrases synthesized with
Debian's espeak-ng in several voices, speeds and pitches, resampled to 16 kHz and mixed with white
noise by sox; transcripts from WordNet's most used lemmas (Debian's wordnet-base).

  OUT/wav/*.wav                    16 kHz mono speech
  OUT/train.jsonl, OUT/eval.jsonl  {"audio": "wav/....wav", "text": "..."}: eval is spoken only by
                                   voices that training never hears (held-out voices)
  OUT/processor/                   tokenizer.json (a word-level WordPiece vocabulary of the
                                   lemmas, "</s>" after each transcript) and preprocessor_config.json
                                   (Whisper's log-mel features over 2 s: 80 bins, 200 frames)
  OUT/model/config.json            a small Whisper-shaped model (WhisperForConditionalGeneration)
                                   to train from scratch: 100 encoder positions = 2 s of audio

Usage: build/venv/bin/python examples/make_speech_data.py OUT [--words N] [--per-voice N]
(the tokenizers library of the reference venv writes tokenizer.json)"""
import argparse
import json
import os
import random
import subprocess
import sys

WORDNET = "/usr/share/wordnet"
TRAIN_VOICES = ["en-us+m1", "en-us+f1", "en-gb+m2", "en-gb+f2", "en-gb-scotland+m3",
                "en-029+f4", "en-gb-x-gbclan+m5", "en-us-nyc+f5"]
HELD_OUT_VOICES = ["en-gb-x-rp+m7", "en-us+f3", "en-gb-x-gbcwmd+m4"]
SECONDS = 2  # the features' chunk_length


def common_lemmas(n):
    """The n most used one-word lemmas (WordNet's tag-sense counts) of 3-8 letters."""
    counts = {}
    for pos in ("noun", "verb", "adj"):
        with open(os.path.join(WORDNET, "index." + pos), encoding="latin-1") as f:
            for line in f:
                if line.startswith(" "):
                    continue
                parts = line.split()
                lemma, tagged = parts[0], int(parts[-int(parts[2]) - 1])
                if lemma.isalpha() and lemma.isascii() and 3 <= len(lemma) <= 8:
                    counts[lemma] = max(counts.get(lemma, 0), tagged)
    return sorted(sorted(counts), key=lambda w: -counts[w])[:n]


def synthesize(text, voice, speed, pitch, noise, path):
    """espeak-ng at 22.05 kHz, then sox: 16 kHz mono 16-bit, white noise mixed in."""
    raw = path + ".raw.wav"
    subprocess.run(["espeak-ng", "-v", voice, "-s", str(speed), "-p", str(pitch), "-w", raw, text],
                   check=True)
    subprocess.run(["sox", "-m", raw, "-v", str(noise),
                    f"|sox -n -r 22050 -c 1 -p synth {SECONDS} whitenoise", "-r", "16000", "-c",
                    "1", "-b", "16", path, "trim", "0", str(SECONDS)], check=True,
                   stderr=subprocess.DEVNULL)
    os.remove(raw)


def utterances(words, voices, per_voice, rng):
    """(text, voice, speed, pitch, noise): per voice, per_voice of them, one word or two."""
    for voice in voices:
        for _ in range(per_voice):
            k = 1 if rng.random() < 0.5 else 2
            yield (" ".join(rng.sample(words, k)), voice, rng.randint(140, 190),
                   rng.randint(30, 70), round(rng.uniform(0.0, 0.08), 3))


def write_tokenizer(words, out):
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    vocab = {t: i for i, t in enumerate(["<pad>", "<unk>", "<s>", "</s>"] + words)}
    tok = Tokenizer(models.WordPiece(vocab, unk_token="<unk>"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(single="$A </s>",
                                                       special_tokens=[("</s>", 3)])
    tok.decoder = decoders.WordPiece()
    tok.save(os.path.join(out, "tokenizer.json"))
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "pad_token": "<pad>",
                   "unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>"}, f, indent=1)
    with open(os.path.join(out, "preprocessor_config.json"), "w") as f:
        json.dump({"feature_extractor_type": "WhisperFeatureExtractor", "feature_size": 80,
                   "sampling_rate": 16000, "hop_length": 160, "n_fft": 400,
                   "chunk_length": SECONDS, "n_samples": SECONDS * 16000,
                   "nb_max_frames": SECONDS * 100, "padding_value": 0.0,
                   "return_attention_mask": False}, f, indent=1)
    return len(vocab)


def write_model_config(vocab_size, out):
    config = {"architectures": ["WhisperForConditionalGeneration"], "model_type": "whisper",
              "vocab_size": vocab_size, "num_mel_bins": 80, "d_model": 128,
              "encoder_layers": 2, "encoder_attention_heads": 4, "encoder_ffn_dim": 512,
              "decoder_layers": 2, "decoder_attention_heads": 4, "decoder_ffn_dim": 512,
              "max_source_positions": SECONDS * 50, "max_target_positions": 16,
              "dropout": 0.1, "pad_token_id": 0, "bos_token_id": 2, "eos_token_id": 3,
              "decoder_start_token_id": 2, "begin_suppress_tokens": None,
              "suppress_tokens": None, "tie_word_embeddings": True}
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--words", type=int, default=40)
    ap.add_argument("--per-voice", type=int, default=250)
    a = ap.parse_args()
    rng = random.Random(0)
    words = common_lemmas(a.words)
    for sub in ("wav", "processor", "model"):
        os.makedirs(os.path.join(a.out, sub), exist_ok=True)
    vocab = write_tokenizer(words, os.path.join(a.out, "processor"))
    write_model_config(vocab, os.path.join(a.out, "model"))
    n = 0
    for split, voices, per in (("train", TRAIN_VOICES, a.per_voice),
                               ("eval", HELD_OUT_VOICES, max(1, a.per_voice // 5))):
        with open(os.path.join(a.out, split + ".jsonl"), "w") as f:
            for text, voice, speed, pitch, noise in utterances(words, voices, per, rng):
                name = f"wav/{split}-{n:05d}.wav"
                synthesize(text, voice, speed, pitch, noise, os.path.join(a.out, name))
                f.write(json.dumps({"audio": name, "text": text, "voice": voice}) + "\n")
                n += 1
    print(f"{n} utterances of {len(words)} words in {a.out}: train voices {len(TRAIN_VOICES)}, "
          f"held-out voices {len(HELD_OUT_VOICES)}")


if __name__ == "__main__":
    sys.exit(main())
