"""test_untrusted_tokenizers.py — tokenizer.json files as a stranger's folder holds them (issue
34): ~190 mutations of four real-format bases (GPT-2's byte-level BPE, a Llama-2 / SentencePiece-style
BPE, a Llama-3-style BPE and all-MiniLM's WordPiece, the files tests/tokenizers/make_tokenizer_references.py
makes) loaded by Hugging Face `tokenizers` (Tokenizer.from_str, then encode) and by onyx
(`onyx chat-template DIR --sft ROWS`: load_tokenizer, then encoding a row).

For every case onyx ends within 30 s under a 4 GiB address-space limit with exit 0 or 1, never a
signal, and:
  - where `tokenizers` refuses the file, onyx exits 1 with "onyx: error:" naming the file;
  - where `tokenizers` loads and encodes it, onyx exits 0, except for the refusals listed in
    ONYX_REFUSES (what onyx does not implement, and ids far past the vocabulary that onyx's id
    tables bound), each of which must exit 1 with its message;
  - added tokens get the ids `tokenizers` gives them (its AddedVocabulary renumbers an entry whose
    id disagrees), checked on a row containing the token.
Before this, onyx accepted ~50 of the files tokenizers refuses (wrong-typed fields read as defaults,
pad_id 1e12 truncated, added tokens without their flags), kept the file's ids for added tokens,
and allocated 3-64 GB for an id of 1e8 or 2^31 - 1.

Run: ONYX=build/onyx build/venv/bin/python tests/cli/test_untrusted_tokenizers.py [BUILD_DIR]
(BUILD_DIR, default build, holds the bases scripts/test.sh makes first). Prints one line per case
and ends with "N passed, M failed".
"""
import copy
import json
import os
import re
import resource
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
ONYX = os.environ.get("ONYX", os.path.join(REPO, "build", "onyx"))
BUILD = sys.argv[1] if len(sys.argv) > 1 else os.path.join(REPO, "build")
BASE_FILES = {
    "gpt2": "bpe-reference/tokenizer.json",
    "llama": "llama-family-reference/sentencepiece/tokenizer.json",
    "llama3": "llama-family-reference/llama3/tokenizer.json",
    "qwen2": "llama-family-reference/qwen2/tokenizer.json",
    "bert": "wordpiece-reference/tokenizer.json",
}
TEXT = "Hello world, café ☃ <tool> x <s> [CLS] naïve 123 <new>"

# What onyx refuses although tokenizers loads it: a message pattern per case label.
TABLE = r"far past the vocabulary's \d+ entries|out of range|ids must be 0\.\.\d+ \(one per entry\)"
ONYX_REFUSES = {
    "llama: vocab id 2147483647": TABLE, "gpt2: vocab id 2147483647": TABLE,
    "bert: vocab id 2147483647": TABLE, "llama: vocab id 3000000000 (u32, >= 2^31)": TABLE,
    "llama: vocab id 100000000": TABLE, "bert: vocab id 100000000": TABLE,
    "bert: vocab id 200000000": TABLE, "bert: vocab duplicate id": TABLE,
    "bert: vocab ids with a gap": TABLE,
    # tokenizers fails only when it meets an unknown character; onyx when it loads
    "llama: unk_token not in vocab": r"model.unk_token '<nope>' is not in model.vocab",
    "gpt2: unk_token not in vocab": r"model.unk_token '<nope>' is not in model.vocab",
    "llama: normalizer no type": r"normalizer: has no \"type\"",
    "llama: normalizer Replace String \"\"": r"the String pattern is empty",
    "bert: WP normalizer NFC": r"normalizer type 'NFC' is not supported with WordPiece",
    "gpt2: pre_tokenizer Whitespace": r"pre_tokenizer type 'Whitespace' is not supported",
    "bert: WP pre_tokenizer Whitespace": r"pre_tokenizer type 'Whitespace' is not supported",
    "gpt2: decoder WordPiece (on BPE)": r"decoder type 'WordPiece' is not supported",
    # tokenizers panics when it applies that template (encode with special tokens); onyx refuses
    # the file when it loads it
    "llama: Template special not in special_tokens": r"names special token '<x>' without ids",
}


def limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


# ---- mutations ----
def at(j, path):
    for k in path:
        j = j[k]
    return j


