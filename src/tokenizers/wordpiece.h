// tokenizers/wordpiece.h — BERT's WordPiece tokenizer, as Hugging Face's BertNormalizer +
// BertPreTokenizer + WordPiece model + BertProcessing ([CLS] A [SEP] B [SEP], token types 0/1).
//   normalize:    clean text (drop NUL, U+FFFD and \p{C} controls; white space -> ' '), put spaces
//                 around CJK ideographs, strip accents (NFD, then drop Mn marks; every Unicode
//                 decomposition, from a generated table), lower-case (full Unicode, per character);
//                 the classes are Hugging Face tokenizers' own (Unicode 8), see unicode:: in
//                 tokenizer.h
//   pre-tokenize: split on white space, then every punctuation character is a word of its own
//   WordPiece:    greedy longest match first, later pieces prefixed "##"; a word with no
//                 segmentation, or longer than max_input_chars_per_word characters, is [UNK]
#pragma once
#include <string>
#include <unordered_map>
#include <vector>

#include "tokenizers/tokenizer.h"

namespace onyx::tokenizers {

struct WordPieceConfig {
  bool lowercase = true;
  bool strip_accents = true;  // Hugging Face's null means "as lowercase"
  bool clean_text = true;
  bool handle_chinese_chars = true;
  std::string unk_token = "[UNK]";
  std::string cls_token = "[CLS]";
  std::string sep_token = "[SEP]";
  std::string pad_token = "[PAD]";
  std::string mask_token = "[MASK]";
  std::string continuing_subword_prefix = "##";
  int64_t max_input_chars_per_word = 100;
};

class WordPieceTokenizer : public Tokenizer {
 public:
  // vocab[i] is the token with id i (a later duplicate wins the token's id, as BERT's load_vocab).
  // The template is [CLS] A [SEP] (B [SEP]) when the vocabulary has both; the special tokens found
  // in it are matched in raw text. Errors name `source` if the vocabulary lacks unk_token.
  explicit WordPieceTokenizer(std::vector<std::string> vocab, WordPieceConfig cfg = {},
                              std::string source = "WordPiece vocabulary");
  // vocab.txt: one token per line, id = line number.
  static std::shared_ptr<WordPieceTokenizer> from_vocab_txt(const std::string& path,
                                                            WordPieceConfig cfg = {});
  // tokenizer.json with model.type "WordPiece"; normalizer BertNormalizer (or null), pre_tokenizer
  // BertPreTokenizer (or null), post_processor BertProcessing / TemplateProcessing.
  static std::shared_ptr<WordPieceTokenizer> from_tokenizer_json(const std::string& path);
  static std::shared_ptr<WordPieceTokenizer> from_tokenizer_json(const nlohmann::json& j,
                                                                 const std::string& path);

  std::u32string normalize(const std::string& text) const;
  std::vector<std::u32string> pre_tokenize(const std::u32string& normalized) const;
  // The word pieces of a text (no special tokens), e.g. "unaffable" -> un ##aff ##able.
  std::vector<std::string> tokenize(const std::string& text) const;

  std::string decode(const std::vector<int64_t>& ids) const override;
  int64_t vocab_size() const override { return (int64_t)vocab_.size(); }
  std::optional<int64_t> token_id(const std::string& token) const override;
  std::string kind() const override { return "wordpiece"; }
  bool uses_token_type_ids() const override { return true; }
  const WordPieceConfig& config() const { return cfg_; }
  int64_t unk_id() const { return unk_id_; }

 protected:
  std::vector<int64_t> encode_plain(const std::string& text) const override;

 private:
  // Appends the pieces of one pre-tokenized word (ids, and strings if `pieces` is non-null).
  void wordpiece(const std::u32string& word, std::vector<int64_t>& ids,
                 std::vector<std::string>* pieces) const;

  WordPieceConfig cfg_;
  std::vector<std::string> vocab_;
  std::unordered_map<std::string, int64_t> ids_;
  int64_t unk_id_ = 0;
};

}  // namespace onyx::tokenizers
