// flat_buffer.cc — layout and views of the flat parameter / gradient / optimizer-state buffers.
#include "train/flat_buffer.h"

#include <cstring>

namespace onyx::train {

FlatLayout FlatLayout::of(const std::vector<std::pair<std::string, Shape>>& tensors, DType dtype) {
  FlatLayout l;
  l.dtype = dtype;
  int64_t pos = 0;
  for (auto& [name, shape] : tensors) {
    l.entries.push_back({name, shape, pos});
    pos += (shape_numel(shape) + 15) / 16 * 16;
  }
  l.numel = pos;
  return l;
}

const FlatLayout::Entry& FlatLayout::find(const std::string& name) const {
  for (auto& e : entries)
    if (e.name == name) return e;
  throw Error(cat("flat buffer has no tensor named '", name, "'"));
}

FlatBuffer::FlatBuffer(FlatLayout layout) : layout_(std::move(layout)) {
  flat_ = Tensor::zeros(layout_.dtype, {layout_.numel});
  size_t es = dtype_size(layout_.dtype);
  for (auto& e : layout_.entries) {
    // A view shares the flat tensor's storage (the aliasing shared_ptr keeps it alive).
    Tensor whole = flat_;
    void* p = (char*)flat_.raw() + e.offset * es;
    views_[e.name] = Tensor::wrap(layout_.dtype, e.shape, p,
                                  std::shared_ptr<void>(std::make_shared<Tensor>(whole), p));
  }
}

void FlatBuffer::zero() { std::memset(flat_.raw(), 0, flat_.nbytes()); }

}  // namespace onyx::train
