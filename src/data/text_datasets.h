// data/text_datasets.h — text datasets read straight from files and tokenized in C++:
//   TextClassificationDataset  JSONL / JSON / CSV / TSV rows -> input_ids, attention_mask,
//                              (token_type_ids), labels; batches padded to a few bucket lengths
//   CausalLMDataset            a text file -> one token stream (eos between documents) -> blocks
// Both tokenize once at construction; batch() only gathers and pads.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "tokenizers/tokenizer.h"

namespace onyx::data {

// One CSV record and the line it starts on (for messages).
struct CsvRecord {
  int64_t line = 0;
  std::vector<std::string> fields;
};
// RFC 4180: fields separated by `delim`; a field in double quotes may hold delimiters, line breaks
// and doubled quotes (""); CRLF or LF line ends; a UTF-8 byte-order mark is skipped. Errors (an
// unterminated quote, text after a closing quote) name `what` and the line.
std::vector<CsvRecord> parse_csv(const std::string& text, char delim, const std::string& what);

enum class PadBucket {
  Multiple,    // round the longest sequence up to a multiple of pad_multiple
  PowerOfTwo,  // round up to the next power of two
};

struct TextClassificationOptions {
  std::string format;  // "jsonl", "json", "csv", "tsv"; empty: from the file extension
  std::string text_field = "text";
  std::string text_pair_field;        // empty: one text per sample
  std::string label_field = "label";  // empty: no labels (for prediction)
  // String labels map to their index here. Empty: integer labels are used as they are (a CSV label
  // column whose every value is an integer counts as integers), other labels map to their index in
  // the sorted unique labels of the file.
  std::vector<std::string> label_list;
  int64_t max_length = 128;  // truncation (longest_first), special tokens included
  PadBucket bucket = PadBucket::Multiple;
  int64_t pad_multiple = 16;
  char delimiter = 0;  // CSV/TSV; 0: ',' for csv, '\t' for tsv
};

class TextClassificationDataset : public Dataset {
 public:
  TextClassificationDataset(const std::string& path,
                            std::shared_ptr<const tokenizers::Tokenizer> tokenizer,
                            TextClassificationOptions opts = {});
  int64_t size() const override { return (int64_t)encodings_.size(); }
  // input_ids, attention_mask, token_type_ids (if the tokenizer uses them): int64 (B, L), L the
  // longest in the batch rounded up to the bucket (at most max_length); labels: int64 (B).
  std::map<std::string, Tensor> batch(const std::vector<int64_t>& indices) const override;
  std::vector<std::string> keys() const override;
  std::vector<int64_t> lengths(const std::string&) const override;  // the unpadded tokens

  const std::map<std::string, int64_t>& label2id() const { return label2id_; }
  const std::vector<std::string>& id2label() const { return id2label_; }
  int64_t num_labels() const { return (int64_t)id2label_.size(); }
  const tokenizers::Encoding& encoding(int64_t i) const { return encodings_.at(i); }  // unpadded
  int64_t label(int64_t i) const { return labels_.at(i); }
  int64_t bucket_length(int64_t longest) const;

 private:
  std::shared_ptr<const tokenizers::Tokenizer> tok_;
  TextClassificationOptions opts_;
  std::vector<tokenizers::Encoding> encodings_;
  std::vector<int64_t> labels_;
  std::map<std::string, int64_t> label2id_;
  std::vector<std::string> id2label_;
};

struct CausalLMOptions {
  int64_t block_size = 128;
  bool paragraphs = false;  // documents are blank-line separated paragraphs, not lines
  // Each document is tokenized as run_clm.py's tokenizer(text) does (the tokenizer.json
  // post-processor applied: a Llama-2 template's <s> starts every document), then the eos token
  // follows it (onyx's default; run_clm.py adds none: add_eos false).
  bool add_eos = true;
  bool drop_remainder = true;  // false: the last short block is padded (mask 0, labels -100)
};

class CausalLMDataset : public Dataset {
 public:
  CausalLMDataset(const std::string& path, std::shared_ptr<const tokenizers::Tokenizer> tokenizer,
                  CausalLMOptions opts = {});
  int64_t size() const override { return num_blocks_; }
  // input_ids, attention_mask, labels: int64 (B, block_size); labels = input_ids (the model
  // shifts).
  std::map<std::string, Tensor> batch(const std::vector<int64_t>& indices) const override;
  std::vector<std::string> keys() const override {
    return {"attention_mask", "input_ids", "labels"};
  }
  std::vector<int64_t> lengths(const std::string&) const override;  // the block's tokens
  const std::vector<int64_t>& tokens() const { return tokens_; }

