// kernels/cpu/simd/activations.cc — float32 array math of the elementwise ops and the fused
// activation gradients (Exp, Tanh, Sigmoid, Silu, Sqrt, Erf, Gelu; GeluGrad, SiluGrad, ErfGrad,
// ReluGrad, SigmoidGrad, TanhGrad) for every SIMD path (see simd.h). The op kernels
// (elementwise_unary.cc) keep dtypes, shapes and threading; these run one contiguous block.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/simd/activations.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <cmath>

#include "kernels/cpu/simd/math-inl.h"
#include "kernels/cpu/simd/simd.h"

HWY_BEFORE_NAMESPACE();
namespace onyx::simd::HWY_NAMESPACE {

// Gelu's constants, shared by the forward and GeluGrad (and ErfGrad's 2/sqrt(pi)).
constexpr float kInvSqrt2 = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;   // 1 / sqrt(2 pi)
constexpr float kTwoInvSqrtPi = 1.1283791670955126f;  // 2 / sqrt(pi)
constexpr float kTanhA = 0.79788456080286536f;        // sqrt(2 / pi)
constexpr float kTanhB = 0.044715f;

void ExpArray(const float* x, float* y, int64_t n) {
  Map(x, y, n, [](DF d, VF v) { return Exp(d, v); });
}
void TanhArray(const float* x, float* y, int64_t n) {
  Map(x, y, n, [](DF d, VF v) { return Tanh(d, v); });
}
void SigmoidArray(const float* x, float* y, int64_t n) {
  Map(x, y, n, [](DF d, VF v) { return Sigmoid(d, v); });
}
void SiluArray(const float* x, float* y, int64_t n) {
  Map(x, y, n, [](DF d, VF v) { return hn::Mul(v, Sigmoid(d, v)); });
}
void SqrtArray(const float* x, float* y, int64_t n) {
  Map(x, y, n, [](DF, VF v) { return hn::Sqrt(v); });
}

// e[i] = erf(u[i]) (u == e allowed), blocks of kB elements. The inner polynomial runs on every
// vector. The outer branch (an exp and 7 FMAs: two thirds of Erf's work) runs only in blocks where
// some lane needs it, and there on those lanes alone: they are compressed into a queue with their
// positions, computed a vector at a time and scattered back. Its cost follows the share of lanes
// that take it — in GELU, |x| > 1.31: none in most blocks early in training, ~1/5 for N(0,1)
// inputs. Every lane gets exactly Erf's arithmetic, so results are bit-identical to it.
void ErfArray(const float* u, float* e, int64_t n) {
  const DF d;
  const hn::RebindToSigned<DF> di;
  const int64_t L = (int64_t)hn::Lanes(d);
  constexpr int64_t kB = 512;
  HWY_ALIGN float cu[kB + 64];
  HWY_ALIGN int32_t ci[kB + 64];
  for (int64_t b0 = 0; b0 < n; b0 += kB) {
    const int64_t m = std::min(kB, n - b0), full = m - m % L;
    const float* ub = u + b0;
    float* eb = e + b0;
    const auto tail_mask = hn::FirstN(d, (size_t)(m - full));
    const VF tail = LoadTail(tail_mask, d, ub + full);  // zero-filled: zeros stay inner
    auto any = ErfOuterMask(d, tail);
    for (int64_t i = 0; i < full; i += L) any = hn::Or(any, ErfOuterMask(d, hn::LoadU(d, ub + i)));
    size_t cnt = 0;
    if (hn::AllFalse(d, any)) {
      for (int64_t i = 0; i < full; i += L)
        hn::StoreU(ErfInner(d, hn::LoadU(d, ub + i)), d, eb + i);
    } else {
      // x's outer lanes and their positions, compressed in registers and stored as whole
      // vectors (the buffers have a vector of slack; the next store overwrites the lanes past
      // cnt). Not hn::CompressStore: on AVX-512 it is vcompressps to memory, microcoded on AMD
      // Zen 4 — GELU over N(0,1) inputs ran at 3.6 GB/s there, 17x slower than with no outer lane
      // (onyx_bench kernel/Gelu/erf/64x50x768).
      auto queue = [&](VF x, int64_t i) {
        const auto outer = ErfOuterMask(d, x);
        hn::StoreU(hn::Compress(hn::Iota(di, (int32_t)i), hn::RebindMask(di, outer)), di, ci + cnt);
        hn::StoreU(hn::Compress(x, outer), d, cu + cnt);
        cnt += hn::CountTrue(d, outer);
      };
      for (int64_t i = 0; i < full; i += L) {
        const VF x = hn::LoadU(d, ub + i);
        queue(x, i);
        hn::StoreU(ErfInner(d, x), d, eb + i);
      }
      if (full < m) queue(tail, full);
    }
    if (full < m) StoreTail(ErfInner(d, tail), tail_mask, d, eb + full);
    if (cnt == 0) continue;
    hn::StoreU(hn::Zero(d), d, cu + cnt);  // defined values in the last vector
    for (size_t j = 0; j < cnt; j += L) hn::Store(ErfOuter(d, hn::Load(d, cu + j)), d, cu + j);
    for (size_t j = 0; j < cnt; j++) eb[ci[j]] = cu[j];
  }
}

// gelu(x) = 0.5 x (1 + erf(x / sqrt 2)), bit-identical to Erf per vector. Blocks where no lane
// needs erf's outer branch (the common case: |x| <= 1.31 everywhere) run in one pass of
// registers; the others go through ErfArray's compression.
void GeluErfArray(const float* x, float* y, int64_t n) {
  const DF d;
  const int64_t L = (int64_t)hn::Lanes(d);
  constexpr int64_t kB = 512;
  HWY_ALIGN float e[kB];
  const VF c = hn::Set(d, kInvSqrt2), half = hn::Set(d, 0.5f), one = hn::Set(d, 1.0f);
  auto gelu = [&](VF v, VF erf_u) { return hn::Mul(hn::Mul(half, v), hn::Add(one, erf_u)); };
  for (int64_t b0 = 0; b0 < n; b0 += kB) {
    const int64_t m = std::min(kB, n - b0), full = m - m % L;
    const float* xb = x + b0;
    float* yb = y + b0;
    auto any = hn::FirstN(d, 0);
    for (int64_t i = 0; i < full; i += L)
      any = hn::Or(any, ErfOuterMask(d, hn::Mul(hn::LoadU(d, xb + i), c)));
    if (hn::AllFalse(d, any)) {
      for (int64_t i = 0; i < full; i += L) {
        const VF v = hn::LoadU(d, xb + i);
        hn::StoreU(gelu(v, ErfInner(d, hn::Mul(v, c))), d, yb + i);
      }
    } else {
      for (int64_t i = 0; i < full; i += L) hn::Store(hn::Mul(hn::LoadU(d, xb + i), c), d, e + i);
      ErfArray(e, e, full);
      for (int64_t i = 0; i < full; i += L)
        hn::StoreU(gelu(hn::LoadU(d, xb + i), hn::Load(d, e + i)), d, yb + i);
    }
    if (full < m) {  // the tail through a masked vector
      const auto tm = hn::FirstN(d, (size_t)(m - full));
      const VF v = LoadTail(tm, d, xb + full);
      StoreTail(gelu(v, Erf(d, hn::Mul(v, c))), tm, d, yb + full);
    }
  }
}

// 0.5 x (1 + tanh(u)) with u = sqrt(2/pi) (x + 0.044715 x^3), computed as x * sigmoid(2u), which
// is the same function without the cancellation of 1 + tanh(u) for negative x.
void GeluTanhArray(const float* x, float* y, int64_t n) {
  Map(x, y, n, [](DF d, VF v) {
    const VF x3 = hn::Mul(hn::Mul(v, v), v);
    const VF u = hn::Mul(hn::Set(d, kTanhA), hn::MulAdd(hn::Set(d, kTanhB), x3, v));
    const VF e = Exp(d, hn::Mul(hn::Set(d, -2.0f), u));
    return hn::Div(v, hn::Add(hn::Set(d, 1.0f), e));
  });
}

// ---- fused gradients, one block of n <= kGradBlock (dx may alias dy, never x / y) -------------
// The scalar loops vectorize at this target's width (`omp simd`: GCC -O2 alone does not, inside
// Highway's target region or out).
// (GCC cannot see that the loops fill e[0..n) before ErfArray / ExpArray read it.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// gelu'(x) = 0.5 (1 + erf(x/sqrt2)) + x exp(-x^2/2)/sqrt(2pi)
void GeluErfGrad(const float* dy, const float* x, float* dx, int64_t n) {
  HWY_ALIGN float e[kGradBlock], g[kGradBlock];
#pragma omp simd
  for (int64_t i = 0; i < n; i++) {
    e[i] = x[i] * kInvSqrt2;
    g[i] = -0.5f * x[i] * x[i];
  }
  ErfArray(e, e, n);
  ExpArray(g, g, n);
#pragma omp simd
  for (int64_t i = 0; i < n; i++)
    dx[i] = dy[i] * (0.5f * (1.0f + e[i]) + x[i] * g[i] * kInvSqrt2Pi);
}

// The forward computes 0.5 x (1 + tanh u) as x s with s = sigmoid(2u), u = a (x + b x^3);
// gelu'(x) = s + x s (1 - s) 2 u',  u' = a (1 + 3 b x^2). No cancellation for negative x.
void GeluTanhGrad(const float* dy, const float* x, float* dx, int64_t n) {
  HWY_ALIGN float e[kGradBlock];
#pragma omp simd
  for (int64_t i = 0; i < n; i++) {
    const float v = x[i];
    e[i] = -2.0f * kTanhA * (v + kTanhB * v * v * v);
  }
  ExpArray(e, e, n);
#pragma omp simd
  for (int64_t i = 0; i < n; i++) {
    const float v = x[i];
    const float s = 1.0f / (1.0f + e[i]);
    const float du = 2.0f * kTanhA * (1.0f + 3.0f * kTanhB * v * v);
    dx[i] = dy[i] * (s + v * s * (1.0f - s) * du);
  }
}

// silu'(x) = s (1 + x (1 - s)), s = sigmoid(x) = 1 / (1 + exp(-x)).
void SiluGrad(const float* dy, const float* x, float* dx, int64_t n) {
  HWY_ALIGN float e[kGradBlock];
#pragma omp simd
  for (int64_t i = 0; i < n; i++) e[i] = -x[i];
  ExpArray(e, e, n);
#pragma omp simd
  for (int64_t i = 0; i < n; i++) {
    const float s = 1.0f / (1.0f + e[i]);
    dx[i] = dy[i] * s * (1.0f + x[i] * (1.0f - s));
  }
}

void ErfGrad(const float* dy, const float* x, float* dx, int64_t n) {
  HWY_ALIGN float e[kGradBlock];
#pragma omp simd
  for (int64_t i = 0; i < n; i++) e[i] = -x[i] * x[i];
  ExpArray(e, e, n);
#pragma omp simd
  for (int64_t i = 0; i < n; i++) dx[i] = dy[i] * kTwoInvSqrtPi * e[i];
}

#pragma GCC diagnostic pop

void ReluGrad(const float* dy, const float* y, float* dx, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; i++) dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}
void SigmoidGrad(const float* dy, const float* y, float* dx, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; i++) dx[i] = dy[i] * y[i] * (1.0f - y[i]);
}
void TanhGrad(const float* dy, const float* y, float* dx, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; i++) dx[i] = dy[i] * (1.0f - y[i] * y[i]);
}

}  // namespace onyx::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace onyx::simd {
#define ONYX_SIMD_MAP(name, Fn) \
  HWY_EXPORT(Fn);               \
  void name(const float* x, float* y, int64_t n) { HWY_DYNAMIC_DISPATCH(Fn)(x, y, n); }
