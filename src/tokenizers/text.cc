// text.cc — what every tokenizer and text reader shares and that needs no ICU: reading a text file
// whole, the UTF-8 codec, and the Unicode tables of Hugging Face tokenizers' BERT normalizer and
// pre-tokenizer (tokenizers/unicode_tables.inc). Kept apart from the tokenizers themselves so a
// build without them (-DONYX_MINIMAL=ON: no ICU) still has these for chat templates and datasets.
#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "onyx/error.h"
#include "tokenizers/tokenizer.h"

namespace fs = std::filesystem;

namespace onyx::tokenizers {

std::string read_text_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  ONYX_CHECK(f.good(), "cannot open '", path, "'", fs::exists(path) ? "" : ": no such file");
  std::ostringstream ss;
  ss << f.rdbuf();
  ONYX_CHECK(!f.bad(), "error reading '", path, "'");
  return ss.str();
}

namespace unicode {
namespace {

struct LowerRange {
  uint32_t first, last;
  int32_t delta;
  uint32_t stride;
};
struct StripEntry {
  uint32_t cp, a, b, c;
};

// What Hugging Face tokenizers' BertNormalizer and BertPreTokenizer make of a code point (its
// Unicode 8 tables): dropped by clean_text, split off as punctuation, dropped by strip_accents.
enum class BertClass : uint8_t { Other, Control, Punctuation, Nonspacing };

#include "tokenizers/unicode_tables.inc"

template <size_t N>
uint8_t lookup_run(const uint32_t (&runs)[N], char32_t c) {
  const uint32_t key = ((uint32_t)c << 4) | 0xF;
  auto it = std::upper_bound(std::begin(runs), std::end(runs), key);
  return (uint8_t)(*(it - 1) & 0xF);
}

template <size_t N>
bool in_ranges(const uint32_t (&ranges)[N][2], char32_t c) {
  auto it = std::upper_bound(std::begin(ranges), std::end(ranges), (uint32_t)c,
                             [](uint32_t v, const uint32_t(&r)[2]) { return v < r[0]; });
  return it != std::begin(ranges) && c <= (*(it - 1))[1];
}

// The Unicode database's class, with letters and numbers as tokenizers' regex engine has them
// (its tables are newer than Python's: a letter it knows is a letter here too).
CharClass lookup_class(char32_t c) {
  if (in_ranges(kOnigLetter, c)) return CharClass::Letter;
  if (in_ranges(kOnigNumber, c)) return CharClass::Number;
  const auto k = (CharClass)lookup_run(kCharClassRuns, c);
  return k == CharClass::Letter || k == CharClass::Number ? CharClass::Other : k;
}

template <size_t N>
std::string icu_set(const uint32_t (&ranges)[N][2]) {
  std::string s = "[";
  char buf[40];
  for (auto& r : ranges) {
    std::snprintf(buf, sizeof buf, r[0] == r[1] ? "\\x{%x}" : "\\x{%x}-\\x{%x}", r[0], r[1]);
    s += buf;
  }
  return s + "]";
}

const std::array<CharClass, 256>& latin1_classes() {
  static const std::array<CharClass, 256> t = [] {
    std::array<CharClass, 256> a{};
    for (int c = 0; c < 256; ++c) a[c] = lookup_class((char32_t)c);
    return a;
  }();
  return t;
}

BertClass bert_class(char32_t c) {
  static const std::array<BertClass, 256> latin1 = [] {
    std::array<BertClass, 256> a{};
    for (int i = 0; i < 256; ++i) a[i] = (BertClass)lookup_run(kBertClassRuns, (char32_t)i);
    return a;
  }();
  if (c < 256) return latin1[c];
  if (c > 0x10FFFF) return BertClass::Control;
  return (BertClass)lookup_run(kBertClassRuns, c);
}

}  // namespace

CharClass char_class(char32_t c) {
  if (c < 256) return latin1_classes()[c];
  if (c > 0x10FFFF) return CharClass::Control;
  return lookup_class(c);
}

const std::string& regex_class_set(bool letter) {
  static const std::string letters = icu_set(kOnigLetter), numbers = icu_set(kOnigNumber);
  return letter ? letters : numbers;
}

bool is_white_space(char32_t c) {
  return (c >= 0x9 && c <= 0xD) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

bool is_cjk(char32_t c) {
  // Hugging Face tokenizers' ranges: BERT's, except that the last block starts at U+2B920, not
  // U+2B820 (so U+2B820..U+2B91F stay inside words)
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) ||
         (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
         (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

bool is_bert_punctuation(char32_t c) { return bert_class(c) == BertClass::Punctuation; }

bool is_bert_control(char32_t c) { return bert_class(c) == BertClass::Control; }

void append_lower(char32_t c, std::u32string& out) {
  if (c < 128) {
    out.push_back(c >= 'A' && c <= 'Z' ? c + 32 : c);
    return;
  }
  if (c == 0x130) {  // İ -> i + combining dot above
    out.push_back('i');
    out.push_back(0x307);
    return;
  }
  auto it = std::upper_bound(std::begin(kLowerRanges), std::end(kLowerRanges), (uint32_t)c,
                             [](uint32_t v, const LowerRange& r) { return v < r.first; });
  if (it != std::begin(kLowerRanges)) {
    const LowerRange& r = *(it - 1);
    if (c <= r.last && (c - r.first) % r.stride == 0) {
      out.push_back((char32_t)((int32_t)c + r.delta));
      return;
    }
  }
  out.push_back(c);
}

void append_strip_accents(char32_t c, std::u32string& out) {
  if (c < 0xC0) {
    out.push_back(c);
    return;
  }
  if (c >= 0xAC00 && c <= 0xD7A3) {  // Hangul syllable -> L V (T)
    const uint32_t s = c - 0xAC00;
    out.push_back(0x1100 + s / 588);
    out.push_back(0x1161 + (s % 588) / 28);
    if (s % 28) out.push_back(0x11A7 + s % 28);
    return;
  }
  if (bert_class(c) == BertClass::Nonspacing) return;
  auto it = std::lower_bound(std::begin(kStripAccents), std::end(kStripAccents), (uint32_t)c,
                             [](const StripEntry& e, uint32_t v) { return e.cp < v; });
  if (it != std::end(kStripAccents) && it->cp == c) {
    if (it->a) out.push_back(it->a);
    if (it->b) out.push_back(it->b);
    if (it->c) out.push_back(it->c);
    return;
  }
  out.push_back(c);
}

std::u32string decode_utf8(const std::string& s, std::vector<uint8_t>* byte_len) {
  std::u32string out;
  out.reserve(s.size());
  if (byte_len) byte_len->clear();
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char b0 = p[i];
    char32_t c = 0xFFFD;
    int len = 1;
    if (b0 < 0x80) {
      c = b0;
    } else {
      const int need = b0 >= 0xF0 && b0 <= 0xF4   ? 3
                       : b0 >= 0xE0 && b0 <= 0xEF ? 2
                       : b0 >= 0xC2 && b0 <= 0xDF ? 1
                                                  : 0;
      if (need > 0 && i + need < n) {
        char32_t v = b0 & (0x3F >> need);
        bool ok = true;
        for (int k = 1; ok && k <= need; ++k) {
          if ((p[i + k] & 0xC0) != 0x80)
            ok = false;
          else
            v = (v << 6) | (p[i + k] & 0x3F);
        }
        const char32_t min = need == 1 ? 0x80 : need == 2 ? 0x800 : 0x10000;
        if (ok && v >= min && v <= 0x10FFFF && !(v >= 0xD800 && v <= 0xDFFF)) {
          c = v;
          len = need + 1;
        }
      }
    }
    out.push_back(c);
    if (byte_len) byte_len->push_back((uint8_t)len);
    i += len;
  }
  return out;
}

void append_utf8(char32_t c, std::string& out) {
  if (c < 0x80) {
    out.push_back((char)c);
  } else if (c < 0x800) {
    out.push_back((char)(0xC0 | (c >> 6)));
    out.push_back((char)(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back((char)(0xE0 | (c >> 12)));
    out.push_back((char)(0x80 | ((c >> 6) & 0x3F)));
    out.push_back((char)(0x80 | (c & 0x3F)));
  } else {
    out.push_back((char)(0xF0 | (c >> 18)));
    out.push_back((char)(0x80 | ((c >> 12) & 0x3F)));
    out.push_back((char)(0x80 | ((c >> 6) & 0x3F)));
    out.push_back((char)(0x80 | (c & 0x3F)));
  }
}

std::string encode_utf8(const std::u32string& s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) append_utf8(c, out);
  return out;
}

size_t invalid_utf8_at(const std::string& s, size_t from) {
  for (size_t i = from; i < s.size();) {
    const unsigned char c = s[i];
    const int n = c < 0x80                   ? 1
                  : (c >= 0xC2 && c <= 0xDF) ? 2
                  : (c >> 4) == 14           ? 3
                  : (c >= 0xF0 && c <= 0xF4) ? 4
                                             : 0;
    if (n == 0 || i + n > s.size()) return i;
    for (int k = 1; k < n; k++)
      if (((unsigned char)s[i + k] & 0xC0) != 0x80) return i;
    uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1f) : n == 3 ? (c & 0x0f) : (c & 0x07);
    for (int k = 1; k < n; k++) cp = (cp << 6) | ((unsigned char)s[i + k] & 0x3f);
    if ((n == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||
        (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)))
      return i;
    i += n;
  }
  return std::string::npos;
}

}  // namespace unicode
}  // namespace onyx::tokenizers
