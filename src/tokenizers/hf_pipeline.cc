// hf_pipeline.cc — tokenizer.json's normalizers, pre-tokenizers and decoders (see hf_pipeline.h),
// with ICU for regular expressions and Unicode normalization. Each step does what the `tokenizers`
// library's step of the same name does (read from its behaviour and checked against it by
// tests/data/test_llama_tokenizer_reference.cc).
#include "tokenizers/hf_pipeline.h"

#include <unicode/normalizer2.h>
#include <unicode/regex.h>
#include <unicode/unistr.h>
#include <unicode/utext.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <functional>
#include <nlohmann/json.hpp>

#include "onyx/error.h"
#include "tokenizers/bpe.h"
#include "tokenizers/tokenizer.h"

namespace onyx::tokenizers::hf {

// ---- Regex ----

struct Regex::Impl {
  std::unique_ptr<icu::RegexPattern> pattern;
  std::string literal;  // when a String pattern (plain substring search)
  bool is_literal = false;
};

namespace {
// The pattern with \p{L} and \p{N} (also \p{Letter}, \p{Number}; inside or outside brackets)
// as the explicit sets of tokenizers' regex engine (unicode::regex_class_set); other escapes
// are kept as they are.
std::string with_tokenizers_classes(const std::string& p) {
  std::string out;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] != '\\' || i + 1 == p.size()) {
      out.push_back(p[i]);
      continue;
    }
    bool replaced = false;
    for (auto [name, letter] :
         {std::pair{"p{L}", true}, {"p{Letter}", true}, {"p{N}", false}, {"p{Number}", false}}) {
      const size_t n = std::char_traits<char>::length(name);
      if (p.compare(i + 1, n, name) == 0) {
        out += unicode::regex_class_set(letter);
        i += n;
        replaced = true;
        break;
      }
    }
    if (!replaced) {  // any other escape, as it is (an escaped backslash included)
      out.push_back(p[i]);
      out.push_back(p[++i]);
    }
  }
  return out;
}
}  // namespace

Regex::Regex(const std::string& pattern, bool literal, const std::string& where)
    : impl_(std::make_unique<Impl>()) {
  impl_->is_literal = literal;
  if (literal) {
    ONYX_CHECK(!pattern.empty(), where, ": the String pattern is empty");
    impl_->literal = pattern;
    return;
  }
  UErrorCode status = U_ZERO_ERROR;
  UParseError pe{};
  impl_->pattern.reset(icu::RegexPattern::compile(
      icu::UnicodeString::fromUTF8(with_tokenizers_classes(pattern)), 0, pe, status));
  if (U_FAILURE(status))
    throw Error(cat(where, ": invalid regex '", pattern, "': ", u_errorName(status),
                    " (ICU regex, near character ", pe.offset, ")"));
}

Regex::~Regex() = default;

std::vector<std::pair<size_t, size_t>> Regex::find_all(const std::string& text) const {
  std::vector<std::pair<size_t, size_t>> out;
  if (impl_->is_literal) {
    const std::string& lit = impl_->literal;
    for (size_t p = text.find(lit); p != std::string::npos; p = text.find(lit, p + lit.size()))
      out.emplace_back(p, p + lit.size());
    return out;
  }
  UErrorCode status = U_ZERO_ERROR;
  UText* ut = utext_openUTF8(nullptr, text.data(), (int64_t)text.size(), &status);
  std::unique_ptr<icu::RegexMatcher> m(impl_->pattern->matcher(status));
  ONYX_CHECK(U_SUCCESS(status), "ICU regex matcher: ", u_errorName(status));
  m->reset(ut);
  while (m->find(status) && U_SUCCESS(status)) {
    const int64_t b = m->start64(status), e = m->end64(status);
    out.emplace_back((size_t)b, (size_t)e);
  }
  utext_close(ut);
  ONYX_CHECK(U_SUCCESS(status), "ICU regex match: ", u_errorName(status));
  return out;
}

// ---- Unicode helpers ----

