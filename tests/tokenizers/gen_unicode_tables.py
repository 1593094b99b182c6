#!/usr/bin/env python3
"""Generates src/tokenizers/unicode_tables.inc — the Unicode tables the tokenizers need — so the C++ build
needs neither Python, ICU nor Hugging Face tokenizers. Run from the repository root with the build's
venv (it has Hugging Face `tokenizers`):
    build/venv/bin/python tests/tokenizers/gen_unicode_tables.py > src/tokenizers/unicode_tables.inc
Tables:
  kCharClassRuns  every code point's class (letter, number, punctuation, nonspacing mark, ...), as
                  runs, from Python's unicodedata: byte-level BPE's \\p{L} / \\p{N} (these agree with
                  the regex engine Hugging Face's ByteLevel pre-tokenizer uses)
  kBertClassRuns  what Hugging Face tokenizers' BertNormalizer / BertPreTokenizer make of each code
                  point, read from the library itself: dropped by clean_text (control), split off
                  as punctuation, or dropped by strip_accents (nonspacing mark). Its tables are
                  Unicode 8's (the unicode_categories crate): code points assigned later are ordinary
                  characters to it, as are unassigned ones, so Python's categories differ there
  kLowerRanges    BertNormalizer's lower case (Rust's char::to_lowercase), one code point to one, as
                  (first, last, delta, stride) ranges
  kStripAccents   BertNormalizer's accent stripping (NFD, then nonspacing marks dropped) of every code
                  point it changes to one or more others (Hangul syllables by formula in the code)
  kOnigLetter, kOnigNumber
                  the code points the regex engine of Hugging Face tokenizers (Oniguruma) matches with
                  \p{L} and \p{N}, as ranges, read from the library itself: tokenizer.json patterns use
                  these classes, and its Unicode tables are newer than Debian 12's ICU (Unicode 15.0),
                  so onyx's regexes take these sets instead (tokenizers/hf_pipeline.cc)
"""
import sys
import unicodedata as ud

try:
    from tokenizers import normalizers, pre_tokenizers
except ImportError as e:
    sys.exit(f"gen_unicode_tables.py needs Hugging Face tokenizers ({e}); run it with build/venv/bin/python")

CLASSES = ["Other", "Letter", "Mark_Nonspacing", "Mark_Other", "Number", "Punctuation", "Symbol",
           "Space_Separator", "Line_Separator", "Control"]
BERT_CLASSES = ["Other", "Control", "Punctuation", "Nonspacing"]
WHITE_SPACE = {*range(0x9, 0xE), 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028, 0x2029,
               0x202F, 0x205F, 0x3000}  # as unicode::is_white_space


def char_class(cp):
    cat = ud.category(chr(cp))
    if cat == "Mn":
        return "Mark_Nonspacing"
    if cat == "Zs":
        return "Space_Separator"
    return {"L": "Letter", "M": "Mark_Other", "N": "Number", "P": "Punctuation", "S": "Symbol",
            "Z": "Line_Separator", "C": "Control"}[cat[0]]


def bert(**kw):
    args = dict(clean_text=False, handle_chinese_chars=False, strip_accents=False, lowercase=False)
    args.update(kw)
    return normalizers.BertNormalizer(**args)


