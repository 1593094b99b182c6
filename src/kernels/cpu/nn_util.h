// kernels/cpu/nn_util.h — helpers shared by the CPU kernels (reduce, nn, loss, attention, matmul,
// conv, gather, ...): element-type traits (load to an accumulator type, store back,
// float16/bfloat16 included) and dtype switches (a typed tag to a generic lambda; typed pointers
// with float16/bfloat16 through float32 copies). The float32 vector math and row reductions are
// in kernels/cpu/simd/ (one copy per SIMD path).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "ir/graph.h"
#include "onyx/dtype.h"
#include "onyx/error.h"
#include "onyx/tensor.h"

namespace onyx::kernels::nnutil {

// The output type of a node that may write bfloat16 for the mixed-precision pass
// (passes/mixed_precision.cc sets output_dtype = BFLOAT16 on a float32 producer whose output only
// GEMMs read): x's type, or bfloat16 over a float32 x.
inline DType low_precision_output(const ir::Node& node, DType x) {
  const int64_t out = node.attr_int("output_dtype", 0);
  if (out == 0) return x;
  ONYX_CHECK(out == (int64_t)DType::BFloat16 && x == DType::Float32, node.describe(),
             ": output_dtype ", out,
             " is supported only as BFLOAT16 (16) over a float32 input, got ", dtype_name(x));
  return DType::BFloat16;
}

// A float16 / bfloat16 tensor's values as float32, and back (kernels that compute those dtypes
// through their float32 path).
inline std::vector<float> to_f32(const Tensor& t) {
  std::vector<float> v(t.numel());
  const uint16_t* p = t.data<uint16_t>();
  bool half = t.dtype() == DType::Float16;
  for (size_t i = 0; i < v.size(); i++) v[i] = half ? half_to_float(p[i]) : bf16_to_float(p[i]);
  return v;
}
inline void from_f32(const std::vector<float>& v, Tensor& t) {
  uint16_t* p = t.data<uint16_t>();
  bool half = t.dtype() == DType::Float16;
  for (size_t i = 0; i < v.size(); i++) p[i] = half ? float_to_half(v[i]) : float_to_bf16(v[i]);
}

// ---- element traits -------------------------------------------------------------------------
// Acc<T>: the type arithmetic is done in (double for floating types, 64-bit ints for integers).
template <class T>
struct Elem {
  using acc = std::conditional_t<std::is_floating_point_v<T>, double,
                                 std::conditional_t<std::is_signed_v<T>, int64_t, uint64_t>>;
  static acc load(T v) { return (acc)v; }
  static T store(acc v) { return (T)v; }
  static constexpr bool is_float = std::is_floating_point_v<T>;
};
template <>
struct Elem<Half> {
  using acc = double;
  static acc load(Half v) { return half_to_float(v.bits); }
  static Half store(acc v) { return Half{float_to_half((float)v)}; }
  static constexpr bool is_float = true;
};
template <>
struct Elem<BFloat16> {
  using acc = double;
  static acc load(BFloat16 v) { return bf16_to_float(v.bits); }
  static BFloat16 store(acc v) { return BFloat16{float_to_bf16((float)v)}; }
  static constexpr bool is_float = true;
};

// Float element load/store through float (for float16/bfloat16 rows converted to float32).
inline float to_f32(float v) { return v; }
inline float to_f32(double v) { return (float)v; }
inline float to_f32(Half v) { return half_to_float(v.bits); }
inline float to_f32(BFloat16 v) { return bf16_to_float(v.bits); }
template <class T>
inline T from_f32(float v) {
  if constexpr (std::is_same_v<T, Half>)
    return Half{float_to_half(v)};
  else if constexpr (std::is_same_v<T, BFloat16>)
    return BFloat16{float_to_bf16(v)};
  else
    return (T)v;
}

// ---- dtype dispatch -------------------------------------------------------------------------
// Calls f(T{}) for the C++ type of `t` if it is in the allowed set, else throws Unsupported.
enum TypeSet : unsigned { kFloats = 1, kInts = 2, kUInts = 4, kAllNumeric = 7 };

template <class F>
void dispatch(DType t, unsigned set, const ir::Node& node, F&& f) {
  bool fl = set & kFloats, in = set & kInts, un = set & kUInts;
  switch (t) {
    case DType::Float32:
      if (fl) return f(float{});
      break;
    case DType::Float64:
      if (fl) return f(double{});
      break;
    case DType::Float16:
      if (fl) return f(Half{});
      break;
    case DType::BFloat16:
      if (fl) return f(BFloat16{});
      break;
    case DType::Int8:
      if (in) return f(int8_t{});
      break;
    case DType::Int16:
      if (in) return f(int16_t{});
      break;
    case DType::Int32:
      if (in) return f(int32_t{});
      break;
    case DType::Int64:
      if (in) return f(int64_t{});
      break;
    case DType::UInt8:
      if (un) return f(uint8_t{});
      break;
    case DType::UInt16:
      if (un) return f(uint16_t{});
      break;
    case DType::UInt32:
      if (un) return f(uint32_t{});
      break;
    case DType::UInt64:
      if (un) return f(uint64_t{});
      break;
    default:
      break;
  }
  ONYX_UNSUPPORTED(node.describe(), ": dtype ", dtype_name(t), " is not supported");
}

// Runs f(const T* in..., T* out) with T = float for float32, float16 and bfloat16 (the 16-bit types
// through float32 copies of the inputs and the output) and T = double for float64. Every input must
// have out's dtype; other dtypes are Unsupported (naming the node).
template <class F, class... In>
void dispatch_float(const ir::Node& node, Tensor& out, F&& f, const In&... in) {
  const DType dt = out.dtype();
  auto check = [&](const Tensor& t) {
    ONYX_CHECK(t.dtype() == dt, node.describe(), ": input dtype ", dtype_name(t.dtype()),
               " differs from the output's ", dtype_name(dt));
  };
  (check(in), ...);
  switch (dt) {
    case DType::Float32:
      return f(in.template data<float>()..., out.data<float>());
    case DType::Float64:
      return f(in.template data<double>()..., out.data<double>());
    case DType::Float16:
    case DType::BFloat16: {
      std::vector<float> of(out.numel());
      [&](const auto&... inf) { f((const float*)inf.data()..., of.data()); }(to_f32(in)...);
      return from_f32(of, out);
    }
    default:
      ONYX_UNSUPPORTED(node.describe(), ": dtype ", dtype_name(dt));
  }
}

// Infer-time checks of two-operand kernels (MatMul, Gemm, Conv gradients).
inline void check_same_dtype(const ir::Node& node, DType a, DType b) {
  ONYX_CHECK(a == b, node.describe(), ": inputs have different dtypes ", dtype_name(a), " and ",
             dtype_name(b));
}
inline void check_float(const ir::Node& node, DType a, DType b) {
  check_same_dtype(node, a, b);
  if (!is_float(a)) ONYX_UNSUPPORTED(node.describe(), ": dtype ", dtype_name(a));
}

// Rows per parallel chunk of a row kernel (softmax, norms): about 16K elements.
inline int64_t rows_grain(int64_t cols) {
  return std::max<int64_t>(1, 16384 / std::max<int64_t>(1, cols));
}

inline void check_same_shape(const ir::Node& node, const TensorMeta& a, const TensorMeta& b,
                             const char* an, const char* bn) {
  ONYX_CHECK(a.shape == b.shape, node.describe(), ": ", an, " ", shape_str(a.shape), " and ", bn,
             " ", shape_str(b.shape), " must have the same shape");
}

}  // namespace onyx::kernels::nnutil
