// data/prompt_dataset.h — the prompts of GRPO in TRL 1.16's formats (GRPOTrainer's
// _tokenize_prompts), tokenized once at load:
//   rows      a "prompt" as a string (standard) or a list of messages (conversational), and any
//             other columns, which reach the reward functions as they are (TRL's reward kwargs)
//   standard  the prompt tokenized with the tokenizer's post-processor (processing_class(text=))
//   conversational  the prompt rendered with add_generation_prompt (a row's "tools" /
//             "chat_template_kwargs" reach the template) and tokenized without special tokens,
//             as apply_chat_template(tokenize=True) does
// Not a batch source itself: train/grpo.h's rollouts sample completions for these prompts.
#pragma once
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tokenizers/tokenizer.h"

namespace onyx::data {

struct PromptOptions {
  std::string format;         // as TextClassificationOptions::format (jsonl, json, csv, tsv)
  std::string chat_template;  // Jinja source; empty: conversational rows are an error
  std::string chat_template_origin;
  std::map<std::string, std::string> special_tokens;  // bos_token, eos_token, ... (template vars)
};

class PromptDataset {
 public:
  PromptDataset(const std::string& path, std::shared_ptr<const tokenizers::Tokenizer> tokenizer,
                PromptOptions opts = {});
  int64_t size() const { return (int64_t)ids_.size(); }
  const std::vector<int64_t>& prompt_ids(int64_t i) const { return ids_.at(i); }
  // The row as read (its "prompt" and the other columns) and whether its prompt is messages.
  const nlohmann::json& row(int64_t i) const { return rows_.at(i); }
  bool conversational(int64_t i) const { return conversational_.at(i) != 0; }
  const tokenizers::Tokenizer& tokenizer() const { return *tok_; }
  const std::string& path() const { return path_; }
  int64_t line(int64_t i) const { return lines_.at(i); }

 private:
  std::string path_;
  std::shared_ptr<const tokenizers::Tokenizer> tok_;
  std::vector<std::vector<int64_t>> ids_;
  std::vector<nlohmann::json> rows_;
  std::vector<char> conversational_;
  std::vector<int64_t> lines_;
};

}  // namespace onyx::data
