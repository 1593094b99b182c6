// tokenizers/hf_pipeline.h — the normalizer, pre-tokenizer and decoder of a Hugging Face
// tokenizer.json, as the `tokenizers` library runs them around a BPE model (Llama 3, Qwen2, Llama
// 2, Mistral and GPT-2 files):
//   normalizer     NFC, NFD, NFKC, NFKD (ICU's Normalizer2), Prepend, Replace (String or Regex),
//                  Lowercase, Sequence, null
//   pre_tokenizer  Split (Regex or String pattern, every behavior, invert), ByteLevel
//                  (GPT-2's regex when use_regex, then the bytes-to-unicode map), Metaspace
//                  (replacement, prepend_scheme always/first/never, split), Sequence, null
//   decoder        ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace, Sequence, null
// Regex patterns run on ICU's regex engine (Debian libicu-dev): it has what the Llama-family
// patterns need (\p{L}, \p{N}, (?i:...), lookahead), which no hand matcher should re-implement.
// `tokenizers` runs Oniguruma; both engines take \s as Unicode White_Space (VT and NEL included)
// and the classes from their Unicode tables, and the references check every code point of planes 0
// and 1 through the patterns. Anything else in a file is an error naming the file and the JSON
// path, never a silent approximation.
#pragma once
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <utility>
#include <vector>

namespace onyx::tokenizers::hf {

// A compiled regular expression (ICU), or a literal string when `literal`.
class Regex {
 public:
  // Errors name `where` (the file and JSON path) and ICU's reason.
  Regex(const std::string& pattern, bool literal, const std::string& where);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  // Every non-overlapping match, leftmost first, as UTF-8 byte ranges [begin, end).
  std::vector<std::pair<size_t, size_t>> find_all(const std::string& text) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The Unicode normalization forms.
enum class NormalForm { NFC, NFD, NFKC, NFKD };
std::string normalize_form(const std::string& text, NormalForm form);

// Decodes UTF-8 as Rust's String::from_utf8_lossy: each maximal invalid subsequence becomes one
// U+FFFD.
std::string utf8_lossy(const std::string& bytes);

struct PrePiece {
  std::string text;
  bool at_start;  // begins at offset 0 of the text given to encode (Metaspace's prepend "first")
};

class Pipeline {
 public:
  // Reads j["normalizer"], j["pre_tokenizer"] and j["decoder"]; errors name `path` and the JSON
  // path.
  static std::shared_ptr<const Pipeline> parse(const nlohmann::json& j, const std::string& path);

  bool has_normalizer() const { return !norm_.empty(); }
  std::string normalize(const std::string& text) const;
  // The pre-tokenizer's pieces of one stretch of normalized text; ByteLevel maps each piece's
  // bytes to GPT-2's printable code points.
  std::vector<PrePiece> pre_tokenize(const std::string& text, bool at_start) const;
  // The decoder over the tokens' strings, joined (no decoder: joined with spaces).
  std::string decode(std::vector<std::string> tokens) const;
  // Whether a ByteLevel pre-tokenizer runs (the vocabulary is GPT-2's byte alphabet).
  bool byte_level() const { return byte_level_; }

  struct NormStep;
  struct PreStep;
  struct DecStep;
  Pipeline();
  ~Pipeline();

 private:
  static void split_piece(const PreStep& st, const PrePiece& pc, std::vector<PrePiece>& out);

  std::vector<std::shared_ptr<NormStep>> norm_;
  std::vector<std::shared_ptr<PreStep>> pre_;
  std::vector<std::shared_ptr<DecStep>> dec_;
  bool has_decoder_ = false;
  bool byte_level_ = false;
};

}  // namespace onyx::tokenizers::hf
