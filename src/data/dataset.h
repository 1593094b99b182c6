// data/dataset.h — datasets and the deterministic, resumable batch order.
// A Dataset (the interface is public: onyx/dataset.h) yields a batch as named tensors (graph
// input names, labels included) for a list of sample indices. The order of samples per epoch is
// a pure function of (data_seed, epoch), so a resumed run regenerates it and skips what was
// consumed (DESIGN decision 10).
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "onyx/dataset.h"  // Dataset
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

// Sample order of one epoch: a permutation drawn from (seed, epoch) when shuffling, else 0..n-1.
std::vector<int64_t> epoch_order(int64_t n, bool shuffle, uint64_t seed, int64_t epoch);

// Transformers' get_length_grouped_indices with onyx's permutation: the epoch's shuffled order
// cut into megabatches of min(n / (4 * batch_size), 50) batches (at least 1), each sorted by
// length, longest first (stable), and the longest sample of all moved to the very front.
std::vector<int64_t> length_grouped_order(const std::vector<int64_t>& lengths, int64_t batch_size,
                                          uint64_t seed, int64_t epoch);

// Splits an order into batches of `batch_size` (the last one short unless drop_last).
std::vector<std::vector<int64_t>> make_batches(const std::vector<int64_t>& order,
                                               int64_t batch_size, bool drop_last);

}  // namespace onyx::data
