// tokenizers/tokenizer.h — what every tokenizer gives a dataset, and the Unicode helpers they
// share. A Tokenizer turns text into ids (encode_ids), then assembles one text or a pair into
// input_ids, attention_mask and token_type_ids with the model's special tokens (a template as
// Hugging Face's post-processors: [CLS] A [SEP] B [SEP] for BERT, nothing for GPT-2), truncation
// (longest_first) and padding. WordPiece (wordpiece.h) and byte-level BPE (bpe.h) implement it;
// load_tokenizer picks one from a Hugging Face checkpoint folder or file.
#pragma once
#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace onyx::tokenizers {

struct Encoding {
  std::vector<int64_t> input_ids;
  std::vector<int64_t> attention_mask;  // 1 for tokens, 0 for padding
  std::vector<int64_t> token_type_ids;  // segment: 0 for the first text, 1 for the second (BERT)
  int64_t size() const { return (int64_t)input_ids.size(); }
};

struct EncodeOptions {
  bool add_special_tokens = true;
  // > 0: truncate so the result, special tokens included, has at most max_length tokens. A pair is
  // cut as Hugging Face tokenizers' longest_first: the longer text shrinks first; if both must
  // shrink, the first keeps floor(budget/2) and the second the rest.
  int64_t max_length = 0;
  // > 0: pad (right, pad id, mask 0, type 0) to this length; a longer encoding is an error.
  int64_t pad_to = 0;
};

// The post-processor's template: special tokens and the two sequences, each with a type id.
struct TemplatePiece {
  enum Kind { Special, SequenceA, SequenceB } kind = Special;
  int64_t id = 0;  // the token id, for Special
  int64_t type_id = 0;
};
struct PostTemplate {
  std::vector<TemplatePiece> single, pair;
};