ONYX_SIMD_MAP(exp, ExpArray)
ONYX_SIMD_MAP(tanh, TanhArray)
ONYX_SIMD_MAP(sigmoid, SigmoidArray)
ONYX_SIMD_MAP(silu, SiluArray)
ONYX_SIMD_MAP(sqrt, SqrtArray)
ONYX_SIMD_MAP(erf, ErfArray)
ONYX_SIMD_MAP(gelu_erf, GeluErfArray)
ONYX_SIMD_MAP(gelu_tanh, GeluTanhArray)
#undef ONYX_SIMD_MAP
#define ONYX_SIMD_GRAD(name, Fn)                                     \
  HWY_EXPORT(Fn);                                                    \
  void name(const float* dy, const float* v, float* dx, int64_t n) { \
    HWY_DYNAMIC_DISPATCH(Fn)(dy, v, dx, n);                          \
  }
ONYX_SIMD_GRAD(gelu_erf_grad, GeluErfGrad)
ONYX_SIMD_GRAD(gelu_tanh_grad, GeluTanhGrad)
ONYX_SIMD_GRAD(silu_grad, SiluGrad)
ONYX_SIMD_GRAD(erf_grad, ErfGrad)
ONYX_SIMD_GRAD(relu_grad, ReluGrad)
ONYX_SIMD_GRAD(sigmoid_grad, SigmoidGrad)
ONYX_SIMD_GRAD(tanh_grad, TanhGrad)
#undef ONYX_SIMD_GRAD
}  // namespace onyx::simd
#endif