std::string normalize_form(const std::string& text, NormalForm form) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* n = form == NormalForm::NFC   ? icu::Normalizer2::getNFCInstance(status)
                              : form == NormalForm::NFD ? icu::Normalizer2::getNFDInstance(status)
                              : form == NormalForm::NFKC
                                  ? icu::Normalizer2::getNFKCInstance(status)
                                  : icu::Normalizer2::getNFKDInstance(status);
  ONYX_CHECK(U_SUCCESS(status), "ICU normalizer: ", u_errorName(status));
  icu::UnicodeString u = icu::UnicodeString::fromUTF8(text);
  icu::UnicodeString r = n->normalize(u, status);
  ONYX_CHECK(U_SUCCESS(status), "ICU normalize: ", u_errorName(status));
  std::string out;
  r.toUTF8String(out);
  return out;
}

std::string utf8_lossy(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char b = p[i];
    if (b < 0x80) {
      out.push_back((char)b);
      ++i;
      continue;
    }
    int len = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // the second byte's range
    if (b >= 0xC2 && b <= 0xDF) {
      len = 2;
    } else if (b >= 0xE0 && b <= 0xEF) {
      len = 3;
      if (b == 0xE0) lo = 0xA0;
      if (b == 0xED) hi = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
      len = 4;
      if (b == 0xF0) lo = 0x90;
      if (b == 0xF4) hi = 0x8F;
    }
    if (!len) {
      out += "\xEF\xBF\xBD";
      ++i;
      continue;
    }
    int k = 0;  // valid continuation bytes
    while (k < len - 1 && i + 1 + k < n) {
      const unsigned char c = p[i + 1 + k];
      const unsigned char l = k == 0 ? lo : 0x80, h = k == 0 ? hi : 0xBF;
      if (c < l || c > h) break;
      ++k;
    }
    if (k == len - 1) {
      out.append(s, i, len);
      i += len;
    } else {
      out += "\xEF\xBF\xBD";  // the maximal invalid prefix, one replacement character
      i += 1 + k;
    }
  }
  return out;
}

// ---- the steps ----

struct Pipeline::NormStep {
  enum Kind { Form, Prepend, Replace, Lowercase } kind;
  NormalForm form = NormalForm::NFC;
  std::string text;  // Prepend's string, Replace's content
  std::shared_ptr<Regex> pattern;
};

struct Pipeline::PreStep {
  enum Kind { Split, ByteLevel, Metaspace } kind;
  std::shared_ptr<Regex> pattern;  // Split
  // Split: what becomes of the delimiters (the matches, or with invert the stretches between)
  enum Behavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };
  Behavior behavior = Isolated;
  bool invert = false;
  bool add_prefix_space = false, use_regex = true;  // ByteLevel
  std::string replacement;                          // Metaspace
  enum Scheme { Always, First, Never } scheme = Always;
  bool split = true;
};

struct Pipeline::DecStep {
  enum Kind { ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace } kind;
  std::shared_ptr<Regex> pattern;  // Replace
  std::string content;             // Replace's content, Strip's character, Metaspace's replacement
  int64_t start = 0, stop = 0;     // Strip
  bool prepend = true;             // Metaspace: prepend_scheme other than never
};

Pipeline::Pipeline() = default;
Pipeline::~Pipeline() = default;

