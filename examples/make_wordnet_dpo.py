"""Builds the DPO example's preference pairs from Debian's wordnet-base (no network, standard
library only): for a noun, its own gloss is preferred over another noun's.

  OUT/dpo_train.jsonl, OUT/dpo_eval.jsonl
      {"prompt": "Define harbor:", "chosen": " a sheltered port ...", "rejected": " <another gloss>"}

Single-word nouns whose gloss has 4 to 16 words; the rejected gloss is drawn (seeded) from the
other nouns; about one pair in ten goes to the eval file (by a hash of the word).

Usage: python3 examples/make_wordnet_dpo.py OUT_DIR"""
import json
import os
import random
import sys
import zlib

SRC = "/usr/share/wordnet/data.noun"


def nouns():
    seen = set()
    with open(SRC, encoding="latin-1") as f:
        for line in f:
            if line.startswith("  ") or "| " not in line:
                continue
            fields, gloss = line.split("| ", 1)
            word = fields.split()[4]
            gloss = gloss.strip().split("; \"")[0].split(";")[0]
            if "_" in word or not word.isalpha() or word in seen:
                continue
            if 4 <= len(gloss.split()) <= 16:
                seen.add(word)
                yield word, gloss


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    pairs = list(nouns())
    rng = random.Random(0)
    train, evals = [], []
    for i, (word, gloss) in enumerate(pairs):
        other = pairs[(i + rng.randrange(1, len(pairs))) % len(pairs)][1]
        row = {"prompt": f"Define {word}:", "chosen": " " + gloss, "rejected": " " + other}
        (evals if zlib.crc32(word.encode()) % 10 == 0 else train).append(row)
    for name, rows in (("dpo_train.jsonl", train[:4000]), ("dpo_eval.jsonl", evals[:400])):
        with open(os.path.join(out, name), "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    print(f"{min(len(train), 4000)} train / {min(len(evals), 400)} eval pairs in {out}")


if __name__ == "__main__":
    main()
