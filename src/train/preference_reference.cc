// train/preference_reference.cc — Trainer::precompute_reference_logps: DPO's reference
// log-probabilities, computed once from the starting weights (TRL's precompute_ref_log_probs; the
// same numbers as its frozen reference copy, or its LoRA base with adapters off, each step: the
// reference never changes, and dropout is off in both) — or from a reference model's weights
// (TRL's ref_model), loaded into the session for that pass and the policy's put back after.
#include <cstring>
#include <set>

#include "data/preference_dataset.h"
#include "models/hf_weights.h"
#include "models/preference_head.h"
#include "onyx/trainer.h"
#include "train/trainer_internal.h"

namespace onyx {

namespace {

// A reference model's weights by the policy graph's names (the same builder, so the same
// names): its trainable ones for TrainingSession::load_weights; a frozen weight that differs
// from the policy's is an error (the session holds those as constants).
std::map<std::string, Tensor> reference_weights(const std::string& dir, const ir::Graph& policy,
                                                const std::set<std::string>& trainable) {
  models::BuiltModel ref = models::load_hf_folder(dir);
  const std::string what = cat("ref_model '", dir, "'");
  std::map<std::string, Tensor> out;
  for (auto& [name, t] : policy.initializers) {
    if (!is_float(t.dtype())) continue;
    auto it = ref.model.graph->initializers.find(name);
    ONYX_CHECK(it != ref.model.graph->initializers.end() && it->second.meta() == t.meta(), what,
               " has no weight '", name, "' of shape ", shape_str(t.shape()),
               ": the reference must be the policy's architecture");
    if (trainable.count(name)) {
      out[name] = it->second;
    } else {
      ONYX_CHECK(std::memcmp(it->second.raw(), t.raw(), t.nbytes()) == 0, what, ": frozen weight '",
                 name,
                 "' differs from the policy's; a reference may differ in trained weights only");
    }
  }
  return out;
}

}  // namespace

void Trainer::precompute_reference_logps() {
  std::vector<float> policy;  // the policy's parameters while the reference model's are in
  bool first = true;
  for (data::Dataset* ds : {train_ds_.get(), eval_ds_.get()}) {
    auto* pairs = dynamic_cast<data::PreferenceDataset*>(ds);
    if (!pairs || pairs->has_reference_logps()) continue;
    if (first && !model_.reference_model.empty()) {
      const Tensor& p = std::as_const(*impl_->ts).params().flat();
      policy.assign(p.data<float>(), p.data<float>() + p.numel());
      const auto& names = impl_->ts->parameters();
      impl_->ts->load_weights(reference_weights(model_.reference_model, *model_.graph,
                                                std::set<std::string>(names.begin(), names.end())),
                              cat("ref_model '", model_.reference_model, "'"));
    }
    first = false;
    const int64_t bs = model_.reference_batch_size > 0 ? model_.reference_batch_size
                       : ds == train_ds_.get()         ? args_.per_device_train_batch_size
                                                       : args_.per_device_eval_batch_size;
    std::vector<float> chosen, rejected;
    for (int64_t i = 0; i < pairs->size(); i += bs) {
      std::vector<int64_t> idx;
      for (int64_t j = i; j < std::min(i + bs, pairs->size()); j++) idx.push_back(j);
      auto out = impl_->ts->forward(load_batch(*pairs, idx));
      for (auto [name, into] : {std::pair{models::kChosenLogps, &chosen},
                                std::pair{models::kRejectedLogps, &rejected}}) {
        auto it = out.find(name);
        ONYX_CHECK(it != out.end(), "preference data: the model has no '", name,
                   "' output (train it with trainer: dpo)");
        const Tensor& t = it->second;
        for (int64_t k = 0; k < t.numel(); k++) into->push_back((float)t.get_as_double(k));
      }
    }
    pairs->set_reference_logps(std::move(chosen), std::move(rejected));
  }
  if (!policy.empty())
    std::memcpy(impl_->ts->params().flat().data<float>(), policy.data(),
                policy.size() * sizeof(float));
}

}  // namespace onyx
