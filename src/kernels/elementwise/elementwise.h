// kernels/elementwise/elementwise.h — shared pieces of the elementwise kernel family
// (elementwise.cc, unary.cc, binary.cc, cast.cc): dtype dispatch over type lists, float16/bfloat16
// load/store through float, and the N-input broadcast walker. Other CPU families (norms, softmax)
// use them too.
#pragma once
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels/cpu/simd/simd.h"
#include "kernels/kernel_api.h"

namespace onyx::kernels {

namespace ew {

// Elements per parallel chunk: cheap ops (add, compare, copy) and transcendental ones.
constexpr int64_t kGrain = 16384;
constexpr int64_t kGrainMath = 4096;

// ---- dtype dispatch -------------------------------------------------------------------------

template <class... Ts>
struct Types {};

template <class T>
struct Tag {
  using type = T;
};

template <class T>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, float>)
    return DType::Float32;
  else if constexpr (std::is_same_v<T, double>)
    return DType::Float64;
  else if constexpr (std::is_same_v<T, Half>)
    return DType::Float16;
  else if constexpr (std::is_same_v<T, BFloat16>)
    return DType::BFloat16;
  else if constexpr (std::is_same_v<T, int8_t>)
    return DType::Int8;
  else if constexpr (std::is_same_v<T, int16_t>)
    return DType::Int16;
  else if constexpr (std::is_same_v<T, int32_t>)
    return DType::Int32;
  else if constexpr (std::is_same_v<T, int64_t>)
    return DType::Int64;
  else if constexpr (std::is_same_v<T, uint8_t>)
    return DType::UInt8;
  else if constexpr (std::is_same_v<T, uint16_t>)
    return DType::UInt16;
  else if constexpr (std::is_same_v<T, uint32_t>)
    return DType::UInt32;
  else if constexpr (std::is_same_v<T, uint64_t>)
    return DType::UInt64;
  else if constexpr (std::is_same_v<T, bool>)
    return DType::Bool;
  else
    static_assert(sizeof(T) == 0, "no DType for this C++ type");
}

using FloatTypes = Types<float, double, Half, BFloat16>;
using SignedTypes = Types<float, double, Half, BFloat16, int8_t, int16_t, int32_t, int64_t>;
using UnsignedIntTypes = Types<uint8_t, uint16_t, uint32_t, uint64_t>;
using IntTypes = Types<int8_t, int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t>;
using NumericTypes = Types<float, double, Half, BFloat16, int8_t, int16_t, int32_t, int64_t,
                           uint8_t, uint16_t, uint32_t, uint64_t>;
using AllTypes = Types<float, double, Half, BFloat16, int8_t, int16_t, int32_t, int64_t, uint8_t,
                       uint16_t, uint32_t, uint64_t, bool>;
using BoolTypes = Types<bool>;

template <class... Ts>
bool dtype_in(DType t, Types<Ts...>) {
  return ((dtype_of<Ts>() == t) || ...);
}

// Calls f(Tag<T>{}) for the C++ type T of `t`; Unsupported (naming the node) if `t` is not listed.
template <class... Ts, class F>
void dispatch(DType t, Types<Ts...>, const ir::Node& node, F&& f) {
  bool done = ((dtype_of<Ts>() == t ? (f(Tag<Ts>{}), true) : false) || ...);
  if (!done) ONYX_UNSUPPORTED(node.describe(), ": dtype ", dtype_name(t), " is not supported");
}

// Throws Unsupported in infer when a dtype is not in the op's list.
template <class L>
void require_dtype(DType t, L list, const ir::Node& node, const char* what = "input") {
  if (!dtype_in(t, list))
    ONYX_UNSUPPORTED(node.describe(), ": ", what, " dtype ", dtype_name(t), " is not supported");
}

// ---- math type: float16/bfloat16 are computed in float --------------------------------------

template <class T>
struct MathOf {
  using type = T;
};
template <>
struct MathOf<Half> {
  using type = float;
};
template <>
struct MathOf<BFloat16> {
  using type = float;
};
template <class T>
using Math = typename MathOf<T>::type;

template <class T>
constexpr bool is_half_like = std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;

template <class T>
inline Math<T> load(T v) {
  if constexpr (std::is_same_v<T, Half>)
    return half_to_float(v.bits);
  else if constexpr (std::is_same_v<T, BFloat16>)
    return bf16_to_float(v.bits);
  else
    return v;
}

template <class T, class U>
inline T store(U v) {
  if constexpr (std::is_same_v<T, Half>)
    return Half{float_to_half((float)v)};
  else if constexpr (std::is_same_v<T, BFloat16>)
    return BFloat16{float_to_bf16((float)v)};
  else
    return static_cast<T>(v);
}

// Wrapping integer arithmetic (no signed-overflow UB, no int promotion overflow for 16-bit mul).
template <class T>
using WideUnsigned = std::conditional_t<sizeof(T) <= 4, uint32_t, uint64_t>;
template <class T>
inline T wrap_add(T a, T b) {
  return (T)(WideUnsigned<T>(a) + WideUnsigned<T>(b));
}
template <class T>
inline T wrap_sub(T a, T b) {
  return (T)(WideUnsigned<T>(a) - WideUnsigned<T>(b));
}
template <class T>
inline T wrap_mul(T a, T b) {
  return (T)(WideUnsigned<T>(a) * WideUnsigned<T>(b));
}

