// train/flat_buffer.h — every trainable tensor of one dtype in one contiguous buffer (DESIGN
// decision 3, llm.c's layout). Parameters, gradients, AdamW moments and master weights use the
// same layout, so fused optimizers are one pass, grad-norm one reduction, and a checkpoint a few
// writes. Each tensor is a view (Tensor sharing the buffer's storage).
#pragma once
#include <map>
#include <string>
#include <vector>

#include "onyx/tensor.h"

namespace onyx::train {

struct FlatLayout {
  struct Entry {
    std::string name;
    Shape shape;
    int64_t offset;  // in elements
  };
  DType dtype = DType::Float32;
  std::vector<Entry> entries;
  int64_t numel = 0;

  // Lays out tensors in the given order, each aligned to 16 elements (64 bytes for float32).
  static FlatLayout of(const std::vector<std::pair<std::string, Shape>>& tensors,
                       DType dtype = DType::Float32);
  const Entry& find(const std::string& name) const;
};

class FlatBuffer {
 public:
  FlatBuffer() = default;
  explicit FlatBuffer(FlatLayout layout);  // zero-initialized
  const FlatLayout& layout() const { return layout_; }
  Tensor& flat() { return flat_; }  // [numel]
  const Tensor& flat() const { return flat_; }
  Tensor& view(const std::string& name) { return views_.at(name); }
  const Tensor& view(const std::string& name) const { return views_.at(name); }
  const std::map<std::string, Tensor>& views() const { return views_; }
  void zero();

 private:
  FlatLayout layout_;
  Tensor flat_;
  std::map<std::string, Tensor> views_;
};

}  // namespace onyx::train
