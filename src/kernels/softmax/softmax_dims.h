// kernels/softmax/softmax_dims.h — the view of softmax's axes that the CPU kernels (softmax.cc)
// and the CUDA kernels (softmax.cu) share: x as (O, R, I), the softmax running over R.
#pragma once
#include "kernels/kernel_api.h"

namespace onyx::kernels {

struct SoftmaxDims {
  int64_t O, R, I;  // x viewed as (O, R, I), softmax over R
};

// The one view of softmax's axes, for the forward and the backward. coerced_2d: the opset < 13
// semantics (the input coerced to 2-D at `axis`, which may equal the rank: the reduction runs over
// every axis from `axis` on); otherwise the reduction runs over the single axis `axis`.
inline SoftmaxDims softmax_dims(const ir::Node& node, const Shape& s, int64_t axis,
                                bool coerced_2d) {
  int64_t rank = (int64_t)s.size();
  SoftmaxDims d{1, 1, 1};
  if (rank == 0) return d;
  if (coerced_2d) {
    ONYX_CHECK(axis >= -rank && axis <= rank, node.describe(), ": axis ", axis,
               " is out of range for rank ", rank);
    if (axis < 0) axis += rank;
    for (int64_t i = 0; i < axis; i++) d.O *= s[i];
    for (int64_t i = axis; i < rank; i++) d.R *= s[i];
  } else {
    axis = runtime::normalize_axis(axis, rank, node);
    for (int64_t i = 0; i < axis; i++) d.O *= s[i];
    d.R = s[axis];
    for (int64_t i = axis + 1; i < rank; i++) d.I *= s[i];
  }
  return d;
}

// Softmax / LogSoftmax: opsets 1–12 coerce to 2-D at `axis` (default 1), 13+ use one axis
// (default -1).
inline SoftmaxDims forward_softmax_dims(const ir::Node& node, int64_t opset, const Shape& s) {
  return softmax_dims(node, s, node.attr_int("axis", opset >= 13 ? -1 : 1), opset < 13);
}

// SoftmaxGrad / LogSoftmaxGrad: axis (default -1), flatten = 1 for the coerced form.
inline SoftmaxDims grad_softmax_dims(const ir::Node& node, const Shape& s) {
  return softmax_dims(node, s, node.attr_int("axis", -1), node.attr_int("flatten", 0) != 0);
}

}  // namespace onyx::kernels
