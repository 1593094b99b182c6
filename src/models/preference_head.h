// models/preference_head.h — a causal LM's token cross-entropy head replaced by TRL 1.16's DPO loss
// (DPOTrainer._compute_loss, f_divergence_type reverse_kl, no WPO weighting, no ld_alpha):
//   inputs   input_ids / attention_mask / labels (2B, T): the B prompt + chosen rows first, then
//            the B prompt + rejected rows (data/preference_dataset.h; labels -100 off the
//            completion), ref_chosen_logps / ref_rejected_logps (B): the reference model's
//   logps    per token onyx.LinearLogProbs of the shifted rows (the fused LM head: no tokens ×
//            vocabulary logits), summed per row: chosen_logps, rejected_logps (B)
//   loss     Σ_k loss_weights[k] · mean over pairs of loss_type[k]'s per-pair loss, with
//            chosen / rejected log-ratios cl = chosen − ref_chosen, rl = rejected − ref_rejected
//            and Δ = cl − rl: sigmoid −logσ(βΔ); hinge relu(1 − βΔ); ipo ((cl/n_c − rl/n_r) −
//            1/(2β))² (n: completion tokens); exo_pair, nca_pair, robust, bco_pair, sppo_hard,
//            apo_zero, apo_down, discopop, sft (the chosen tokens' mean negative log-probability)
//            and sigmoid_norm as TRL writes them (label_smoothing, discopop_tau)
//   metrics  scalar outputs under TRL's names (Model::logged_outputs, averaged over the
//            micro-batches since the last log as TRL averages its _metrics): rewards/chosen,
//            rewards/rejected, rewards/accuracies, rewards/margins, logps/chosen, logps/rejected,
//            logits/chosen, logits/rejected (mean logit over the completion tokens),
//            mean_token_accuracy (top-1 on the chosen completions), entropy
//   outputs  "loss" first, the metrics, then "chosen_logps" / "rejected_logps" (B): what the
//            reference pass reads (the reference is the starting policy: TRL's frozen copy, or
//            the LoRA base with adapters off, which is the same model while B = 0, or
//            precompute_ref_log_probs)
#pragma once
#include <string>
#include <vector>

#include "onyx/trainer.h"

namespace onyx::models {

struct PreferenceLoss {
  double beta = 0.1;
  std::vector<std::string> loss_type = {"sigmoid"};
  std::vector<double> loss_weights;  // empty: 1 for each loss_type
  double label_smoothing = 0.0;
  double discopop_tau = 0.05;
  // DPOConfig.disable_dropout: the model's Dropout nodes become identities (TRL turns dropout off
  // in the policy and the reference)
  bool disable_dropout = true;
};

// The loss types onyx builds (TRL 1.16's, less aot and aot_unpaired, which sort the batch).
const std::vector<std::string>& preference_loss_types();
// Throws naming the key for an unknown loss type, weights of another length, beta <= 0, or a
// label_smoothing out of its range.
void check_preference_loss(const PreferenceLoss& cfg);

// Turns `m` (a causal LM built by build_hf_model: "logits" = MatMul(h, Transpose(table)), then
// the shifted token cross-entropy "loss") into the DPO model above, in place.
void to_preference_model(Model& m, const PreferenceLoss& cfg);

// The graph outputs the reference pass reads.
inline const char* kChosenLogps = "chosen_logps";
inline const char* kRejectedLogps = "rejected_logps";

}  // namespace onyx::models
