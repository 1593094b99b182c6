// kernels/cpu/nn_util.h — helpers shared by the reduce, nn and loss kernels: element-type traits
// (load to an accumulator type, store back, float16/bfloat16 included), a dtype switch that hands a
// typed tag to a generic lambda, and AVX2 float32 row primitives (sum, max, exp, softmax rows).
// Hand-written because GCC 12 at -O2 does not vectorize reductions or expf, and these loops are
// the hot path of LayerNorm, softmax and cross-entropy.
#pragma once
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "ir/graph.h"
#include "onyx/dtype.h"
#include "onyx/error.h"
#include "onyx/tensor.h"

namespace onyx::runtime::nnutil {

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

// ---- AVX2 float32 primitives ----------------------------------------------------------------
inline float hsum8(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_shuffle_ps(lo, lo, 1));
  return _mm_cvtss_f32(lo);
}
inline float hmax8(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_max_ps(lo, hi);
  lo = _mm_max_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_max_ss(lo, _mm_shuffle_ps(lo, lo, 1));
  return _mm_cvtss_f32(lo);
}
inline float hmin8(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_min_ps(lo, hi);
  lo = _mm_min_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_min_ss(lo, _mm_shuffle_ps(lo, lo, 1));
  return _mm_cvtss_f32(lo);
}

// exp(x) for 8 floats x <= 0 (all callers pass x - max), Cephes-style range reduction + degree-5
// polynomial, ≈ 1 ulp. Results below FLT_MIN (x < -87.3) are exactly 0, so exp(-inf) = 0; NaN stays
// NaN (the clamps keep NaN operands). Positive x is clamped to 88.37 (never reached by callers).
inline __m256 exp8(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.33654475f);
  __m256 tiny = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  x = _mm256_min_ps(_mm256_set1_ps(88.3762626647949f), _mm256_max_ps(lo, x));
  __m256 fx = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f));
  fx = _mm256_floor_ps(fx);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps(1.9875691500E-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507E-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073E-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894E-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459E-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201E-1f));
  __m256 x2 = _mm256_mul_ps(x, x);
  y = _mm256_fmadd_ps(y, x2, _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
  __m256i n = _mm256_add_epi32(_mm256_cvttps_epi32(fx), _mm256_set1_epi32(127));
  y = _mm256_mul_ps(y, _mm256_castsi256_ps(_mm256_slli_epi32(n, 23)));
  return _mm256_andnot_ps(tiny, y);
}

inline float row_sum(const float* x, int64_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a0 = _mm256_add_ps(a0, _mm256_loadu_ps(x + i));
    a1 = _mm256_add_ps(a1, _mm256_loadu_ps(x + i + 8));
    a2 = _mm256_add_ps(a2, _mm256_loadu_ps(x + i + 16));
    a3 = _mm256_add_ps(a3, _mm256_loadu_ps(x + i + 24));
  }
  for (; i + 8 <= n; i += 8) a0 = _mm256_add_ps(a0, _mm256_loadu_ps(x + i));
  float s = hsum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  for (; i < n; i++) s += x[i];
  return s;
}

// sum((x - c)^2)
inline float row_sum_sq_dev(const float* x, int64_t n, float c) {
  __m256 vc = _mm256_set1_ps(c);
  __m256 a0 = _mm256_setzero_ps(), a1 = a0;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256 d0 = _mm256_sub_ps(_mm256_loadu_ps(x + i), vc);
    __m256 d1 = _mm256_sub_ps(_mm256_loadu_ps(x + i + 8), vc);
    a0 = _mm256_fmadd_ps(d0, d0, a0);
    a1 = _mm256_fmadd_ps(d1, d1, a1);
  }
  for (; i + 8 <= n; i += 8) {
    __m256 d0 = _mm256_sub_ps(_mm256_loadu_ps(x + i), vc);
    a0 = _mm256_fmadd_ps(d0, d0, a0);
  }
  float s = hsum8(_mm256_add_ps(a0, a1));
  for (; i < n; i++) s += (x[i] - c) * (x[i] - c);
  return s;
}

inline float row_max(const float* x, int64_t n) {
  float m = -INFINITY;
  int64_t i = 0;
  if (n >= 8) {
    __m256 a0 = _mm256_set1_ps(-INFINITY), a1 = a0;
    for (; i + 16 <= n; i += 16) {
      a0 = _mm256_max_ps(a0, _mm256_loadu_ps(x + i));
      a1 = _mm256_max_ps(a1, _mm256_loadu_ps(x + i + 8));
    }
    for (; i + 8 <= n; i += 8) a0 = _mm256_max_ps(a0, _mm256_loadu_ps(x + i));
    m = hmax8(_mm256_max_ps(a0, a1));
  }
  for (; i < n; i++) m = x[i] > m ? x[i] : m;
  return m;
}

inline float row_min(const float* x, int64_t n) {
  float m = INFINITY;
  int64_t i = 0;
  if (n >= 8) {
    __m256 a0 = _mm256_set1_ps(INFINITY), a1 = a0;
    for (; i + 16 <= n; i += 16) {
      a0 = _mm256_min_ps(a0, _mm256_loadu_ps(x + i));
      a1 = _mm256_min_ps(a1, _mm256_loadu_ps(x + i + 8));
    }
    for (; i + 8 <= n; i += 8) a0 = _mm256_min_ps(a0, _mm256_loadu_ps(x + i));
    m = hmin8(_mm256_min_ps(a0, a1));
  }
  for (; i < n; i++) m = x[i] < m ? x[i] : m;
  return m;
}

// sum(exp(x - m)); if y != nullptr also stores exp(x - m) there.
inline float row_sum_exp(const float* x, int64_t n, float m, float* y) {
  __m256 vm = _mm256_set1_ps(m), acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm));
    if (y) _mm256_storeu_ps(y + i, e);
    acc = _mm256_add_ps(acc, e);
  }
  float s = hsum8(acc);
  for (; i < n; i++) {
    float e = std::exp(x[i] - m);
    if (y) y[i] = e;
    s += e;
  }
  return s;
}

inline void row_scale(float* y, int64_t n, float s) {
  __m256 vs = _mm256_set1_ps(s);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(y + i), vs));
  for (; i < n; i++) y[i] *= s;
}

// y = softmax(x) over one contiguous row (y may alias x). NaN-propagating; a row of all -inf gives
// NaN (as numpy does).
inline void softmax_row(const float* x, float* y, int64_t n) {
  float m = row_max(x, n);
  float s = row_sum_exp(x, n, m, y);
  row_scale(y, n, 1.0f / s);
}

// y = x - max - log(sum(exp(x - max))) over one contiguous row (y may alias x).
inline void log_softmax_row(const float* x, float* y, int64_t n) {
  float m = row_max(x, n);
  float ls = std::log(row_sum_exp(x, n, m, nullptr));
  __m256 vm = _mm256_set1_ps(m), vl = _mm256_set1_ps(ls);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_sub_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm), vl));
  for (; i < n; i++) y[i] = (x[i] - m) - ls;
}

}  // namespace onyx::runtime::nnutil