namespace {

using nlohmann::json;

struct Reader {
  const std::string& path;
  std::string where(const std::string& jpath, const std::string& what) const {
    return cat("tokenizer file '", path, "': ", jpath, ": ", what);
  }
  const json& need(const json& o, const std::string& jpath, const char* key) const {
    ONYX_CHECK(o.is_object() && o.contains(key), where(jpath, cat("has no \"", key, "\"")));
    return o[key];
  }
  std::string str(const json& o, const std::string& jpath, const char* key) const {
    const json& v = need(o, jpath, key);
    ONYX_CHECK(v.is_string(), where(cat(jpath, ".", key), "should be a string"));
    return v.get<std::string>();
  }
  // {"String": s} or {"Regex": r}
  std::shared_ptr<Regex> pattern(const json& o, const std::string& jpath) const {
    const json& p = need(o, jpath, "pattern");
    const std::string pp = jpath + ".pattern";
    ONYX_CHECK(p.is_object() && p.size() == 1 && (p.contains("String") || p.contains("Regex")) &&
                   p.begin()->is_string(),
               where(pp, "should be {\"String\": ...} or {\"Regex\": ...}"));
    const bool literal = p.contains("String");
    return std::make_shared<Regex>(
        p.begin()->get<std::string>(), literal,
        cat("tokenizer file '", path, "': ", pp, literal ? ".String" : ".Regex"));
  }
  std::string type(const json& o, const std::string& jpath) const {
    ONYX_CHECK(o.is_object() && o.contains("type") && o["type"].is_string(),
               where(jpath, "has no \"type\""));
    return o["type"].get<std::string>();
  }
};

char32_t single_char(const Reader& r, const std::string& s, const std::string& jpath) {
  auto u = unicode::decode_utf8(s);
  ONYX_CHECK(u.size() == 1, r.where(jpath, cat("should be one character, got '", s, "'")));
  return u[0];
}

// Replaces every match of `re` in `s` by `content`.
std::string replace_all(const Regex& re, const std::string& s, const std::string& content) {
  std::string out;
  size_t prev = 0;
  for (auto [b, e] : re.find_all(s)) {
    out.append(s, prev, b - prev);
    out += content;
    prev = e;
  }
  out.append(s, prev, std::string::npos);
  return out;
}

Pipeline::PreStep::Behavior split_behavior(const Reader& r, const std::string& name,
                                           const std::string& jpath) {
  using B = Pipeline::PreStep;
  for (auto [n, b] : {std::pair{"Removed", B::Removed},
                      {"Isolated", B::Isolated},
                      {"MergedWithPrevious", B::MergedWithPrevious},
                      {"MergedWithNext", B::MergedWithNext},
                      {"Contiguous", B::Contiguous}})
    if (name == n) return b;
  throw Error(r.where(jpath, cat("'", name, "' is not a Split behavior")));
}

}  // namespace

// Split as tokenizers' NormalizedString::split: the text as matches and the stretches between
// (with invert the stretches are the delimiters), the delimiters removed, kept apart, merged into
// the piece before or after, or runs of them merged; empty pieces dropped.
void Pipeline::split_piece(const PreStep& st, const PrePiece& pc, std::vector<PrePiece>& out) {
  struct Seg {
    size_t b, e;
    bool delim;
  };
  std::vector<Seg> segs;
  size_t prev = 0;
  for (auto [b, e] : st.pattern->find_all(pc.text)) {
    if (b > prev) segs.push_back({prev, b, st.invert});
    segs.push_back({b, e, !st.invert});
    prev = e;
  }
  if (prev < pc.text.size()) segs.push_back({prev, pc.text.size(), st.invert});
  std::vector<Seg> kept;  // delim now means: removed
  bool previous_delim = false;
  for (size_t i = 0; i < segs.size(); ++i) {
    // MergedWithNext runs back to front (below), the others front to back
    const Seg& sg = st.behavior == PreStep::MergedWithNext ? segs[segs.size() - 1 - i] : segs[i];
    bool merge = false;
    switch (st.behavior) {
      case PreStep::Removed:
        kept.push_back(sg);
        continue;
      case PreStep::Isolated:
        break;
      case PreStep::Contiguous:
        merge = sg.delim == previous_delim;
        break;
      case PreStep::MergedWithPrevious:
      case PreStep::MergedWithNext:
        merge = sg.delim && !previous_delim;
        break;
    }
    previous_delim = sg.delim;
    if (merge && !kept.empty()) {
      if (st.behavior == PreStep::MergedWithNext)
        kept.back().b = sg.b;
      else
        kept.back().e = sg.e;
    } else {
      kept.push_back({sg.b, sg.e, false});
    }
  }
  if (st.behavior == PreStep::MergedWithNext) std::reverse(kept.begin(), kept.end());
  for (auto& k : kept)
    if (!k.delim && k.e > k.b)
      out.push_back({pc.text.substr(k.b, k.e - k.b), pc.at_start && k.b == 0});
}

