// kernels/cpu/nn_util.h — helpers shared by the CPU kernels (reduce, nn, loss, attention, matmul,
// conv, gather, ...): element-type traits (load to an accumulator type, store back,
// float16/bfloat16 included), dtype switches (a typed tag to a generic lambda; typed pointers with
// float16/bfloat16 through float32 copies), and AVX2 float32 primitives: the one vector exp (exp8
// for softmax-style x <= 0, exp_ps for the whole range, both over exp_reduced) and row sum, max,
// exp-sum and softmax rows.
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

// e^(x - n·ln2) for 8 floats, n an integer-valued vector near x / ln2: Cody-Waite reduction
// r = x - n·ln2 (ln2 in two parts) and Cephes' degree-5 expf polynomial on |r| <= ln2/2. The one
// exp approximation; exp8 and exp_ps below differ only in how they pick n and apply 2^n.
inline __m256 exp_reduced(__m256 x, __m256 n) {
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  return _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
}

// exp(x) for 8 floats x <= 0 (all callers pass x - max: softmax, cross-entropy, attention),
// ≈ 1 ulp, the cheaper variant: one 2^n scale. Results below FLT_MIN (x < -87.3) are exactly 0, so
// exp(-inf) = 0; NaN stays NaN (the clamps keep NaN operands). Positive x is clamped to 88.37
// (never reached by callers).
inline __m256 exp8(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.33654475f);
  __m256 tiny = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  x = _mm256_min_ps(_mm256_set1_ps(88.3762626647949f), _mm256_max_ps(lo, x));
  __m256 fx = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f));
  fx = _mm256_floor_ps(fx);
  __m256 y = exp_reduced(x, fx);
  __m256i n = _mm256_add_epi32(_mm256_cvttps_epi32(fx), _mm256_set1_epi32(127));
  y = _mm256_mul_ps(y, _mm256_castsi256_ps(_mm256_slli_epi32(n, 23)));
  return _mm256_andnot_ps(tiny, y);
}

// exp(x) for 8 floats over the whole range (the Exp op and the activations of
// elementwise_unary.cc): n = round(x / ln2), 2^n applied in two halves so results down to the
// subnormal range stay right; +inf above 88.72, NaN passes through.
inline __m256 exp_ps(__m256 x) {
  const __m256 hi = _mm256_set1_ps(88.72283f), lo = _mm256_set1_ps(-103.9721f);
  __m256 xc = _mm256_max_ps(lo, _mm256_min_ps(hi, x));  // NaN passes through (second operand)
  __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)),
                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 y = exp_reduced(xc, n);
  __m256i ni = _mm256_cvtps_epi32(n);
  __m256i n1 = _mm256_srai_epi32(ni, 1);
  __m256i n2 = _mm256_sub_epi32(ni, n1);
  const __m256i bias = _mm256_set1_epi32(127);
  __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
  __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
  y = _mm256_mul_ps(_mm256_mul_ps(y, s1), s2);
  return _mm256_blendv_ps(y, _mm256_set1_ps(INFINITY), _mm256_cmp_ps(x, hi, _CMP_GT_OQ));
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
