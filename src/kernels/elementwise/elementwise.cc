// kernels/elementwise/elementwise.cc — the elementwise family's shared broadcast machinery:
// plan_walk (collapses an N-input broadcast into rows so the inner loops are flat and vectorize),
// expand_into (broadcast copy of any dtype). The family's kernels register from their own files
// (unary.cc, binary.cc, cast.cc). Hand-written because these loops are the hot path of every
// transformer graph (bias adds, residuals, scaling) and must not go through a generic iterator.
#include "kernels/elementwise/elementwise.h"

#include "kernels/cpu/simd/simd.h"

namespace onyx::kernels {
namespace ew {

BroadcastWalk plan_walk(const Shape& out, const std::vector<Shape>& ins) {
  const size_t r = out.size();
  const size_t nin = ins.size();
  // Full-rank strides of every input against `out` (0 where the input broadcasts).
  std::vector<std::vector<int64_t>> full(nin, std::vector<int64_t>(r, 0));
  for (size_t k = 0; k < nin; k++) {
    const Shape& s = ins[k];
    ONYX_CHECK(s.size() <= r, "shape ", shape_str(s), " cannot be broadcast to ", shape_str(out));
    size_t lead = r - s.size();
    int64_t stride = 1;
    for (size_t i = s.size(); i-- > 0;) {
      int64_t d = s[i], od = out[lead + i];
      ONYX_CHECK(d == od || d == 1, "shape ", shape_str(s), " cannot be broadcast to ",
                 shape_str(out));
      full[k][lead + i] = (d == 1) ? 0 : stride;
      stride *= d;
    }
  }
  BroadcastWalk w;
  w.numel = shape_numel(out);
  w.strides.assign(nin, {});
  for (size_t i = 0; i < r; i++) {
    if (out[i] == 1) continue;  // size-1 output dims contribute nothing
    bool merge = !w.dims.empty();
    for (size_t k = 0; k < nin && merge; k++) merge = w.strides[k].back() == full[k][i] * out[i];
    if (merge) {
      w.dims.back() *= out[i];
      for (size_t k = 0; k < nin; k++) w.strides[k].back() = full[k][i];
    } else {
      w.dims.push_back(out[i]);
      for (size_t k = 0; k < nin; k++) w.strides[k].push_back(full[k][i]);
    }
  }
  if (w.dims.empty()) {  // scalar (or all-ones) output
    w.dims.push_back(1);
    for (size_t k = 0; k < nin; k++) w.strides[k].push_back(0);
  }
  w.inner_stride.resize(nin);
  for (size_t k = 0; k < nin; k++) w.inner_stride[k] = w.strides[k].back();
  return w;
}

template <class U>
static void expand_typed(const Tensor& in, Tensor& out) {
  BroadcastWalk w = plan_walk(out.shape(), {in.shape()});
  const U* pi = static_cast<const U*>(in.raw());
  U* po = static_cast<U*>(out.raw());
  walk<1>(w, kGrain, [&](const int64_t* off, int64_t pos, int64_t n) {
    const U* src = pi + off[0];
    U* dst = po + pos;
    if (w.inner_stride[0]) {
      std::memcpy(dst, src, n * sizeof(U));
    } else {
      const U v = src[0];
      for (int64_t i = 0; i < n; i++) dst[i] = v;
    }
  });
}

void expand_into(const Tensor& in, Tensor& out) {
  ONYX_CHECK(in.dtype() == out.dtype(), "expand_into: dtype mismatch");
  if (out.numel() == 0) return;
  switch (dtype_size(in.dtype())) {
    case 1:
      expand_typed<uint8_t>(in, out);
      break;
    case 2:
      expand_typed<uint16_t>(in, out);
      break;
    case 4:
      expand_typed<uint32_t>(in, out);
      break;
    case 8:
      expand_typed<uint64_t>(in, out);
      break;
    default:
      ONYX_UNSUPPORTED("expand: dtype ", dtype_name(in.dtype()));
  }
}

void to_float(const Half* x, float* y, int64_t n) { simd::f16_to_f32((const uint16_t*)x, y, n); }

void from_float(const float* x, Half* y, int64_t n) { simd::f32_to_f16(x, (uint16_t*)y, n); }

void to_float(const BFloat16* x, float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; i++) y[i] = bf16_to_float(x[i].bits);
}

void from_float(const float* x, BFloat16* y, int64_t n) {
  simd::f32_to_bf16_bits(x, (uint16_t*)y, n);
}

}  // namespace ew

}  // namespace onyx::kernels