std::shared_ptr<const Pipeline> Pipeline::parse(const nlohmann::json& j, const std::string& path) {
  auto p = std::make_shared<Pipeline>();
  Reader r{path};
  try {
    // normalizer
    std::function<void(const json&, const std::string&)> add_norm = [&](const json& n,
                                                                        const std::string& jp) {
      if (n.is_null()) return;
      const std::string t = r.type(n, jp);
      auto step = std::make_shared<NormStep>();
      if (t == "Sequence") {
        const json& subs = r.need(n, jp, "normalizers");
        ONYX_CHECK(subs.is_array(), r.where(jp + ".normalizers", "should be an array"));
        for (size_t i = 0; i < subs.size(); ++i)
          add_norm(subs[i], cat(jp, ".normalizers[", i, "]"));
        return;
      } else if (t == "NFC" || t == "NFD" || t == "NFKC" || t == "NFKD") {
        step->kind = NormStep::Form;
        step->form = t == "NFC"    ? NormalForm::NFC
                     : t == "NFD"  ? NormalForm::NFD
                     : t == "NFKC" ? NormalForm::NFKC
                                   : NormalForm::NFKD;
      } else if (t == "Prepend") {
        step->kind = NormStep::Prepend;
        step->text = r.str(n, jp, "prepend");
      } else if (t == "Replace") {
        step->kind = NormStep::Replace;
        step->pattern = r.pattern(n, jp);
        step->text = r.str(n, jp, "content");
      } else if (t == "Lowercase") {
        step->kind = NormStep::Lowercase;
      } else {
        ONYX_UNSUPPORTED(r.where(jp, cat("normalizer type '", t,
                                         "' is not supported (NFC, NFD, NFKC, NFKD, Prepend, "
                                         "Replace, Lowercase and Sequence are)")));
      }
      p->norm_.push_back(step);
    };
    if (j.contains("normalizer")) add_norm(j["normalizer"], "normalizer");

    // pre_tokenizer
    std::function<void(const json&, const std::string&)> add_pre = [&](const json& n,
                                                                       const std::string& jp) {
      if (n.is_null()) return;
      const std::string t = r.type(n, jp);
      auto step = std::make_shared<PreStep>();
      if (t == "Sequence") {
        const json& subs = r.need(n, jp, "pretokenizers");
        ONYX_CHECK(subs.is_array(), r.where(jp + ".pretokenizers", "should be an array"));
        for (size_t i = 0; i < subs.size(); ++i)
          add_pre(subs[i], cat(jp, ".pretokenizers[", i, "]"));
        return;
      } else if (t == "Split") {
        step->kind = PreStep::Split;
        step->behavior = split_behavior(r, r.str(n, jp, "behavior"), jp + ".behavior");
        step->invert = n.value("invert", false);
        step->pattern = r.pattern(n, jp);
      } else if (t == "ByteLevel") {
        step->kind = PreStep::ByteLevel;
        step->add_prefix_space = n.value("add_prefix_space", false);
        step->use_regex = n.value("use_regex", true);
        p->byte_level_ = true;
      } else if (t == "Metaspace") {
        step->kind = PreStep::Metaspace;
        step->replacement = n.contains("replacement") ? r.str(n, jp, "replacement") : "\u2581";
        single_char(r, step->replacement, jp + ".replacement");
        if (n.contains("prepend_scheme")) {
          const std::string s = r.str(n, jp, "prepend_scheme");
          if (s == "always")
            step->scheme = PreStep::Always;
          else if (s == "first")
            step->scheme = PreStep::First;
          else if (s == "never")
            step->scheme = PreStep::Never;
          else
            throw Error(
                r.where(jp + ".prepend_scheme", cat("'", s, "' is not always, first or never")));
        } else {  // files from before tokenizers 0.19: add_prefix_space
          step->scheme = n.value("add_prefix_space", true) ? PreStep::Always : PreStep::Never;
        }
        step->split = n.value("split", true);
      } else {
        ONYX_UNSUPPORTED(r.where(jp, cat("pre_tokenizer type '", t,
                                         "' is not supported with BPE (ByteLevel, Split, "
                                         "Metaspace and Sequence are)")));
      }
      p->pre_.push_back(step);
    };
    if (j.contains("pre_tokenizer")) add_pre(j["pre_tokenizer"], "pre_tokenizer");

    // decoder
    std::function<void(const json&, const std::string&)> add_dec = [&](const json& n,
                                                                       const std::string& jp) {
      if (n.is_null()) return;
      p->has_decoder_ = true;
      const std::string t = r.type(n, jp);
      auto step = std::make_shared<DecStep>();
      if (t == "Sequence") {
        const json& subs = r.need(n, jp, "decoders");
        ONYX_CHECK(subs.is_array(), r.where(jp + ".decoders", "should be an array"));
        for (size_t i = 0; i < subs.size(); ++i) add_dec(subs[i], cat(jp, ".decoders[", i, "]"));
        return;
      } else if (t == "ByteLevel") {
        step->kind = DecStep::ByteLevel;
      } else if (t == "Replace") {
        step->kind = DecStep::Replace;
        step->pattern = r.pattern(n, jp);
        step->content = r.str(n, jp, "content");
      } else if (t == "ByteFallback") {
        step->kind = DecStep::ByteFallback;
      } else if (t == "Fuse") {
        step->kind = DecStep::Fuse;
      } else if (t == "Strip") {
        step->kind = DecStep::Strip;
        step->content = r.str(n, jp, "content");
        single_char(r, step->content, jp + ".content");
        step->start = n.value("start", (int64_t)0);
        step->stop = n.value("stop", (int64_t)0);
      } else if (t == "Metaspace") {
        step->kind = DecStep::Metaspace;
        step->content = n.contains("replacement") ? r.str(n, jp, "replacement") : "\u2581";
        single_char(r, step->content, jp + ".replacement");
        if (n.contains("prepend_scheme"))
          step->prepend = r.str(n, jp, "prepend_scheme") != "never";
        else
          step->prepend = n.value("add_prefix_space", true);
      } else {
        ONYX_UNSUPPORTED(r.where(jp, cat("decoder type '", t,
                                         "' is not supported (ByteLevel, Replace, ByteFallback, "
                                         "Fuse, Strip, Metaspace and Sequence are)")));
      }
      p->dec_.push_back(step);
    };
    if (j.contains("decoder")) add_dec(j["decoder"], "decoder");
  } catch (const nlohmann::json::exception& e) {
    throw Error(cat("tokenizer file '", path, "': unexpected value: ", e.what()));
  }
  return p;
}

