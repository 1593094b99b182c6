// train/grpo.h — GRPO's rollouts as TRL 1.16's GRPOTrainer makes them (_generate_and_score_
// completions, RepeatSampler, _prepare_inputs), as the Trainer's training dataset:
//   generation batch  per_device_train_batch_size × gradient_accumulation_steps × world rows (TRL's
//             generation_batch_size with steps_per_generation = gradient_accumulation_steps):
//             generation_batch / num_generations prompts, each num_generations times in a row;
//             an epoch walks the prompts in order (shuffle_dataset: a seeded permutation per
//             epoch, not torch's), whole batches only, and each batch trains num_iterations
//             optimizer steps before the next one is sampled
//   rows      each rank samples the completions of the micro-batches it trains (Trainer's slots
//             k = j · world + rank), from the current weights; the rewards of all rows are
//             gathered, so every group is normalized whole
//   rewards   each reward function's value per completion (NaN: TRL's None), weighted and summed
//             (sum_then_normalize) or normalized per function first (normalize_then_sum); the
//             advantage is the reward less its group's mean, divided by the group's (scale_rewards
//             group) or the batch's (batch) standard deviation + 1e-4, or not (none); a row every
//             function left unscored gets advantage 0
//   batches   a row is its prompt left-padded and its completion right-padded to the longest of
//             the rank's generation batch (as TRL pads them), with labels on the completion
//             tokens, its advantage, and the old policy's (num_iterations > 1) and the reference's
//             (beta ≠ 0) per-token log-probabilities computed when the batch was sampled
//   metrics   TRL's, once per generation batch: reward, reward_std, rewards/NAME/mean and /std,
//             frac_reward_zero_std, completions/mean_length, min_length, max_length,
//             clipped_ratio, mean_terminated_length, min_terminated_length,
//             max_terminated_length; num_tokens (prompt and completion tokens seen so far)
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/prompt_dataset.h"
#include "models/grpo_head.h"

namespace onyx::train {

// What a reward function scores: completion c (of `completions`) answers prompt row
// prompt_rows[c] of the dataset.
struct RewardBatch {
  const data::PromptDataset* prompts = nullptr;
  std::vector<int64_t> prompt_rows;
  std::vector<std::string> completions;  // decoded without special tokens
  std::vector<std::vector<int64_t>> completion_ids;
  int64_t global_step = 0;
  // values a function logs (TRL's log_metric): each name's mean is logged once per batch
  std::map<std::string, std::vector<double>>* logged = nullptr;
};

class RewardFunction {
 public:
  virtual ~RewardFunction() = default;
  virtual std::string name() const = 0;  // rewards/NAME/mean
  // One value per completion; NaN where the function does not score it (TRL's None).
  virtual std::vector<double> score(const RewardBatch& batch) = 0;
};

// The CLI's reward functions, from a config's `reward_funcs` entry (`what` names it in errors):
//   {type: exact_match, column: C}  1 when the completion, stripped of surrounding white space,
//                                   equals the row's column C (stripped; numbers as their text)
//   {type: regex, pattern: P}       1 when P matches the completion from its start (Python's
//                                   re.match; DOTALL with dotall: true), ICU's syntax
//   {type: length, target: N}       −|completion tokens − N| / N (a shaping example)
//   {type: python, function: "module.function", python: python3, timeout: 600}
//                                   a Python function with TRL's signature, its module found in
//                                   `dir` (the config's folder) or on the interpreter's path,
//                                   called in a worker process (train/python_reward.cc)
// An optional `name` names it in the metrics (default: the type; python: the function's name).
std::shared_ptr<RewardFunction> builtin_reward(const nlohmann::json& spec, const std::string& what,
                                               const std::string& dir = ".");
std::shared_ptr<RewardFunction> python_reward(const nlohmann::json& spec, const std::string& dir,
                                              const std::string& what);
// The `regex` reward (train/regex_reward.cc; an error in a build without ICU).
std::shared_ptr<RewardFunction> regex_reward(const std::string& name, const std::string& pattern,
                                             bool dotall, const std::string& what);

// One sampled sequence: the prompt's ids and the completion's.
struct Rollout {
  std::vector<int64_t> prompt_ids, completion_ids;
};
// Rollouts supplied from outside instead of onyx's generator (TRL's rollout_func, which also
// decides the prompt's ids): one per prompt row, in order.
using RolloutFunction =
    std::function<std::vector<Rollout>(const std::vector<int64_t>& prompt_rows)>;

struct GrpoOptions {
  models::GrpoLoss loss;
  int64_t num_generations = 8;
  int64_t num_iterations = 1;
  int64_t max_completion_length = 512;
  double temperature = 1.0, top_p = 1.0, repetition_penalty = 1.0;
  int64_t top_k = 0;
  std::string scale_rewards = "group";                             // group, batch, none
  std::string multi_objective_aggregation = "sum_then_normalize";  // or normalize_then_sum
  std::vector<double> reward_weights;                              // empty: 1 each
  bool mask_truncated_completions = false;
  bool shuffle_dataset = true;
  std::vector<nlohmann::json> reward_specs;  // the config's reward_funcs (builtin_reward)
  std::string reward_dir = ".";              // where their Python modules are (the config's)
  // GRPOConfig's steps_per_generation / generation_batch_size when given (0: not): onyx's are
  // gradient_accumulation_steps and the rows of one optimizer step, and others are an error
  int64_t steps_per_generation = 0, generation_batch_size = 0;
};
// Throws naming the key for a value out of its range.
void check_grpo_options(const GrpoOptions& o);

// The advantages of a generation batch from its rewards (rows × functions, NaN: unscored), and
// the reward metrics (reward, reward_std, frac_reward_zero_std; per function by name).
struct Advantages {
  std::vector<double> advantage;
  std::map<std::string, double> metrics;
};
Advantages group_advantages(const std::vector<std::vector<double>>& rewards,
                            const std::vector<std::string>& names, const GrpoOptions& o);

// One completion of the rank's part of a generation batch.
struct Completion {
  int64_t prompt_row = 0;
  std::vector<int64_t> prompt_ids, ids;
  bool truncated = false;  // it did not end with an eos (or pad) token
};

class GrpoRollouts : public data::Dataset {
 public:
  GrpoRollouts(std::shared_ptr<const data::PromptDataset> prompts, GrpoOptions opts);
  void add_reward(std::shared_ptr<RewardFunction> f) { rewards_.push_back(std::move(f)); }
  void set_rollout_function(RolloutFunction f) { rollout_fn_ = std::move(f); }
  const RolloutFunction& rollout_function() const { return rollout_fn_; }
  const std::vector<std::shared_ptr<RewardFunction>>& rewards() const { return rewards_; }
  const GrpoOptions& options() const { return opts_; }
  const data::PromptDataset& prompts() const { return *prompts_; }

