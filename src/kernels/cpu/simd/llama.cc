// kernels/cpu/simd/llama.cc — the fused elementwise ops of Llama-family MLPs and attention
// (onyx.SwiGLU and SwiGLUGrad, one block; onyx.Rotary and RotaryGrad, one row), for every SIMD
// path (see nn.h). The op kernels (llama_ops.cc) keep dtypes, shapes, table broadcasting and
// threading.
// Hand-written because GCC 12 does not vectorize expf (SwiGLU's sigmoid: math-inl.h's Exp, as
// onyx.Silu takes it), and because rotary must round as the unfused graph does, which needs FMA
// contraction off per function (ONYX_SIMD_NO_FP_CONTRACT below).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/simd/llama.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>

#include "kernels/cpu/simd/math-inl.h"
#include "kernels/cpu/simd/nn.h"

// No FMA contraction (GCC's -ffp-contract=fast would fuse a Mul into the Add / Sub that reads it).
#ifndef ONYX_SIMD_NO_FP_CONTRACT
#define ONYX_SIMD_NO_FP_CONTRACT __attribute__((optimize("fp-contract=off")))
#endif

HWY_BEFORE_NAMESPACE();
namespace onyx::simd::HWY_NAMESPACE {

// y = silu(g) * u = (g * sigmoid(g)) * u, sigmoid as onyx.Silu computes it.
void SwiGLU(const float* g, const float* u, float* y, int64_t n) {
  const DF d;
  ForEachVector(n, [&](auto ld, auto st) {
    const VF x = ld(g);
    st(hn::Mul(hn::Mul(x, Sigmoid(d, x)), ld(u)), y);
  });
}

// In blocks, with the arithmetic of the unfused onyx.Silu + Mul backward (activations.cc's
// SiluGrad on dy * up): the same roundings, so fusing does not change the gradients.
// (GCC cannot see that the first loop fills e[0..m) before Map reads it.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
void SwiGLUGrad(const float* dy, const float* g, const float* u, float* dg, float* du, int64_t n) {
  constexpr int64_t kBlock = 512;
  HWY_ALIGN float e[kBlock];
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t m = std::min(kBlock, n - b);
    for (int64_t i = 0; i < m; i++) e[i] = -g[b + i];
    Map(e, e, m, [](DF d, VF v) { return Exp(d, v); });
#pragma omp simd
    for (int64_t i = 0; i < m; i++) {
      const int64_t k = b + i;
      float s = 1.0f / (1.0f + e[i]);
      float dv = dy[k], x = g[k], v = u[k];
      float da = dv * v;  // d silu(g)
      du[k] = dv * (x * s);
      dg[k] = da * s * (1.0f + x * (1.0f - s));
    }
  }
}
#pragma GCC diagnostic pop

// One rotary row: y = x * c + rotate_half(x) * s, or the transposed rotation (the backward's dx):
// dx1 = dy1 c1 + dy2 s2, dx2 = dy2 c2 - dy1 s1. Not contracted: each product and sum is rounded as
// the unfused Mul / Add nodes round it, so fusing does not change the results.
template <bool TRANSPOSED>
ONYX_SIMD_NO_FP_CONTRACT HWY_INLINE void RotaryVec(VF x1, VF x2, VF c1, VF c2, VF s1, VF s2, VF& y1,
                                                   VF& y2) {
  if (TRANSPOSED) {
    y1 = hn::Add(hn::Mul(x1, c1), hn::Mul(x2, s2));
    y2 = hn::Sub(hn::Mul(x2, c2), hn::Mul(x1, s1));
  } else {
    y1 = hn::Sub(hn::Mul(x1, c1), hn::Mul(x2, s1));
    y2 = hn::Add(hn::Mul(x2, c2), hn::Mul(x1, s2));
  }
}

template <bool TRANSPOSED>
ONYX_SIMD_NO_FP_CONTRACT HWY_INLINE void RotaryRowT(const float* x, const float* c, const float* s,
                                                    float* y, int64_t D) {
  const DF d;
  const int64_t L = (int64_t)hn::Lanes(d), h = D / 2;
  VF y1, y2;
  int64_t i = 0;
  for (; i + L <= h; i += L) {
    RotaryVec<TRANSPOSED>(hn::LoadU(d, x + i), hn::LoadU(d, x + h + i), hn::LoadU(d, c + i),
                          hn::LoadU(d, c + h + i), hn::LoadU(d, s + i), hn::LoadU(d, s + h + i), y1,
                          y2);
    hn::StoreU(y1, d, y + i);
    hn::StoreU(y2, d, y + h + i);
  }
  if (i < h) {
    const auto m = hn::FirstN(d, (size_t)(h - i));
    RotaryVec<TRANSPOSED>(LoadTail(m, d, x + i), LoadTail(m, d, x + h + i), LoadTail(m, d, c + i),
                          LoadTail(m, d, c + h + i), LoadTail(m, d, s + i),
                          LoadTail(m, d, s + h + i), y1, y2);
    StoreTail(y1, m, d, y + i);
    StoreTail(y2, m, d, y + h + i);
  }
}

ONYX_SIMD_NO_FP_CONTRACT void RotaryRow(const float* x, const float* c, const float* s, float* y,
                                        int64_t D) {
  RotaryRowT<false>(x, c, s, y, D);
}
ONYX_SIMD_NO_FP_CONTRACT void RotaryGradRow(const float* x, const float* c, const float* s,
                                            float* y, int64_t D) {
  RotaryRowT<true>(x, c, s, y, D);
}

}  // namespace onyx::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace onyx::simd {
HWY_EXPORT(SwiGLU);
HWY_EXPORT(SwiGLUGrad);
HWY_EXPORT(RotaryRow);
HWY_EXPORT(RotaryGradRow);
void swiglu(const float* g, const float* u, float* y, int64_t n) {
  HWY_DYNAMIC_DISPATCH(SwiGLU)(g, u, y, n);
}
void swiglu_grad(const float* dy, const float* g, const float* u, float* dg, float* du, int64_t n) {
  HWY_DYNAMIC_DISPATCH(SwiGLUGrad)(dy, g, u, dg, du, n);
}
void rotary_row(const float* x, const float* c, const float* s, float* y, int64_t D) {
  HWY_DYNAMIC_DISPATCH(RotaryRow)(x, c, s, y, D);
}
void rotary_grad_row(const float* x, const float* c, const float* s, float* y, int64_t D) {
  HWY_DYNAMIC_DISPATCH(RotaryGradRow)(x, c, s, y, D);
}
}  // namespace onyx::simd
#endif