std::string Pipeline::normalize(const std::string& text) const {
  std::string s = text;
  for (auto& st : norm_) {
    switch (st->kind) {
      case NormStep::Form:
        s = normalize_form(s, st->form);
        break;
      case NormStep::Prepend:
        if (!s.empty()) s = st->text + s;
        break;
      case NormStep::Replace:
        s = replace_all(*st->pattern, s, st->text);
        break;
      case NormStep::Lowercase: {  // Rust's char::to_lowercase, a code point at a time
        std::u32string lower;
        for (char32_t c : unicode::decode_utf8(s)) unicode::append_lower(c, lower);
        s = unicode::encode_utf8(lower);
        break;
      }
    }
  }
  return s;
}

std::vector<PrePiece> Pipeline::pre_tokenize(const std::string& text, bool at_start) const {
  std::vector<PrePiece> pieces{{text, at_start}};
  for (auto& st : pre_) {
    std::vector<PrePiece> next;
    for (auto& pc : pieces) {
      switch (st->kind) {
        case PreStep::Split:
          split_piece(*st, pc, next);
          break;
        case PreStep::ByteLevel: {
          std::string t = pc.text;
          if (st->add_prefix_space && (t.empty() || t[0] != ' ')) t = " " + t;
          std::vector<std::string> parts;
          if (st->use_regex)
            parts = BpeTokenizer::pre_tokenize(t);
          else
            parts.push_back(t);
          bool first = pc.at_start;
          for (auto& part : parts) {
            if (part.empty()) continue;
            std::string mapped;
            for (unsigned char b : part)
              unicode::append_utf8(BpeTokenizer::byte_to_unicode(b), mapped);
            next.push_back({std::move(mapped), first});
            first = false;
          }
          break;
        }
        case PreStep::Metaspace: {
          const std::string& rep = st->replacement;
          std::string t;
          for (char c : pc.text) {
            if (c == ' ')
              t += rep;
            else
              t.push_back(c);
          }
          const bool starts = t.compare(0, rep.size(), rep) == 0;
          if (!starts &&
              (st->scheme == PreStep::Always || (st->scheme == PreStep::First && pc.at_start)))
            t = rep + t;
          if (!st->split) {
            if (!t.empty()) next.push_back({t, pc.at_start});
            break;
          }
          // MergedWithNext: each replacement begins a piece
          size_t b = 0;
          bool first = pc.at_start;
          for (size_t p = t.find(rep, 1); p != std::string::npos; p = t.find(rep, p + rep.size())) {
            if (p > b) {
              next.push_back({t.substr(b, p - b), first});
              first = false;
            }
            b = p;
          }
          if (t.size() > b) next.push_back({t.substr(b), first});
          break;
        }
      }
    }
    pieces = std::move(next);
  }
  return pieces;
}

