// tokenizers/bpe.h — BPE tokenizers: GPT-2's byte-level BPE (also RoBERTa's, with its
// post-processor) and, from a tokenizer.json, the Llama family's: byte-level BPE behind a Split
// regex (Llama 3, Qwen2; ignore_merges) and SentencePiece-style BPE over "▁" words with byte
// fallback (Llama 2, Mistral), the normalizer, pre-tokenizer and decoder run by hf_pipeline.h.
//   pre-tokenize: GPT-2's pattern 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+|
//   ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//                 matched by hand (no regex engine); \p{L} and \p{N} come from the generated
//                 Unicode class table (every script), \s is the White_Space property
//   byte level:   each piece's UTF-8 bytes map to printable code points (GPT-2's bytes_to_unicode),
//                 so the vocabulary has no unknown byte
//   BPE:          adjacent symbols merge by merge rank (lowest first, leftmost on ties), with a
//                 cache of words already seen
// From a tokenizer.json each pre-tokenized piece starts as one symbol per character (its vocabulary
// id; else, with model.byte_fallback, its UTF-8 bytes as <0xXX> tokens; else model.unk_token, fused
// with the previous unknown when fuse_unk; else, as in tokenizers, nothing), and with
// model.ignore_merges a piece that is itself in the vocabulary is that one token.
#pragma once
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tokenizers/tokenizer.h"

namespace onyx::tokenizers {

namespace hf {
class Pipeline;
}

struct BpeConfig {
  bool add_prefix_space = false;            // prepend ' ' to a text that does not start with one
  std::string eos_token = "<|endoftext|>";  // also the pad token unless pad_token names another
  std::string pad_token;
  size_t cache_capacity = 100000;  // words cached; the cache is cleared when full
};

class BpeTokenizer : public Tokenizer {
 public:
  // vocab: byte-level token string -> id; merges: pairs of byte-level strings in rank order. Every
  // merge's parts and result must be in the vocabulary (errors name `source`).
  BpeTokenizer(std::unordered_map<std::string, int64_t> vocab,
               std::vector<std::pair<std::string, std::string>> merges, BpeConfig cfg = {},
               std::string source = "BPE vocabulary");
  // vocab.json ({"token": id}) and merges.txt (one "a b" per line, optional "#version" first line).
  static std::shared_ptr<BpeTokenizer> from_files(const std::string& vocab_json,
                                                  const std::string& merges_txt,
                                                  BpeConfig cfg = {});
  // tokenizer.json with model.type "BPE" (merges as "a b" strings or [a, b] pairs), its normalizer,
  // pre-tokenizer and decoder as hf_pipeline.h lists, added_tokens and post_processor; what is not
  // supported is an error naming the file and JSON path.
  static std::shared_ptr<BpeTokenizer> from_tokenizer_json(const std::string& path);
  static std::shared_ptr<BpeTokenizer> from_tokenizer_json(const nlohmann::json& j,
                                                           const std::string& path);

  // The pieces of GPT-2's pre-tokenization pattern, as UTF-8 substrings of `text`.
  static std::vector<std::string> pre_tokenize(const std::string& text);
  // GPT-2's bytes_to_unicode: byte -> code point.
  static char32_t byte_to_unicode(uint8_t b);
  // The byte-level token strings of a text (no special tokens).
  std::vector<std::string> tokenize(const std::string& text) const;

  // As tokenizers' decode(ids, skip_special_tokens=False): added tokens' content, the decoder.
  std::string decode(const std::vector<int64_t>& ids) const override;
  // Byte-level tokens' raw bytes; SentencePiece-style tokens with "▁" as ' ' and <0xXX> as the
  // byte; added tokens' content.
  std::string token_bytes(int64_t id) const override;
  // Ids 0 .. vocab_size-1: the model's vocabulary and the added tokens.
  int64_t vocab_size() const override { return (int64_t)id_to_token_.size(); }
  int64_t model_vocab_entries() const override { return (int64_t)vocab_.size(); }
  std::optional<int64_t> token_id(const std::string& token) const override;
  std::string kind() const override { return "bpe"; }
  bool uses_token_type_ids() const override { return false; }
  int64_t num_merges() const { return (int64_t)merge_rank_.size(); }

 protected:
  std::vector<int64_t> encode_plain(const std::string& text) const override;
  std::string normalize_text(const std::string& text) const override;
  std::vector<int64_t> encode_segment(const std::string& normalized, bool at_start) const override;

 private:
  // BPE over one pre-tokenized piece (raw bytes) -> ids; cached.
  void encode_piece(const std::string& piece, std::vector<int64_t>& ids) const;
  std::vector<int64_t> bpe(const std::string& piece) const;
  // GPT-2's byte-level token string -> its bytes (other code points as UTF-8).
  static void append_byte_level(const std::string& token, std::string& out);
  // BPE merges over symbol ids.
  std::vector<int64_t> merge(std::vector<int32_t> id) const;
  // tokenizer.json's model over one pre-tokenized piece (characters, not bytes); cached.
  void encode_word(const std::string& piece, std::vector<int64_t>& ids) const;
  // The word cache both share: appends a cached piece's ids and returns true, else false; and
  // appends `out` while caching it for `piece` (the cache is cleared when full).
  bool cached(const std::string& piece, std::vector<int64_t>& ids) const;
  void cache_and_append(const std::string& piece, std::vector<int64_t> out,
                        std::vector<int64_t>& ids) const;

  // tokenizer.json's normalizer, pre-tokenizer and decoder (null: GPT-2's, from vocab.json)
  std::shared_ptr<const hf::Pipeline> pipe_;
  bool byte_fallback_ = false, fuse_unk_ = false, ignore_merges_ = false;
  int64_t unk_id_ = -1;
  int64_t fallback_id_[256];  // id of <0xXX>, or -1
  // model.end_of_word_suffix (CLIP's "</w>"): joined to each word's last character before the
  // merges; decode turns it back into spaces, as transformers' CLIPTokenizer.decode does
  std::string suffix_;

  BpeConfig cfg_;
  std::unordered_map<std::string, int64_t> vocab_;
  std::vector<std::string> id_to_token_;
  int64_t byte_id_[256];  // id of each single byte's token
  // (left id << 32 | right id) -> (rank, merged id)
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merge_rank_;
  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<int64_t>> cache_;
};

}  // namespace onyx::tokenizers
