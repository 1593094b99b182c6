#!/usr/bin/env python3
"""Makes the BERT WordPiece reference that tests/data/test_wordpiece_reference.cc checks onyx against:
BERT's original tokenization (google-research/bert tokenization.py: BasicTokenizer + WordpieceTokenizer,
uncased), re-written here over Python's unicodedata, on WordNet glosses (Debian's wordnet-base) and
hand-written lines in many scripts. Usage:
    python3 tests/data/make_wordpiece_reference.py OUT_DIR        (e.g. build/wordpiece-reference)
Writes vocab.txt, tokenizer.json (the same vocabulary with BertNormalizer etc.) and reference.jsonl
({"text": ..., "ids": [...]} per line, no special tokens). The vocabulary is made from the texts: the
3000 most frequent words, every character with and without "##", a few suffixes, less "q" and "z"
(so some words are [UNK]). Texts avoid a capital sigma at a word's end: Python's lower() gives final
sigma there, Hugging Face tokenizers (and onyx) lower-case one character at a time.
"""
import collections
import json
import os
import sys
import unicodedata


def is_whitespace(c):
    return c in " \t\n\r" or unicodedata.category(c) == "Zs"


def is_control(c):
    return c not in "\t\n\r" and unicodedata.category(c).startswith("C")


def is_punctuation(c):
    cp = ord(c)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(c).startswith("P")


def is_cjk(cp):
    return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF or
            0x2A700 <= cp <= 0x2B73F or 0x2B740 <= cp <= 0x2B81F or 0x2B820 <= cp <= 0x2CEAF or
            0xF900 <= cp <= 0xFAFF or 0x2F800 <= cp <= 0x2FA1F)


def basic_tokenize(text):
    text = "".join(" " if is_whitespace(c) else c for c in text
                   if not (ord(c) == 0 or ord(c) == 0xFFFD or is_control(c)))
    text = "".join(" %s " % c if is_cjk(ord(c)) else c for c in text)
    out = []
    for tok in text.strip().split():
        tok = tok.lower()
        tok = "".join(c for c in unicodedata.normalize("NFD", tok) if unicodedata.category(c) != "Mn")
        cur = ""
        for c in tok:
            if is_punctuation(c):
                if cur:
                    out.append(cur)
                    cur = ""
                out.append(c)
            else:
                cur += c
        if cur:
            out.append(cur)
    return " ".join(out).split()


def wordpiece(word, vocab, max_chars=100):
    if len(word) > max_chars:
        return ["[UNK]"]
    out, start = [], 0
    while start < len(word):
        end, cur = len(word), None
        while start < end:
            s = word[start:end] if start == 0 else "##" + word[start:end]
            if s in vocab:
                cur = s
                break
            end -= 1
        if cur is None:
            return ["[UNK]"]
        out.append(cur)
        start = end
    return out


HANDWRITTEN = [
    "Ελληνικά ΆΈΉ Ёлка Йод Ǆ ǅ ǆ Ǳ ΐ ǖ Ṩ ẞ ß ﬁ ㎏ Ω Å",
    "北京大学 東京は日本の首都です。 한국어 안녕하세요 ガギグゲゴ パピプ",
    "naïve façade coöperate Ångström Øresund Œuvre İstanbul ĞÜŞ",
    "ÀÁÂÃÄÅ àáâãäå ÈÉÊË ÌÍÎÏ ÒÓÔÕÖ ÙÚÛÜ Ññ Çç Ýý ÿ Ÿ Ā ā Ă ă Ą ą Ć ć Č č Ď ď Ē ē Ğ ğ Ī ī ı Ł ł Ń ń Ő ő "
    "Ŕ ŕ Ś ś Š š Ţ ţ Ů ů Ű ű Ź ź Ż ż Ž ž",
    "Tiếng Việt có dấu: Hà Nội, Đà Nẵng, Huế",
    "tab\tsep\u00a0nbsp\u2003em\u3000ideo ctrl\x01\x7f fmt\u200bzw line\u2028sep",
    "quotes «x» “y” — – … ¿qué? ¡sí! 'single' \"double\"",
    "math ± × ÷ ∑ ∫ ≤ ≥ ≠ → 😀 © x² ½",
    "I'm sure they'll say it's fine; don't you think? (yes) [no] {maybe} <tag> a/b c\\d e|f ~g `h` ^i",
    "supercalifragilisticexpialidocious " + "a" * 120 + " end",
    "Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "العربية עברית हिन्दी ไทย",
    "",
    "   ",
]


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else "build/wordpiece-reference"
    texts = []
    for pos in ["noun", "verb", "adj", "adv"]:
        path = f"/usr/share/wordnet/data.{pos}"
        if not os.path.exists(path):
            continue
        with open(path, encoding="latin-1") as f:
            glosses = [l.rstrip("\n").split("| ", 1)[1] for l in f if not l.startswith("  ") and "| " in l]
        step = max(1, len(glosses) // 1000)
        texts += glosses[::step]
    texts += HANDWRITTEN
    counts = collections.Counter()
    for t in texts:
        counts.update(basic_tokenize(t))
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    chars = sorted({c for w in counts for c in w})
    vocab += chars + ["##" + c for c in chars]
    seen = set(vocab)
    for w, _ in counts.most_common(3000):
        if w not in seen:
            vocab.append(w)
            seen.add(w)
    vocab += ["##" + s for s in ["ing", "ed", "s", "ly", "tion", "er", "es", "al", "ness", "ment"] if "##" + s not in seen]
    vocab = [v for v in vocab if v not in ("q", "##q", "z", "##z")]
    ids = {v: i for i, v in enumerate(vocab)}

    tmp = out_dir + ".tmp"
    os.makedirs(tmp, exist_ok=True)
    with open(os.path.join(tmp, "vocab.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(vocab) + "\n")
    tokenizer_json = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for i, t in enumerate(vocab[:5])],
        "normalizer": {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True,
                       "strip_accents": None, "lowercase": True},
        "pre_tokenizer": {"type": "BertPreTokenizer"},
        "post_processor": {"type": "BertProcessing", "sep": ["[SEP]", 3], "cls": ["[CLS]", 2]},
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": True},
        "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
                  "max_input_chars_per_word": 100, "vocab": ids},
    }
    with open(os.path.join(tmp, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer_json, f, ensure_ascii=False)
    with open(os.path.join(tmp, "reference.jsonl"), "w", encoding="utf-8") as f:
        for t in texts:
            pieces = [p for w in basic_tokenize(t) for p in wordpiece(w, ids)]
            f.write(json.dumps({"text": t, "ids": [ids[p] for p in pieces]}, ensure_ascii=False) + "\n")
    if os.path.isdir(out_dir):
        for name in os.listdir(out_dir):
            os.remove(os.path.join(out_dir, name))
        os.rmdir(out_dir)
    os.rename(tmp, out_dir)
    print(f"wordpiece reference: {len(vocab)} tokens, {len(texts)} texts -> {out_dir}")


if __name__ == "__main__":
    main()