def setp(path, value):
    def f(j):
        at(j, path[:-1])[path[-1]] = value
    return f


def delp(path):
    def f(j):
        del at(j, path[:-1])[path[-1]]
    return f


def add_vocab(tok, id_):
    def f(j):
        j["model"]["vocab"][tok] = id_
    return f


def add_added(entry):
    def f(j):
        base = {"id": len(j["model"]["vocab"]) + 1, "content": "<new>", "single_word": False, "lstrip": False, "rstrip": False,
                "normalized": False, "special": True}
        base.update(entry)
        for k in [k for k, v in entry.items() if v is DEL]:
            del base[k]
        j["added_tokens"].append(base)
    return f


DEL = object()


def seq(*fs):
    def f(j):
        for g in fs:
            g(j)
    return f


def gap(j):  # ids with a gap: move the highest-id vocab token up by 10
    v = j["model"]["vocab"]
    k = max(v, key=v.get)
    v[k] = v[k] + 10


def dup_id(j):  # a second token with the id of an existing one
    j["model"]["vocab"]["zzqqzz"] = 5


def merge_missing(j):
    j["model"]["merges"].append(["zzz_not", "in_vocab"])


def added(j, content):
    return next(a for a in j["added_tokens"] if a["content"] == content)


def dup_added_content(j):
    j["added_tokens"].append(dict(added(j, "<s>"), id=len(j["model"]["vocab"]) + 1))


def dup_added_id(j):
    j["added_tokens"].append(dict(added(j, "<s>"), content="<other>"))


