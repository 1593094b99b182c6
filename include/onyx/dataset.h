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
};

}  // namespace onyx::data
