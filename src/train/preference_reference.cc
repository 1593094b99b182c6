// train/preference_reference.cc — Trainer::precompute_reference_logps: DPO's reference
// log-probabilities, computed once from the starting weights (TRL's precompute_ref_log_probs; the
// same numbers as its frozen reference copy, or its LoRA base with adapters off, each step: the
// reference never changes, and dropout is off in both).
#include "data/preference_dataset.h"
#include "models/preference_head.h"
#include "onyx/trainer.h"
#include "train/trainer_internal.h"

namespace onyx {

void Trainer::precompute_reference_logps() {
  for (data::Dataset* ds : {train_ds_.get(), eval_ds_.get()}) {
    auto* pairs = dynamic_cast<data::PreferenceDataset*>(ds);
    if (!pairs || pairs->has_reference_logps()) continue;
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
}

}  // namespace onyx
