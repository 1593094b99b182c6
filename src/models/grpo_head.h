// models/grpo_head.h — a causal LM's token cross-entropy head replaced by TRL 1.16's GRPO loss
// (GRPOTrainer._compute_loss, importance_sampling_level "token", no entropy mask, no vLLM
// correction):
//   inputs   input_ids / attention_mask (B, T): a prompt left-padded and its completion
//            right-padded, as TRL concatenates prompt_ids and completion_ids; labels (B, T): the
//            completion tokens' ids, -100 on the prompt and the padding (TRL's completion_mask);
//            advantages (B); old_logps (B, T−1) when the rollout's log-probabilities come with
//            the batches (num_iterations > 1), else the current ones with no gradient (TRL's
//            per_token_logps.detach()); ref_logps (B, T−1) when beta ≠ 0
//   logps    onyx.LinearLogProbs of the shifted rows with the logits divided by temperature (TRL's
//            fused LM head): per-token log-probabilities and entropies, 0 off the completions
//   loss     per token, with r = exp(logp − old) and A the row's advantage:
//            −min(r·A, clip(r, 1−epsilon, 1+epsilon_high)·A) + beta·kl, kl = exp(ref − logp) −
//            (ref − logp) − 1 (times r with use_bias_correction_kl); then by loss_type: grpo the
//            mean over rows of each row's token mean; bnpo and dapo the token mean of the
//            micro-batch (dapo's micro-batches weighed by their completion tokens, as TRL divides
//            by the generation batch's token count); dr_grpo the token sum over
//            B · max_completion_length
//   metrics  scalar outputs under TRL's names (Model::logged_outputs): entropy, kl (beta ≠ 0),
//            clip_ratio/low_mean, clip_ratio/low_min, clip_ratio/high_mean, clip_ratio/high_max,
//            clip_ratio/region_mean
//   outputs  "loss" first, the metrics, then "token_logps" (B, T−1): what the rollout's
//            old-policy and reference passes read
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "onyx/trainer.h"

namespace onyx::models {

struct GrpoLoss {
  std::string loss_type = "dapo";  // grpo, bnpo, dr_grpo, dapo (GRPOConfig's default)
  double beta = 0.0;
  double epsilon = 0.2;                 // the lower clip
  double epsilon_high = 0.2;            // GRPOConfig's None: epsilon
  double temperature = 1.0;             // the logits are divided by it (as the sampling was)
  int64_t max_completion_length = 512;  // dr_grpo's constant normalizer
  bool old_logps_input = false;         // num_iterations > 1
  bool use_bias_correction_kl = true;
  bool disable_dropout = false;
};

const std::vector<std::string>& grpo_loss_types();
// Throws naming the key for an unknown loss type or a value out of its range.
void check_grpo_loss(const GrpoLoss& cfg);

// Turns `m` (a causal LM built by build_hf_model) into the GRPO model above, in place.
void to_grpo_model(Model& m, const GrpoLoss& cfg);

inline const char* kTokenLogps = "token_logps";

}  // namespace onyx::models
