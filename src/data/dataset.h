// data/dataset.h — datasets (the batch order: data/sampling.h).
// A Dataset (the interface is public: onyx/dataset.h) yields a batch as named tensors (graph
// input names, labels included) for a list of sample indices.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "data/sampling.h"  // the epoch order (callers of datasets use both)
#include "onyx/dataset.h"   // Dataset
#include "onyx/tensor.h"

namespace onyx::data {

// Tensors whose first dimension is the sample, from one safetensors file or a folder of them
// (concatenated along the first dimension, files in name order). Every tensor must have the same
// sample count; errors name the file and key.
class TensorDataset : public Dataset {
 public:
  explicit TensorDataset(std::map<std::string, Tensor> tensors, std::string what = "dataset");
  static std::shared_ptr<TensorDataset> load(const std::string& path);
  int64_t size() const override { return n_; }
  std::map<std::string, Tensor> batch(const std::vector<int64_t>& indices) const override;
  std::vector<std::string> keys() const override;
  // the 1-D integer `length_column` tensor, else input_ids' row length (padded: all equal)
  std::vector<int64_t> lengths(const std::string& length_column) const override;
  const std::map<std::string, Tensor>& tensors() const { return tensors_; }

 private:
  std::map<std::string, Tensor> tensors_;
  int64_t n_ = 0;
};

}  // namespace onyx::data