// A floating value converted to an integer type: truncated toward zero, NaN -> 0, out-of-range
// values saturated to int64/uint64 and then wrapped to narrower types (numpy's astype on x86 for
// in-range values; defined behaviour for the rest).
template <class I, class F>
inline I float_to_int(F v) {
  if constexpr (std::is_same_v<I, bool>) {
    return v != 0;
  } else if constexpr (std::is_same_v<I, uint64_t>) {
    if (!(v > -1))
      return v != v ? 0 : (uint64_t)(int64_t)std::max<double>(v, -9.2233720368547758e18);
    if (v >= 18446744073709551616.0) return std::numeric_limits<uint64_t>::max();
    if (v >= 9223372036854775808.0) return (uint64_t)(v - 9223372036854775808.0) + (1ull << 63);
    return (uint64_t)(int64_t)v;
  } else {
    if (v != v) return 0;
    if (v >= 9223372036854775808.0) return (I)std::numeric_limits<int64_t>::max();
    if (v < -9223372036854775808.0) return (I)std::numeric_limits<int64_t>::min();
    return (I)(int64_t)v;
  }
}

// ---- broadcast walker -----------------------------------------------------------------------

// The output iterated as rows along its innermost (collapsed) dimension. Output dims of size 1 are
// dropped and neighbouring dims that are contiguous in every input are merged, so same-shape
// inputs become one flat run, (B,T,C)+(C) rows of C, (B,T,C)*(B,T,1) rows with a scalar operand.
struct BroadcastWalk {
  int64_t numel = 0;
  std::vector<int64_t> dims;  // collapsed output dims; dims.back() is the row length
  std::vector<std::vector<int64_t>> strides;  // [input][dim] in elements; 0 where broadcast
  std::vector<int64_t> inner_stride;          // per input: 1, or 0 when broadcast along rows
};

// `ins` must each broadcast to `out` (checked by infer); throws otherwise.
BroadcastWalk plan_walk(const Shape& out, const std::vector<Shape>& ins);

// Calls seg(off, pos, n) for runs of n outputs starting at flat output index pos, where off[k] is
// input k's element offset of the run's first element; parallel over the output.
template <int N, class Seg>
void walk(const BroadcastWalk& w, int64_t grain, Seg&& seg) {
  const int R = (int)w.dims.size();
  const int64_t inner = w.dims[R - 1];
  parallel_for(w.numel, grain, [&](int64_t b, int64_t e) {
    std::vector<int64_t> idx(R, 0);  // index over dims[0..R-2]
    int64_t row = b / inner, col = b % inner;
    for (int d = R - 2; d >= 0; d--) {
      idx[d] = row % w.dims[d];
      row /= w.dims[d];
    }
    std::array<int64_t, N> off;
    int64_t pos = b;
    while (pos < e) {
      for (int k = 0; k < N; k++) {
        int64_t o = col * w.inner_stride[k];
        const int64_t* s = w.strides[k].data();
        for (int d = 0; d < R - 1; d++) o += idx[d] * s[d];
        off[k] = o;
      }
      int64_t n = std::min(inner - col, e - pos);
      seg(off.data(), pos, n);
      pos += n;
      col = 0;
      for (int d = R - 2; d >= 0; d--) {
        if (++idx[d] < w.dims[d]) break;
        idx[d] = 0;
      }
    }
  });
}

// out[i] = op(a[i], b[i]) with broadcasting; op takes and returns math types.
template <class A, class B, class O, class Op>
inline void binary_run(const A* a, int64_t sa, const B* b, int64_t sb, O* o, int64_t n,
                       const Op& op) {
  if constexpr (std::is_same_v<A, float> && std::is_same_v<B, float> && std::is_same_v<O, float> &&
                requires { Op::kSimd; }) {
    if (n >= 32) return simd::binary(Op::kSimd, a, sa != 0, b, sb != 0, o, n);
  }
  if (sa && sb) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) o[i] = store<O>(op(load(a[i]), load(b[i])));
  } else if (sa) {
    const auto bv = load(b[0]);
#pragma omp simd
    for (int64_t i = 0; i < n; i++) o[i] = store<O>(op(load(a[i]), bv));
  } else if (sb) {
    const auto av = load(a[0]);
#pragma omp simd
    for (int64_t i = 0; i < n; i++) o[i] = store<O>(op(av, load(b[i])));
  } else {
    const O v = store<O>(op(load(a[0]), load(b[0])));
    for (int64_t i = 0; i < n; i++) o[i] = v;
  }
}

template <class A, class B, class O, class Op>
void binary_apply(const Tensor& a, const Tensor& b, Tensor& out, const Op& op,
                  int64_t grain = kGrain) {
  if (out.numel() == 0) return;
  BroadcastWalk w = plan_walk(out.shape(), {a.shape(), b.shape()});
  const A* pa = a.data<A>();
  const B* pb = b.data<B>();
  O* po = out.data<O>();
  walk<2>(w, grain, [&](const int64_t* off, int64_t pos, int64_t n) {
    binary_run(pa + off[0], w.inner_stride[0], pb + off[1], w.inner_stride[1], po + pos, n, op);
  });
}

// Copies `in` broadcast to out's shape (any dtype; by element size).
void expand_into(const Tensor& in, Tensor& out);

// Array conversions between float and the 16-bit float types (F16C for float16), round to
// nearest even; x and y may not overlap.
void to_float(const Half* x, float* y, int64_t n);
void to_float(const BFloat16* x, float* y, int64_t n);
void from_float(const float* x, Half* y, int64_t n);
void from_float(const float* x, BFloat16* y, int64_t n);

}  // namespace ew
}  // namespace onyx::kernels

namespace onyx::kernels::ew {
// The float32 vector math of elementwise_unary.cc, exposed for the kernel tests.
void erf_f32(const float* x, float* y, int64_t n);
void exp_f32(const float* x, float* y, int64_t n);
void tanh_f32(const float* x, float* y, int64_t n);
}  // namespace onyx::kernels::ew
