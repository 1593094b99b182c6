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
};

}  // namespace onyx::data
