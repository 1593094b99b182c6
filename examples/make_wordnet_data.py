"""Builds the text examples' data from Debian's wordnet-base (no network, standard library only):

  OUT/pos_train.jsonl, OUT/pos_eval.jsonl  {"text": gloss, "label": noun|verb|adj|adv}
  OUT/glosses_train.txt, OUT/glosses_eval.txt  one gloss per line (causal LM)
  OUT/vocab.txt  a WordPiece vocabulary built from the training glosses: BERT's special tokens,
                 every character (plain and ##-continued), then the most frequent words and
                 ##-suffixes. (No pretrained BERT vocabulary ships in Debian; this one is honest
                 about coming from the data.)

Usage: python3 examples/make_wordnet_data.py OUT_DIR"""
import collections
import json
import os
import re
import sys
import zlib

SRC = "/usr/share/wordnet"
POS = {"noun": "noun", "verb": "verb", "adj": "adj", "adv": "adv"}


def glosses():
    for name, label in POS.items():
        path = os.path.join(SRC, "data." + name)
        with open(path, encoding="latin-1") as f:
            for line in f:
                if line.startswith("  ") or "| " not in line:
                    continue
                gloss = line.split("| ", 1)[1].strip()
                gloss = gloss.split("; \"")[0]  # drop example sentences: keep the definition
                if len(gloss) > 3:
                    yield gloss, label


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    train, evals = [], []
    for text, label in glosses():
        (evals if zlib.crc32(text.encode()) % 10 == 0 else train).append((text, label))
    for name, rows in (("pos_train.jsonl", train), ("pos_eval.jsonl", evals)):
        with open(os.path.join(out, name), "w") as f:
            for text, label in rows:
                f.write(json.dumps({"text": text, "label": label}) + "\n")
    for name, rows in (("glosses_train.txt", train), ("glosses_eval.txt", evals)):
        with open(os.path.join(out, name), "w") as f:
            for text, _ in rows:
                f.write(text + "\n")
    words = collections.Counter()
    chars = set()
    for text, _ in train:
        for w in re.findall(r"\w+|[^\w\s]", text.lower()):
            words[w] += 1
            chars.update(w)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab += sorted(chars) + ["##" + c for c in sorted(chars)]
    suffixes = collections.Counter()
    for w, n in words.items():
        for k in (2, 3, 4):
            if len(w) > k + 2:
                suffixes["##" + w[-k:]] += n
    seen = set(vocab)
    for w, _ in words.most_common(7000) + suffixes.most_common(1000):
        if w not in seen:
            vocab.append(w)
            seen.add(w)
    vocab = vocab[:8192]
    vocab += [f"[unused{i}]" for i in range(8192 - len(vocab))]  # a fixed size for the configs
    with open(os.path.join(out, "vocab.txt"), "w") as f:
        f.write("\n".join(vocab) + "\n")
    print(f"{len(train)} train / {len(evals)} eval glosses, vocabulary of {len(vocab)} in {out}")


if __name__ == "__main__":
    main()