std::string Pipeline::decode(std::vector<std::string> tokens) const {
  if (!has_decoder_) {
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
    return out;
  }
  for (auto& st : dec_) {
    std::vector<std::string> next;
    switch (st->kind) {
      case DecStep::ByteLevel: {
        static const std::array<int16_t, 512> unbyte = [] {
          std::array<int16_t, 512> a;
          a.fill(-1);
          for (int k = 0; k < 256; ++k) a[BpeTokenizer::byte_to_unicode((uint8_t)k)] = (int16_t)k;
          return a;
        }();
        std::string bytes;
        for (auto& t : tokens) {
          std::string tb;
          bool all = true;
          for (char32_t c : unicode::decode_utf8(t)) {
            const int b = c < 512 ? unbyte[c] : -1;
            if (b < 0) {
              all = false;
              break;
            }
            tb.push_back((char)b);
          }
          bytes += all ? tb : t;
        }
        next.push_back(utf8_lossy(bytes));
        break;
      }
      case DecStep::Replace:
        for (auto& t : tokens) next.push_back(replace_all(*st->pattern, t, st->content));
        break;
      case DecStep::ByteFallback: {
        std::string pending;
        auto flush = [&] {
          if (pending.empty()) return;
          if (utf8_lossy(pending) == pending) {
            next.push_back(pending);
          } else {
            for (size_t k = 0; k < pending.size(); ++k) next.push_back("\xEF\xBF\xBD");
          }
          pending.clear();
        };
        for (auto& t : tokens) {
          bool is_byte = t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>' &&
                         std::isxdigit((unsigned char)t[3]) && std::isxdigit((unsigned char)t[4]);
          if (is_byte) {
            pending.push_back((char)std::stoi(t.substr(3, 2), nullptr, 16));
          } else {
            flush();
            next.push_back(t);
          }
        }
        flush();
        break;
      }
      case DecStep::Fuse: {
        std::string all;
        for (auto& t : tokens) all += t;
        next.push_back(all);
        break;
      }
      case DecStep::Strip: {
        const char32_t c = unicode::decode_utf8(st->content)[0];
        for (auto& t : tokens) {
          std::u32string u = unicode::decode_utf8(t);
          size_t b = 0, e = u.size();
          for (int64_t k = 0; k < st->start && b < e && u[b] == c; ++k) ++b;
          for (int64_t k = 0; k < st->stop && e > b && u[e - 1] == c; ++k) --e;
          next.push_back(unicode::encode_utf8(u.substr(b, e - b)));
        }
        break;
      }
      case DecStep::Metaspace: {
        const char32_t rep = unicode::decode_utf8(st->content)[0];
        for (size_t i = 0; i < tokens.size(); ++i) {
          std::string out;
          for (char32_t c : unicode::decode_utf8(tokens[i])) {
            if (c != rep)
              unicode::append_utf8(c, out);
            else if (!(i == 0 && st->prepend))  // the first token's replacements are dropped
              out.push_back(' ');
          }
          next.push_back(out);
        }
        break;
      }
    }
    tokens = std::move(next);
  }
  std::string out;
  for (auto& t : tokens) out += t;
  return out;
}

}  // namespace onyx::tokenizers::hf
