// kernels/shape/shape_common.h — helpers shared by the shape/data-movement kernels (shape.cc,
// transpose.cc, slice.cc, gather.cc). These ops move bytes, so they work on element size (1, 2, 4,
// 8 bytes), not per dtype; the few that do arithmetic (Range, EyeLike, ScatterElements reductions)
// dispatch on dtype with dispatch_dtype.
#pragma once
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/kernel_api.h"

namespace onyx::kernels::shape_detail {

inline size_t elem_size(DType t, const ir::Node& node) {
  if (t == DType::String || t == DType::Undefined)
    ONYX_UNSUPPORTED(node.describe(), ": dtype ", dtype_name(t), " is not supported");
  return dtype_size(t);
}

// Calls f.template operator()<U>() with U the unsigned integer type of `es` bytes.
template <class F>
void by_elem_size(size_t es, F&& f) {
  switch (es) {
    case 1:
      f.template operator()<uint8_t>();
      break;
    case 2:
      f.template operator()<uint16_t>();
      break;
    case 4:
      f.template operator()<uint32_t>();
      break;
    case 8:
      f.template operator()<uint64_t>();
      break;
    default:
      throw Error(cat("unsupported element size ", es));
  }
}

// Row-major strides (in elements) of a contiguous tensor of `shape`.
inline std::vector<int64_t> contiguous_strides(const Shape& shape) {
  std::vector<int64_t> s(shape.size());
  int64_t acc = 1;
  for (int i = (int)shape.size() - 1; i >= 0; i--) {
    s[i] = acc;
    acc *= shape[i];
  }
  return s;
}

inline int64_t prod(const Shape& s, size_t b, size_t e) {
  int64_t n = 1;
  for (size_t i = b; i < e && i < s.size(); i++) n *= s[i];
  return n;
}

// Copies `bytes` bytes, split across threads when large. dst == src is a no-op.
void parallel_memcpy(void* dst, const void* src, size_t bytes);

// Fills `n` elements of `es` bytes at dst with the element at `value`.
void fill_elements(void* dst, int64_t n, const void* value, size_t es);

// Gathers a strided view into a contiguous buffer:
//   dst[i0, ..., ik] = src[i0 * src_strides[0] + ... + ik * src_strides[k]]   (strides in elements,
// may be 0 or negative), dst contiguous of `shape`. Merges dims, copies contiguous rows with
// memcpy, copies transposes in 8x8 blocks (AVX2 for 4-byte elements), and splits the work across
// threads.
void strided_copy(void* dst, const void* src, const Shape& shape,
                  const std::vector<int64_t>& src_strides, size_t es);

// Integer values of an optional shape-like input (int32/int64; empty vector if absent).
inline std::vector<int64_t> ints_of(const Tensor* t) {
  return t ? t->to_int64_vector() : std::vector<int64_t>{};
}

// Arithmetic on a storage type: C is the compute type, load/store convert.
template <class S>
struct Arith {
  using C = S;
  static C load(S v) { return v; }
  static S store(C v) { return v; }
};
template <>
struct Arith<Half> {
  using C = float;
  static C load(Half v) { return half_to_float(v.bits); }
  static Half store(C v) { return Half{float_to_half(v)}; }
};
template <>
struct Arith<BFloat16> {
  using C = float;
  static C load(BFloat16 v) { return bf16_to_float(v.bits); }
  static BFloat16 store(C v) { return BFloat16{float_to_bf16(v)}; }
};
template <>
struct Arith<bool> {
  using C = int;
  static C load(bool v) { return v; }
  static bool store(C v) { return v != 0; }
};

// Calls f.template operator()<S>() with S the storage type of dtype t (Half/BFloat16 for the
// 16-bit floats, bool for Bool); Unsupported for others.
template <class F>
void dispatch_dtype(DType t, const ir::Node& node, F&& f) {
  switch (t) {
    case DType::Float32:
      f.template operator()<float>();
      break;
    case DType::Float64:
      f.template operator()<double>();
      break;
    case DType::Float16:
      f.template operator()<Half>();
      break;
    case DType::BFloat16:
      f.template operator()<BFloat16>();
      break;
    case DType::Int8:
      f.template operator()<int8_t>();
      break;
    case DType::Int16:
      f.template operator()<int16_t>();
      break;
    case DType::Int32:
      f.template operator()<int32_t>();
      break;
    case DType::Int64:
      f.template operator()<int64_t>();
      break;
    case DType::UInt8:
      f.template operator()<uint8_t>();
      break;
    case DType::UInt16:
      f.template operator()<uint16_t>();
      break;
    case DType::UInt32:
      f.template operator()<uint32_t>();
      break;
    case DType::UInt64:
      f.template operator()<uint64_t>();
      break;
    case DType::Bool:
      f.template operator()<bool>();
      break;
    default:
      ONYX_UNSUPPORTED(node.describe(), ": dtype ", dtype_name(t), " is not supported");
  }
}

// Writes `v` converted to dtype t at element i of dst.
void store_double(DType t, void* dst, int64_t i, double v, const ir::Node& node);

// Gather-style indices (int32 or int64) as int64 in [0, dim), negatives wrapped; throws naming
// the first out-of-range index, its position, the axis and the data shape. Used by Gather,
// GatherElements and their gradient kernels.
std::vector<int64_t> read_indices(const ir::Node& node, const Tensor& ind, int64_t dim,
                                  const Shape& data_shape, int64_t axis);

}  // namespace onyx::kernels::shape_detail