tp = ["post_processor"]
CASES = [
    # --- vocab ids ---
    ("vocab id 2147483647", "llama", add_vocab("zzbig", 2147483647)),
    ("vocab id 2147483647", "gpt2", add_vocab("zzbig", 2147483647)),
    ("vocab id 2147483647", "bert", add_vocab("zzbig", 2147483647)),
    ("vocab id 3000000000 (u32, >= 2^31)", "llama", add_vocab("zzbig", 3000000000)),
    ("vocab id 4294967296 (> u32)", "llama", add_vocab("zzbig", 4294967296)),
    ("vocab id 100000000", "llama", add_vocab("zzbig", 100000000)),
    ("vocab id 100000000", "bert", add_vocab("zzbig", 100000000)),
    ("vocab id 200000000", "bert", add_vocab("zzbig", 200000000)),
    ("vocab id -1", "llama", add_vocab("zzbig", -1)),
    ("vocab id -1", "bert", add_vocab("zzbig", -1)),
    ("vocab id 1.5", "llama", add_vocab("zzbig", 1.5)),
    ("vocab id 1.5", "bert", add_vocab("zzbig", 1.5)),
    ("vocab id 1000.0 (float, integral)", "llama", add_vocab("zzbig", 1000.0)),
    ("vocab id \"7\"", "llama", add_vocab("zzbig", "7")),
    ("vocab id \"7\"", "bert", add_vocab("zzbig", "7")),
    ("vocab duplicate id", "llama", dup_id),
    ("vocab duplicate id", "gpt2", dup_id),
    ("vocab duplicate id", "bert", dup_id),
    ("vocab ids with a gap", "llama", gap),
    ("vocab ids with a gap", "bert", gap),
    ("vocab not an object (list)", "llama", setp(["model", "vocab"], [["a", 0.0]])),
    ("vocab empty {}", "llama", seq(setp(["model", "vocab"], {}), setp(["model", "merges"], []))),
    # --- added_tokens ---
    ("added id 2147483647", "llama", add_added({"id": 2147483647})),
    ("added id 2147483647", "bert", add_added({"id": 2147483647})),
    ("added id 100000000", "llama", add_added({"id": 100000000})),
    ("added id 4294967296", "llama", add_added({"id": 4294967296})),
    ("added id -1", "llama", add_added({"id": -1})),
    ("added id -1", "bert", add_added({"id": -1})),
    ("added missing content", "llama", add_added({"content": DEL})),
    ("added content 5", "llama", add_added({"content": 5})),
    ("added content \"\"", "llama", add_added({"content": ""})),
    ("added id \"1001\"", "llama", add_added({"id": "1001"})),
    ("added id 1001.5", "llama", add_added({"id": 1001.5})),
    ("added missing id", "llama", add_added({"id": DEL})),
    ("added special \"yes\"", "llama", add_added({"special": "yes"})),
    ("added special 1", "llama", add_added({"special": 1})),
    ("added lstrip \"yes\"", "llama", add_added({"lstrip": "yes"})),
    ("added normalized null", "llama", add_added({"normalized": None})),
    ("added missing special/lstrip/...", "llama", add_added({"special": DEL, "lstrip": DEL, "rstrip": DEL,
                                                               "single_word": DEL, "normalized": DEL})),
    ("added duplicate content", "llama", dup_added_content),
    ("added duplicate id", "llama", dup_added_id),
    ("added_tokens an object", "llama", setp(["added_tokens"], {"a": 1})),
    ("added_tokens a string", "llama", setp(["added_tokens"], "x")),
    ("added entry a string", "llama", lambda j: j["added_tokens"].append("<x>")),
    ("added_tokens missing", "llama", delp(["added_tokens"])),
    # --- model ---
    ("model.type Foo", "llama", setp(["model", "type"], "Foo")),
    ("model.type Unigram", "llama", setp(["model", "type"], "Unigram")),
    ("model.type missing (BPE)", "llama", delp(["model", "type"])),
    ("model.type 5", "llama", setp(["model", "type"], 5)),
    ("merges item \"a\" (no space)", "llama", lambda j: j["model"]["merges"].insert(0, "▁a")),
    ("merges item \"a b c\"", "llama", lambda j: j["model"]["merges"].insert(0, "▁ a t")),
    ("merges item [a,b,c]", "llama", lambda j: j["model"]["merges"].insert(0, ["▁", "a", "t"])),
    ("merges item [1,2]", "llama", lambda j: j["model"]["merges"].insert(0, [1, 2])),
    ("merges item 5", "llama", lambda j: j["model"]["merges"].insert(0, 5)),
    ("merges not a list", "llama", setp(["model", "merges"], "▁ a")),
    ("merges missing", "llama", delp(["model", "merges"])),
    ("merges token not in vocab", "llama", merge_missing),
    ("merges result not in vocab", "llama", lambda j: j["model"]["merges"].append(["x", "q"])),
    ("merges duplicate pair", "llama", lambda j: j["model"]["merges"].append(list(j["model"]["merges"][0]))),
    ("unk_token not in vocab", "llama", setp(["model", "unk_token"], "<nope>")),
    ("unk_token not in vocab", "gpt2", setp(["model", "unk_token"], "<nope>")),
    ("unk_token 5", "llama", setp(["model", "unk_token"], 5)),
    ("unk_token \"\"", "llama", setp(["model", "unk_token"], "")),
    ("byte_fallback \"yes\"", "llama", setp(["model", "byte_fallback"], "yes")),
    ("byte_fallback 1", "llama", setp(["model", "byte_fallback"], 1)),
    ("byte_fallback null", "llama", setp(["model", "byte_fallback"], None)),
    ("fuse_unk \"yes\"", "llama", setp(["model", "fuse_unk"], "yes")),
    ("ignore_merges 1", "llama3", setp(["model", "ignore_merges"], 1)),
    ("dropout 5.0", "llama", setp(["model", "dropout"], 5.0)),
    ("dropout -0.5", "llama", setp(["model", "dropout"], -0.5)),
    ("dropout 0.0", "llama", setp(["model", "dropout"], 0.0)),
    ("dropout \"x\"", "llama", setp(["model", "dropout"], "x")),
    ("continuing_subword_prefix 5", "llama", setp(["model", "continuing_subword_prefix"], 5)),
    ("end_of_word_suffix \"\"", "llama", setp(["model", "end_of_word_suffix"], "")),
    ("WP unk_token not in vocab", "bert", setp(["model", "unk_token"], "<nope>")),
    ("WP unk_token 5", "bert", setp(["model", "unk_token"], 5)),
    ("WP continuing_subword_prefix 5", "bert", setp(["model", "continuing_subword_prefix"], 5)),
    ("WP max_input_chars_per_word -1", "bert", setp(["model", "max_input_chars_per_word"], -1)),
    ("WP max_input_chars_per_word \"x\"", "bert", setp(["model", "max_input_chars_per_word"], "x")),
    ("WP max_input_chars_per_word 0", "bert", setp(["model", "max_input_chars_per_word"], 0)),
    # --- normalizer ---
    ("normalizer type Foo", "llama", setp(["normalizer"], {"type": "Foo"})),
    ("normalizer no type", "llama", setp(["normalizer"], {"prepend": "x"})),
    ("normalizer Sequence normalizers obj", "llama", setp(["normalizer", "normalizers"], {"a": {"type": "NFC"}})),
    ("normalizer Prepend prepend 5", "llama", setp(["normalizer", "normalizers", 0, "prepend"], 5)),
    ("normalizer Replace pattern 5", "llama", setp(["normalizer", "normalizers", 1, "pattern"], 5)),
    ("normalizer Replace content 5", "llama", setp(["normalizer", "normalizers", 1, "content"], 5)),
    ("normalizer Replace String \"\"", "llama", setp(["normalizer", "normalizers", 1, "pattern"], {"String": ""})),
    ("normalizer Replace bad Regex", "llama", setp(["normalizer", "normalizers", 1, "pattern"], {"Regex": "("})),
    ("normalizer Replace both String+Regex", "llama", setp(["normalizer", "normalizers", 1, "pattern"], {"String": " ", "Regex": " "})),
    ("normalizer Lowercase", "llama", setp(["normalizer"], {"type": "Lowercase"})),
    ("normalizer NFC with junk field", "qwen2", setp(["normalizer", "junk"], 5)),
    ("WP BertNormalizer lowercase \"yes\"", "bert", setp(["normalizer", "lowercase"], "yes")),
    ("WP BertNormalizer strip_accents \"yes\"", "bert", setp(["normalizer", "strip_accents"], "yes")),
    ("WP BertNormalizer clean_text null", "bert", setp(["normalizer", "clean_text"], None)),
    ("WP normalizer NFC", "bert", setp(["normalizer"], {"type": "NFC"})),
    # --- pre_tokenizer ---
    ("ByteLevel add_prefix_space \"yes\"", "gpt2", setp(["pre_tokenizer", "add_prefix_space"], "yes")),
    ("ByteLevel use_regex 1", "gpt2", setp(["pre_tokenizer", "use_regex"], 1)),
    ("ByteLevel trim_offsets \"yes\"", "gpt2", setp(["pre_tokenizer", "trim_offsets"], "yes")),
    ("pre_tokenizer type Foo", "gpt2", setp(["pre_tokenizer"], {"type": "Foo"})),
    ("pre_tokenizer Whitespace", "gpt2", setp(["pre_tokenizer"], {"type": "Whitespace"})),
    ("pre Sequence pretokenizers obj", "llama3", setp(["pre_tokenizer", "pretokenizers"], {"type": "ByteLevel"})),
    ("Split pattern 5", "llama3", setp(["pre_tokenizer", "pretokenizers", 0, "pattern"], 5)),
    ("Split pattern bad Regex", "llama3", setp(["pre_tokenizer", "pretokenizers", 0, "pattern"], {"Regex": "(?<x"})),
    ("Split behavior Removed", "llama3", setp(["pre_tokenizer", "pretokenizers", 0, "behavior"], "Removed")),
    ("Split behavior Foo", "llama3", setp(["pre_tokenizer", "pretokenizers", 0, "behavior"], "Foo")),
    ("Split invert \"yes\"", "llama3", setp(["pre_tokenizer", "pretokenizers", 0, "invert"], "yes")),
    ("Split invert missing", "llama3", delp(["pre_tokenizer", "pretokenizers", 0, "invert"])),
    ("Metaspace replacement \"ab\"", "llama", setp(["pre_tokenizer"], {"type": "Metaspace", "replacement": "ab", "prepend_scheme": "first", "split": True})),
    ("Metaspace prepend_scheme Foo", "llama", setp(["pre_tokenizer"], {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "Foo", "split": True})),
    ("Metaspace split \"yes\"", "llama", setp(["pre_tokenizer"], {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": "yes"})),
    ("Metaspace no replacement", "llama", setp(["pre_tokenizer"], {"type": "Metaspace", "prepend_scheme": "first", "split": True})),
    ("WP pre_tokenizer Whitespace", "bert", setp(["pre_tokenizer"], {"type": "Whitespace"})),
    ("WP BertPreTokenizer junk field", "bert", setp(["pre_tokenizer", "junk"], 1)),
    # --- decoder ---
    ("decoder type Foo", "llama", setp(["decoder"], {"type": "Foo"})),
    ("decoder Sequence decoders obj", "llama", setp(["decoder", "decoders"], {"type": "Fuse"})),
    ("decoder Strip start -1", "llama", setp(["decoder", "decoders", 3, "start"], -1)),
    ("decoder Strip start \"1\"", "llama", setp(["decoder", "decoders", 3, "start"], "1")),
    ("decoder Strip content \"ab\"", "llama", setp(["decoder", "decoders", 3, "content"], "ab")),
    ("decoder Strip start 1e12", "llama", setp(["decoder", "decoders", 3, "start"], 10**12)),
    ("decoder Replace content 5", "llama", setp(["decoder", "decoders", 0, "content"], 5)),
    ("decoder Metaspace prepend_scheme Foo", "llama", setp(["decoder"], {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "Foo", "split": True})),
    ("decoder ByteLevel add_prefix_space \"yes\"", "gpt2", setp(["decoder", "add_prefix_space"], "yes")),
    ("decoder WordPiece (on BPE)", "gpt2", setp(["decoder"], {"type": "WordPiece", "prefix": "##", "cleanup": True})),
    ("WP decoder type Foo", "bert", setp(["decoder"], {"type": "Foo"})),
    ("WP decoder WordPiece cleanup \"yes\"", "bert", setp(["decoder", "cleanup"], "yes")),
    # --- post_processor ---
    ("post type Foo", "llama", setp(tp, {"type": "Foo"})),
    ("Template special not in special_tokens", "llama", setp(tp + ["single", 0, "SpecialToken", "id"], "<x>")),
    ("Template special_tokens id 999999", "llama", setp(tp + ["special_tokens", "<s>", "ids"], [999999])),
    ("Template special_tokens id 2147483647", "llama", setp(tp + ["special_tokens", "<s>", "ids"], [2147483647])),
    ("Template special_tokens id -1", "llama", setp(tp + ["special_tokens", "<s>", "ids"], [-1])),
    ("Template special_tokens id 1.5", "llama", setp(tp + ["special_tokens", "<s>", "ids"], [1.5])),
    ("Template special_tokens id \"1\"", "llama", setp(tp + ["special_tokens", "<s>", "ids"], ["1"])),
    ("Template special_tokens ids/tokens len differ", "llama", setp(tp + ["special_tokens", "<s>", "ids"], [1, 2])),
    ("Template special_tokens ids missing", "llama", delp(tp + ["special_tokens", "<s>", "ids"])),
    ("Template special_tokens key != id", "llama", setp(tp + ["special_tokens", "<s>", "id"], "<t>")),
    ("Template special_tokens a list", "llama", setp(tp + ["special_tokens"], [["<s>", 1]])),
    ("Template single a string", "llama", setp(tp + ["single"], "<s> $A")),
    ("Template pair missing", "llama", delp(tp + ["pair"])),
    ("Template Sequence id C", "llama", setp(tp + ["single", 1, "Sequence", "id"], "C")),
    ("Template Sequence type_id -1", "llama", setp(tp + ["single", 1, "Sequence", "type_id"], -1)),
    ("Template Sequence type_id \"x\"", "llama", setp(tp + ["single", 1, "Sequence", "type_id"], "x")),
    ("Template SpecialToken id 5", "llama", setp(tp + ["single", 0, "SpecialToken", "id"], 5)),
    ("Template item neither", "llama", setp(tp + ["single", 0], {"Foo": {}})),
    ("Template single without $A", "llama", setp(tp + ["single"], [{"SpecialToken": {"id": "<s>", "type_id": 0}}])),
    ("Template pair without $B", "llama", setp(tp + ["pair"], [{"Sequence": {"id": "A", "type_id": 0}}])),
    ("Template single has $B", "llama", setp(tp + ["single", 1, "Sequence", "id"], "B")),
    ("post Sequence processors obj", "llama3", setp(tp + ["processors"], {"a": {"type": "ByteLevel"}})),
    ("post Sequence processors missing", "llama3", delp(tp + ["processors"])),
    ("post ByteLevel trim_offsets \"yes\"", "gpt2", setp(tp + ["trim_offsets"], "yes")),
    ("post ByteLevel add_prefix_space 5", "gpt2", setp(tp + ["add_prefix_space"], 5)),
    ("BertProcessing cls [\"[CLS]\", -1]", "bert", setp(tp, {"type": "BertProcessing", "cls": ["[CLS]", -1], "sep": ["[SEP]", 102]})),
    ("BertProcessing cls id 1e9", "bert", setp(tp, {"type": "BertProcessing", "cls": ["[CLS]", 10**9], "sep": ["[SEP]", 102]})),
    ("BertProcessing cls [5, 101]", "bert", setp(tp, {"type": "BertProcessing", "cls": [5, 101], "sep": ["[SEP]", 102]})),
    ("BertProcessing sep missing", "bert", setp(tp, {"type": "BertProcessing", "cls": ["[CLS]", 101]})),
    ("RobertaProcessing trim_offsets \"yes\"", "bert", setp(tp, {"type": "RobertaProcessing", "cls": ["[CLS]", 101], "sep": ["[SEP]", 102], "trim_offsets": "yes", "add_prefix_space": True})),
    # --- padding / truncation ---
    ("padding pad_id 1e12", "llama", setp(["padding"], {"strategy": "BatchLongest", "direction": "Right", "pad_to_multiple_of": None, "pad_id": 1e12, "pad_type_id": 0, "pad_token": "<unk>"})),
    ("padding pad_id 10**12 (int)", "llama", setp(["padding"], {"strategy": "BatchLongest", "direction": "Right", "pad_to_multiple_of": None, "pad_id": 10**12, "pad_type_id": 0, "pad_token": "<unk>"})),
    ("padding pad_id -1", "llama", setp(["padding"], {"strategy": "BatchLongest", "direction": "Right", "pad_to_multiple_of": None, "pad_id": -1, "pad_type_id": 0, "pad_token": "<unk>"})),
    ("padding pad_id \"0\"", "llama", setp(["padding"], {"strategy": "BatchLongest", "direction": "Right", "pad_to_multiple_of": None, "pad_id": "0", "pad_type_id": 0, "pad_token": "<unk>"})),
    ("padding pad_id null", "llama", setp(["padding"], {"strategy": "BatchLongest", "direction": "Right", "pad_to_multiple_of": None, "pad_id": None, "pad_type_id": 0, "pad_token": "<unk>"})),
    ("padding {pad_id: 0} only", "llama", setp(["padding"], {"pad_id": 0})),
    ("padding a string", "llama", setp(["padding"], "yes")),
    ("WP padding pad_id 1e12", "bert", setp(["padding", "pad_id"], 1e12)),
    ("WP padding pad_id -1", "bert", setp(["padding", "pad_id"], -1)),
    ("WP padding pad_id \"0\"", "bert", setp(["padding", "pad_id"], "0")),
    ("truncation max_length -5", "bert", setp(["truncation", "max_length"], -5)),
    ("truncation max_length \"x\"", "bert", setp(["truncation", "max_length"], "x")),
    ("truncation stride > max_length", "bert", setp(["truncation", "stride"], 500)),
    ("truncation strategy Foo", "bert", setp(["truncation", "strategy"], "Foo")),
    ("truncation a string", "llama", setp(["truncation"], "yes")),
    # --- top level ---
    ("top-level version \"9.9\"", "llama", setp(["version"], "9.9")),
    ("top-level version missing", "llama", delp(["version"])),
    ("top-level unknown key", "llama", setp(["junk"], 1)),
    ("top-level a list", "llama", lambda j: None),  # special-cased below
    ("model missing", "llama", delp(["model"])),
    ("baseline", "llama", lambda j: None),
    ("baseline", "gpt2", lambda j: None),
    ("baseline", "llama3", lambda j: None),
    ("baseline", "bert", lambda j: None),
]


def hf_ids(j, text):
    """("ok", ids of encode(text), tokenizer) / ("load" | "encode", error)."""
    from tokenizers import Tokenizer
    try:
        t = Tokenizer.from_str(json.dumps(j))
    except BaseException as e:  # noqa: BLE001 — a PanicException is a BaseException
        return "load", "%s: %s" % (type(e).__name__, e)
    try:
        return "ok", t.encode(text).ids, t  # the post-processor applied, as SFT rows are
    except BaseException as e:  # noqa: BLE001
        return "encode", "%s: %s" % (type(e).__name__, e)


def onyx_rows(folder, rows_path):
    try:
        p = subprocess.run([ONYX, "chat-template", folder, "--sft", rows_path], capture_output=True,
                           text=True, timeout=30, preexec_fn=limit_memory)
    except subprocess.TimeoutExpired:
        return None, "", "timed out after 30 s"
    return p.returncode, p.stdout, p.stderr


def check(label, j, tmp):
    folder = os.path.join(tmp, "case")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "tokenizer.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False)
    rows = os.path.join(tmp, "rows.jsonl")
    with open(rows, "w", encoding="utf-8") as f:
        f.write(json.dumps({"text": TEXT}, ensure_ascii=False) + "\n")
    hf = hf_ids(j, TEXT) if isinstance(j, dict) else ("load", "not an object")
    rc, out, err = onyx_rows(folder, rows)
    if rc is None or rc not in (0, 1):
        return False, "onyx rc=%s: %s" % (rc, err.strip()[-300:])
    if rc == 1 and not (err.startswith("onyx: error: ") and path in err):
        return False, "onyx's error does not name the file: " + err.strip()[-300:]
    if label in ONYX_REFUSES:
        ok = rc == 1 and re.search(ONYX_REFUSES[label], err) is not None
        return ok, "" if ok else "expected onyx's refusal %r; rc %d %s" % (
            ONYX_REFUSES[label], rc, err.strip()[-300:])
    if hf[0] == "load":
        return rc == 1, "" if rc == 1 else "tokenizers refuses (%s); onyx loaded it" % hf[1][:200]
    if hf[0] == "encode":  # tokenizers loads, then fails or panics encoding: either is fine
        return True, ""
    if rc != 0:
        return False, "tokenizers loads and encodes it; onyx: " + err.strip()[-300:]
    ids = json.loads(out.splitlines()[0])["input_ids"]
    tok = hf[2]
    for content in ("<new>", "<tool>"):
        want = tok.token_to_id(content)
        if want is not None and want in hf[1] and any(
                a.get("content") == content for a in j.get("added_tokens") or []
                if isinstance(a, dict)) and want not in ids:
            return False, "added token %s: tokenizers gives id %d, not in onyx's ids %s" % (
                content, want, ids[:40])
    return True, ""


def main():
    bases = {}
    for name, rel in BASE_FILES.items():
        with open(os.path.join(BUILD, rel), encoding="utf-8") as f:
            bases[name] = json.load(f)
    extra = [("added <new> with a far id", "llama", add_added({"id": 5000})),
             ("added <new> with <s>'s id", "llama", add_added({"id": 1})),
             ("added <new> with a vocab token's id", "llama", add_added({"id": 5})),
             ("added <new> with id 2^31 - 1", "bert", add_added({"id": 2147483647})),
             ("added <new> first with a far id, then <tool> moved", "llama3",
              seq(add_added({"id": 9000}), lambda j: j["added_tokens"].append(
                  dict(added(j, "<tool>"), id=1))))]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, base, mut in CASES + extra:
            label = "%s: %s" % (base, name)
            j = copy.deepcopy(bases[base])
            try:
                mut(j)
            except (KeyError, IndexError, StopIteration, TypeError) as e:
                results.append((label, False, "the mutation does not apply to this base: %r" % e))
                continue
            if name == "top-level a list":
                j = [j]
            try:
                ok, detail = check(label, j, tmp)
            except Exception as e:  # noqa: BLE001
                ok, detail = False, "%s: %s" % (type(e).__name__, e)
            results.append((label, ok, detail))
    passed = sum(ok for _, ok, _ in results)
    for label, ok, detail in results:
        print(("ok   " if ok else "FAIL ") + label + ("" if ok else "\n    " + detail))
    print("%d passed, %d failed" % (passed, len(results) - passed))
    return 0 if passed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