 private:
  std::shared_ptr<const tokenizers::Tokenizer> tok_;
  CausalLMOptions opts_;
  std::vector<int64_t> tokens_;
  int64_t num_blocks_ = 0;
};

// Supervised fine-tuning data in TRL's dataset formats: JSONL / JSON / CSV rows with "text"
// (language modeling: every token carries loss) or "prompt" and "completion" (only the completion
// tokens carry loss when completion_only_loss, TRL's default). As TRL tokenizes them: prompt +
// completion as one text, the prompt's own token count marking where the completion starts, the
// tokenizer's end-of-text token appended, truncated to max_length; a row left with no token that
// carries loss is dropped (unless packing), as TRL drops it. Batches are right-padded to the
// longest row rounded up to pad_multiple (labels -100, attention_mask 0 there).
// Conversational rows (TRL 1.16's SFTTrainer): "messages" (or "conversations" of {from, value})
// rendered with the chat template, every token carrying loss, or only the assistant turns' tokens
// with assistant_only_loss (the tokens overlapping the template's {% generation %} spans, as
// Transformers' return_assistant_tokens_mask); "prompt" and "completion" as message lists: the
// prompt rendered with add_generation_prompt, then prompt + completion, the completion starting
// where their token ids first differ. No end-of-text token is appended (the template writes its
// own). A row's "tools" and "chat_template_kwargs" reach the template as TRL passes them.
struct SftOptions {
  std::string format;  // as TextClassificationOptions::format
  int64_t max_length = 1024;
  bool completion_only_loss = true;
  // Plain-text rows ('text', or 'prompt' + 'completion' strings) end with the end-of-sequence
  // token as TRL 1.16's SFTTrainer appends it: the text `eos_token` (SFTConfig.eos_token), else
  // the tokenizer's (tokenizer_config.json's eos_token, special_tokens below), unless the text ends
  // with it already. Those rows are tokenized with the tokenizer.json post-processor (a
  // TemplateProcessing's BOS, ...), as TRL's processing_class(text=...) does; the completion starts
  // where the ids of prompt alone and of prompt + completion first differ.
  bool add_eos = true;
  std::string eos_token;
  int64_t pad_multiple = 16;
  // Pack consecutive samples into rows of at most max_length tokens (first fit, in file order, no
  // sample split): position_ids restart at 0 for each sample, so the model's masks keep packed
  // samples from seeing each other (the Llama family reads sample boundaries from them, as
  // Transformers does), and each sample's first token is no target of the previous one.
  bool packing = false;
  // Conversational rows are rendered with this chat template (Jinja source, chat_template.h);
  // empty: such rows are an error. special_tokens (bos_token, eos_token, ...) are its variables.
  std::string chat_template;
  std::string chat_template_origin;  // where it came from, for messages
  std::map<std::string, std::string> special_tokens;
  // Loss only on the assistant turns of conversational rows; the template must mark them with
  // {% generation %} ... {% endgeneration %}.
  bool assistant_only_loss = false;
};

class SftDataset : public Dataset {
 public:
  SftDataset(const std::string& path, std::shared_ptr<const tokenizers::Tokenizer> tokenizer,
             SftOptions opts = {});
  int64_t size() const override { return (int64_t)ids_.size(); }
  // input_ids, attention_mask, labels (and position_ids when packing): int64 (B, L)
  std::map<std::string, Tensor> batch(const std::vector<int64_t>& indices) const override;
  std::vector<std::string> keys() const override {
    if (opts_.packing) return {"attention_mask", "input_ids", "labels", "position_ids"};
    return {"attention_mask", "input_ids", "labels"};
  }
  std::vector<int64_t> lengths(const std::string&) const override;  // each row's tokens
  const std::vector<int64_t>& positions(int64_t i) const { return pos_.at(i); }
  const std::vector<int64_t>& ids(int64_t i) const { return ids_.at(i); }
  const std::vector<int64_t>& labels(int64_t i) const { return labels_.at(i); }

 private:
  std::string sft_eos_text(const std::string& path, int64_t line) const;
  void pack_rows();  // opts_.packing: the rows joined into rows of at most max_length
  std::shared_ptr<const tokenizers::Tokenizer> tok_;
  SftOptions opts_;
  std::vector<std::vector<int64_t>> ids_, labels_, pos_;
};

}  // namespace onyx::data