  // The shape of a generation batch (the Trainer's, before training): sets size().
  void plan(int64_t batch_size, int64_t accumulation, int64_t world, int64_t rank);
  int64_t generation_rows() const { return bs_ * ga_ * world_; }
  // Prompt rows of generation batch `chunk` of `epoch` (each num_generations times).
  std::vector<int64_t> chunk_prompts(int64_t epoch, int64_t chunk, uint64_t seed) const;
  // The global generation-batch rows this rank trains (its micro-batch slots), in order.
  std::vector<int64_t> my_rows() const;

  // The rank's rows once sampled and scored: the padded batch tensors of every row.
  void set_buffer(const std::vector<Completion>& rows, const std::vector<double>& advantages,
                  int64_t pad_id, int64_t tag);
  void set_logps(const char* name, Tensor logps);  // old_logps / ref_logps, (rows, T−1)
  int64_t buffer_tag() const { return tag_; }  // which (epoch, chunk) the buffer holds; -1: none
  void clear_buffer() { tag_ = -1; }
  // Rows [begin, end) of the buffer as a batch (the old-policy and reference passes).
  std::map<std::string, Tensor> buffer_rows(int64_t begin, int64_t end) const;
  int64_t buffer_size() const { return buffer_.empty() ? 0 : buffer_.at("input_ids").dim(0); }

  // Dataset: an epoch's virtual rows (steps × generation batch), read from the buffer.
  int64_t size() const override;
  std::map<std::string, Tensor> batch(const std::vector<int64_t>& indices) const override;
  std::vector<std::string> keys() const override;

 private:
  std::shared_ptr<const data::PromptDataset> prompts_;
  GrpoOptions opts_;
  std::vector<std::shared_ptr<RewardFunction>> rewards_;
  RolloutFunction rollout_fn_;
  int64_t bs_ = 1, ga_ = 1, world_ = 1, rank_ = 0;
  std::map<std::string, Tensor> buffer_;
  int64_t tag_ = -1;
};

}  // namespace onyx::train