// A token of tokenizer.json's added_tokens, matched in the text before the model runs (as Hugging
// Face tokenizers' AddedVocabulary: leftmost-longest; tokens with `normalized` are matched in the
// normalized text, as the normalizer makes their content, the others in the raw text first).
struct AddedToken {
  std::string content;
  int64_t id = 0;
  bool special = true;
  bool lstrip = false;       // the match takes the white space before it
  bool rstrip = false;       // and after it
  bool single_word = false;  // only where no word character (\w) touches it
  bool normalized = false;
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Ids of `text` without special tokens around it. Added tokens written in the text (such as
  // "[MASK]" or "<|endoftext|>") are matched first, before normalization, and map to their id.
  std::vector<int64_t> encode_ids(const std::string& text) const;
  Encoding encode(const std::string& text, const EncodeOptions& opts = {}) const;
  Encoding encode_pair(const std::string& a, const std::string& b,
                       const EncodeOptions& opts = {}) const;
  // The template, truncation and padding over ids that encode_ids produced (b may be null).
  Encoding assemble(std::vector<int64_t> a, const std::vector<int64_t>* b,
                    const EncodeOptions& opts) const;
  // Number of special tokens the template adds for one text or a pair.
  int64_t num_special_tokens(bool pair) const;

  virtual std::string decode(const std::vector<int64_t>& ids) const = 0;
  // The text one token stands for by itself, to place tokens in the text they came from: unlike
  // decode({id}), no decoder step that depends on the token's neighbours or position (Strip of a
  // leading space, Metaspace's first token, lossy UTF-8 of a token holding part of a character).
  virtual std::string token_bytes(int64_t id) const { return decode({id}); }
  virtual int64_t vocab_size() const = 0;
  // The model's vocabulary entries (tokenizers' Model::get_vocab_size, which numbers new added
  // tokens): vocab_size() unless ids have gaps.
  virtual int64_t model_vocab_entries() const { return vocab_size(); }
  virtual std::optional<int64_t> token_id(const std::string& token) const = 0;
  virtual std::string kind() const = 0;  // "wordpiece", "bpe"
  // Whether the model takes token_type_ids (BERT does, GPT-2 does not).
  virtual bool uses_token_type_ids() const = 0;

  int64_t pad_id() const { return pad_id_; }
  std::optional<int64_t> eos_id() const {
    return eos_id_;
  }  // [SEP] for BERT, <|endoftext|> for GPT-2
  const PostTemplate& post_template() const { return template_; }
  const std::string& source() const { return source_; }  // the file it came from, for messages

  // Added tokens are matched in raw text; they keep the id given here.
  void add_special_token(const std::string& text, int64_t id);
  // An added token with tokenizer.json's options (replaces one with the same content).
  void add_token(const AddedToken& t);
  // Several at once (one index rebuild): a content already added is replaced.
  void add_tokens(const std::vector<AddedToken>& tokens);
  const std::vector<AddedToken>& added_tokens() const { return added_; }
  // The added token with this id, if any.
  const AddedToken* added_token(int64_t id) const;

 protected:
  // Ids of a stretch of text that holds no added token.
  virtual std::vector<int64_t> encode_plain(const std::string& text) const = 0;
  // The normalizer that runs before added tokens with `normalized` are matched (and on their
  // content); the default is none (WordPiece normalizes inside encode_plain).
  virtual std::string normalize_text(const std::string& text) const { return text; }
  // Ids of a stretch of normalized text without added tokens; at_start: it begins the text.
  virtual std::vector<int64_t> encode_segment(const std::string& normalized, bool at_start) const {
    (void)at_start;
    return encode_plain(normalized);
  }

  PostTemplate template_;
  int64_t pad_id_ = 0;
  std::optional<int64_t> eos_id_;
  std::string source_;
  std::vector<AddedToken> added_;
  // The string each added token matches (its content, normalized when `normalized`), longest first.
  std::vector<std::pair<std::string, size_t>> added_match_;

 private:
  struct Split {
    size_t begin, end;
    int64_t id;  // -1: plain text
  };
  std::vector<Split> split_added(const std::string& s, bool normalized) const;
  void index_added();
};

// Loads a tokenizer from a Hugging Face tokenizer.json (model.type WordPiece or BPE), a vocab.txt
// (WordPiece), a vocab.json next to merges.txt (byte-level BPE), or a folder holding one of them
// (tokenizer.json preferred; tokenizer_config.json's do_lower_case is honoured for vocab.txt).
std::shared_ptr<Tokenizer> load_tokenizer(const std::string& path);
// A tokenizer.json's text (`path` names it in errors).
std::shared_ptr<Tokenizer> tokenizer_from_json_text(const std::string& text,
                                                    const std::string& path);

// Reads a whole file; errors name the file.
std::string read_text_file(const std::string& path);

// For tokenizer implementations reading a Hugging Face tokenizer.json (`path` is for messages):
// the post_processor (BertProcessing, RobertaProcessing, TemplateProcessing, ByteLevel, Sequence
// or null) as a template, and the added_tokens (special or not, with lstrip, rstrip, single_word
// and normalized), registered on `tok`.
PostTemplate parse_post_processor(const nlohmann::json& tokenizer_json, const std::string& path);
void register_added_tokens(const nlohmann::json& tokenizer_json, const std::string& path,
                           Tokenizer& tok);
// Types and required fields as Hugging Face tokenizers' deserializer requires them (ids u32, the
// added tokens' flags, padding / truncation, each component's fields); errors name the file and
// the JSON path (tokenizer_schema.cc).
void check_tokenizer_json(const nlohmann::json& tokenizer_json, const std::string& path);
// padding.pad_id (present), inside [0, vocab_size).
int64_t checked_pad_id(const nlohmann::json& tokenizer_json, int64_t vocab_size,
                       const std::string& path);
// Ids are kept in tables: a vocabulary's largest id may exceed its entry count by this much
// (gaps), no more — an id of 2^31 - 1 would allocate 2^31 entries.
constexpr int64_t kMaxIdGap = 1 << 16;

// Unicode helpers shared by the tokenizers, from the tables that
// tests/tokenizers/gen_unicode_tables.py generates (src/tokenizers/unicode_tables.inc). char_class
// comes from the Unicode Character Database (Unicode 14, complete for every script), its letters
// and numbers from Hugging Face tokenizers' regex engine (\p{L}, \p{N}: newer Unicode tables), as
// byte-level BPE's regex classes. The is_bert_* helpers, append_lower and append_strip_accents are
// what Hugging Face tokenizers' BertNormalizer and BertPreTokenizer do, read from that library: its
// categories are Unicode 8's, so a code point assigned later (or not at all) is an ordinary
// character to BERT, neither control, punctuation nor mark.
namespace unicode {

enum class CharClass : uint8_t {
  Other,
  Letter,          // \p{L}
  MarkNonspacing,  // Mn (BERT's accent stripping uses its own, older set)
  MarkOther,       // Mc, Me
  Number,          // \p{N}
  Punctuation,     // \p{P}
  Symbol,          // \p{S}
  SpaceSeparator,  // Zs
  LineSeparator,   // Zl, Zp
  Control,         // \p{C}: Cc, Cf, Cs, Co, Cn (unassigned)
};

CharClass char_class(char32_t c);
inline bool is_letter(char32_t c) { return char_class(c) == CharClass::Letter; }
inline bool is_number(char32_t c) { return char_class(c) == CharClass::Number; }
bool is_white_space(char32_t c);  // the Unicode White_Space property (as regex \s)
// An ICU regex set ("[\x{41}-\x{5a}...]") of what tokenizers' regex engine (Oniguruma) matches
// with \p{L} (letter) or \p{N}: hf_pipeline.cc's regexes use it in place of ICU's own classes,
// whose Unicode version (Debian 12's ICU: 15.0) is older.
const std::string& regex_class_set(bool letter);
bool is_cjk(char32_t c);  // the CJK ideograph blocks BERT surrounds with spaces (HF's ranges)
// ASCII punctuation/symbols or \p{P} (Unicode 8), as BertPreTokenizer splits off.
bool is_bert_punctuation(char32_t c);
// What BertNormalizer's clean_text drops: NUL, U+FFFD and \p{C} (Unicode 8: Cc, Cf, Co, Cs; not
// unassigned code points) except \t \n \r.
bool is_bert_control(char32_t c);

// Lower case as BertNormalizer (Rust's char::to_lowercase, one code point at a time), one code
// point to one or (for U+0130) two; appends to out.
void append_lower(char32_t c, std::u32string& out);
// NFD with nonspacing marks (Mn, Unicode 8) removed, as BertNormalizer's strip_accents: every
// canonical decomposition (Latin, Greek, Cyrillic, kana voicing marks, ...), Hangul syllables into
// jamo; a code point NFD leaves alone is appended unchanged, an Mn mark is dropped.
void append_strip_accents(char32_t c, std::u32string& out);

// UTF-8. Invalid bytes decode to U+FFFD, one per byte; byte_len (if given) receives each code
// point's length in the input.
std::u32string decode_utf8(const std::string& s, std::vector<uint8_t>* byte_len = nullptr);
void append_utf8(char32_t c, std::string& out);
std::string encode_utf8(const std::u32string& s);
// The offset of the first byte of `s` that is not well-formed UTF-8 (RFC 3629: no overlong form,
// no surrogate, nothing past U+10FFFF), or std::string::npos.
size_t invalid_utf8_at(const std::string& s, size_t from = 0);

}  // namespace unicode
}  // namespace onyx::tokenizers
