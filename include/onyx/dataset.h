// onyx/dataset.h — what the Trainer reads samples from: a Dataset yields a batch as named tensors
// (graph input names, labels included) for a list of sample indices. The datasets onyx provides
// (safetensors files, IDX, text) and the batch order are in data/dataset.h.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "onyx/tensor.h"

namespace onyx::data {

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  virtual std::map<std::string, Tensor> batch(const std::vector<int64_t>& indices) const = 0;
  virtual std::vector<std::string> keys() const = 0;
  // Each sample's length in tokens, for train_sampling_strategy group_by_length: the
  // `length_column` when the dataset has one, else Transformers' len(feature["input_ids"]).
  // Empty: the dataset cannot tell (group_by_length is then an error naming it).
  virtual std::vector<int64_t> lengths(const std::string& length_column) const {
    (void)length_column;
    return {};
  }
  // Called by the Trainer before each training epoch's batches (and on resuming inside one) with
  // the epoch and the run's data seed: a dataset with random augmentations (an image folder's
  // random crop and flip) draws them keyed on both, so each epoch differs and a resumed run
  // repeats the uninterrupted one. Datasets without randomness ignore it.
  virtual void set_epoch(int64_t epoch, uint64_t seed) {
    (void)epoch;
    (void)seed;
  }
};

}  // namespace onyx::data