def hf_bert_tables():
    """Per code point: BERT class, lower case and stripped form, as HF tokenizers computes them."""
    clean, strip, lower = bert(clean_text=True), bert(strip_accents=True), bert(lowercase=True)
    pre = pre_tokenizers.BertPreTokenizer()
    classes, lows, strips = [], [], []
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF:  # not in any UTF-8 text (decoded as U+FFFD)
            classes.append("Control")
            continue
        ch = chr(cp)
        cleaned, pieces = clean.normalize_str(ch), pre.pre_tokenize_str("x" + ch + "x")
        stripped, lowered = strip.normalize_str(ch), lower.normalize_str(ch)
        # white space (split on; clean_text makes it " " unless it is a control such as U+000B) is
        # unicode::is_white_space
        assert (len(pieces) == 2) == (cp in WHITE_SPACE), hex(cp)
        assert cleaned in ("", ch) or (cleaned == " " and cp in WHITE_SPACE), hex(cp)
        k = []
        if cleaned == "":
            k.append("Control")
        if len(pieces) == 3:
            k.append("Punctuation")
        if stripped == "":
            k.append("Nonspacing")
        assert len(k) <= 1, (hex(cp), k)
        classes.append(k[0] if k else "Other")
        if lowered != ch:
            assert len(lowered) == 1 or cp == 0x130, hex(cp)
            if len(lowered) == 1:
                lows.append((cp, ord(lowered) - cp))
        if stripped and stripped != ch:
            s = [ord(x) for x in stripped]
            if 0xAC00 <= cp <= 0xD7A3:
                v = cp - 0xAC00
                assert s == [0x1100 + v // 588, 0x1161 + v % 588 // 28] + ([0x11A7 + v % 28] if v % 28 else []), hex(cp)
                continue
            assert len(s) <= 3, (hex(cp), s)
            strips.append((cp, *(s + [0] * (3 - len(s)))))
    return classes, lows, strips


def write_runs(out, name, classes, names):
    runs, prev = [], None
    for cp, k in enumerate(classes):
        if k != prev:
            runs.append((cp, names.index(k)))
            prev = k
    out.write(f"static const uint32_t {name}[{len(runs)}] = {{\n")
    for i in range(0, len(runs), 8):
        out.write("    " + " ".join(f"0x{(cp << 4) | k:07x}," for cp, k in runs[i:i + 8]) + "\n")
    out.write("};\n\n")


def onig_ranges(prop):
    """[first, last] ranges of the code points tokenizers' Split(Regex(\\p{prop})) matches."""
    from tokenizers import Regex
    split = pre_tokenizers.Split(Regex(r"\p{%s}" % prop), behavior="removed", invert=True)
    cps = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    ranges = []
    for i in range(0, len(cps), 8192):
        chunk = cps[i:i + 8192]
        for _, (b, e) in split.pre_tokenize_str("".join(map(chr, chunk))):
            for cp in chunk[b:e]:
                if ranges and ranges[-1][1] == cp - 1:
                    ranges[-1][1] = cp
                else:
                    ranges.append([cp, cp])
    return ranges


def write_ranges(out, name, ranges):
    out.write(f"static const uint32_t {name}[{len(ranges)}][2] = {{\n")
    for i in range(0, len(ranges), 6):
        out.write("    " + " ".join(f"{{0x{f:x}, 0x{l:x}}}," for f, l in ranges[i:i + 6]) + "\n")
    out.write("};\n")


def main():
    import tokenizers
    out = sys.stdout
    bert_classes, lows, strips = hf_bert_tables()
    out.write("// unicode_tables.inc — GENERATED by tests/tokenizers/gen_unicode_tables.py from Python's unicodedata\n")
    out.write(f"// (Unicode {ud.unidata_version}) and Hugging Face tokenizers {tokenizers.__version__}'s BertNormalizer and\n")
    out.write("// BertPreTokenizer and regex classes. Do not edit by hand; included by tokenizers/text.cc only.\n\n")

    out.write("// (first_code_point << 4) | CharClass; a run lasts until the next run's first code point.\n")
    write_runs(out, "kCharClassRuns", [char_class(cp) for cp in range(0x110000)], CLASSES)
    out.write("// (first_code_point << 4) | BertClass (HF tokenizers' BERT classes: Other, Control, Punctuation,\n")
    out.write("// Nonspacing); a run lasts until the next run's first code point.\n")
    write_runs(out, "kBertClassRuns", bert_classes, BERT_CLASSES)

    ranges = []  # first, last, delta, stride
    for cp, d in lows:
        if ranges:
            f, l, dd, s = ranges[-1]
            if dd == d and (f == l and cp - l in (1, 2) or cp - l == s):
                ranges[-1] = (f, cp, d, cp - l if f == l else s)
                continue
        ranges.append((cp, cp, d, 1))
    out.write("// {first, last, delta, stride}: lower(c) = c + delta for c = first, first+stride, ..., last.\n")
    out.write("// U+0130 (lower-cases to two code points) is handled in the code.\n")
    out.write(f"static const LowerRange kLowerRanges[{len(ranges)}] = {{\n")
    for i in range(0, len(ranges), 4):
        out.write("    " + " ".join(f"{{0x{f:x}, 0x{l:x}, {d}, {s}}}," for f, l, d, s in ranges[i:i + 4]) + "\n")
    out.write("};\n\n")

    out.write("// {code point, c1, c2, c3}: its NFD without nonspacing marks (0 = none), for every code point\n")
    out.write("// that this changes to other code points (nonspacing marks themselves are dropped by class;\n")
    out.write("// Hangul syllables by formula).\n")
    out.write(f"static const StripEntry kStripAccents[{len(strips)}] = {{\n")
    for i in range(0, len(strips), 4):
        out.write("    " + " ".join("{0x%x, 0x%x, 0x%x, 0x%x}," % e for e in strips[i:i + 4]) + "\n")
    out.write("};\n\n")

    out.write("// {first, last}: the code points tokenizers' regex engine (Oniguruma) matches with \\p{L} and \\p{N}.\n")
    write_ranges(out, "kOnigLetter", onig_ranges("L"))
    write_ranges(out, "kOnigNumber", onig_ranges("N"))


if __name__ == "__main__":
    main()
