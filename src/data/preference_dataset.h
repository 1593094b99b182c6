// data/preference_dataset.h — preference pairs for DPO in TRL 1.16's formats (DPOTrainer's
// _prepare_dataset and DataCollatorForPreference), tokenized once at load:
//   rows      "prompt", "chosen", "rejected" as strings (standard) or message lists
//             (conversational); rows without "prompt" have it extracted as TRL's extract_prompt
//             does (the longest common prefix of chosen and rejected: characters, less a space
//             before the split, or whole messages); "conversations" rows are not preference data
//   standard  chosen and rejected end with the tokenizer's eos_token (appended unless there);
//             prompt, prompt + chosen and prompt + rejected tokenized with the tokenizer's
//             post-processor (as processing_class(text=...))
//   conversational  the prompt rendered with add_generation_prompt, prompt + chosen and
//             prompt + rejected without it (a row's "tools" / "chat_template_kwargs" reach the
//             template), tokenized without special tokens, as apply_chat_template does
//   split     the completions start where the prompt's ids and each sequence's first differ (the
//             shorter of the two common prefixes; TRL warns once when the prompt is not a prefix)
//   max_length  keep_start: a pair whose prompt alone reaches max_length is dropped (no token
//             would carry loss); each sequence is cut to max_length when batched (keep_end: its
//             last max_length tokens)
// A batch of B pairs is 2B rows, the B prompt + chosen sequences first, then the B prompt +
// rejected ones, right-padded (pad token, attention_mask 0) to the longest rounded up to
// pad_multiple; labels hold each completion token's id and -100 on the prompt and padding (TRL's
// completion_mask). With reference log-probabilities set (DPOConfig.precompute_ref_log_probs),
// ref_chosen_logps and ref_rejected_logps (float32, B) come with each batch.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "tokenizers/tokenizer.h"

namespace onyx::data {

struct PreferenceOptions {
  std::string format;                          // as TextClassificationOptions::format
  int64_t max_length = 1024;                   // DPOConfig.max_length; 0: no truncation
  std::string truncation_mode = "keep_start";  // or "keep_end"
  // DPOConfig.pad_to_multiple_of (TRL pads to the longest, 1, off Neuron); onyx's plans compile
  // once per input shape, so a coarser multiple means fewer plans
  int64_t pad_multiple = 1;
  std::string chat_template;  // Jinja source; empty: conversational rows are an error
  std::string chat_template_origin;
  std::map<std::string, std::string> special_tokens;  // bos_token, eos_token, ... (template vars)
};

class PreferenceDataset : public Dataset {
 public:
  PreferenceDataset(const std::string& path, std::shared_ptr<const tokenizers::Tokenizer> tokenizer,
                    PreferenceOptions opts = {});
  int64_t size() const override { return (int64_t)prompt_.size(); }
  // input_ids, attention_mask, labels: int64 (2B, L); ref_chosen_logps, ref_rejected_logps:
  // float32 (B) once set_reference_logps has run
  std::map<std::string, Tensor> batch(const std::vector<int64_t>& indices) const override;
  std::vector<std::string> keys() const override;
  // the longer of the pair's two sequences, as batched (truncated)
  std::vector<int64_t> lengths(const std::string&) const override;

  const std::vector<int64_t>& prompt_ids(int64_t i) const { return prompt_.at(i); }
  const std::vector<int64_t>& chosen_ids(int64_t i) const { return chosen_.at(i); }
  const std::vector<int64_t>& rejected_ids(int64_t i) const { return rejected_.at(i); }
  // Pair i's prompt + chosen (or + rejected) ids as batched, cut to max_length; labels (when
  // asked) the completion tokens' ids and -100 on the prompt.
  std::vector<int64_t> sequence(int64_t i, bool chosen, std::vector<int64_t>* labels) const;
  // The reference model's summed completion log-probabilities of each pair (one per row).
  void set_reference_logps(std::vector<float> chosen, std::vector<float> rejected);
  bool has_reference_logps() const { return !ref_chosen_.empty(); }

 private:
  std::shared_ptr<const tokenizers::Tokenizer> tok_;
  PreferenceOptions opts_;
  std::vector<std::vector<int64_t>> prompt_, chosen_, rejected_;
  std::vector<float> ref_chosen_, ref_rejected_;
};

}  // namespace onyx::data
