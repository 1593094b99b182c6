// kernels/cpu/simd/optimizer.cc — the optimizers' flat-buffer kernels (AdamW and SGD updates, the
// grad norm's block sums of squares) for every SIMD path (see optimizer.h); the
// threading and the scalars are train/optimizer.cc's.
//
// The updates are bit-exact against PyTorch's AdamW / SGD (train/optimizer.cc's header): an FMA
// exactly where torch's float32 CPU kernels have one (add with alpha, addcmul), separate roundings
// elsewhere (mul, div, addcdiv). GCC contracts a*b + c into an FMA by default (Highway's x86 Mul
// and Add are GCC vector arithmetic, so even there), which would silently change the rounding:
// contraction is off for this file and every FMA is explicit (Fma below).
// Every path gives the same bits for every element: IEEE mul, add, div and sqrt are correctly
// rounded in every lane width, the tails run the same vector arithmetic through masked loads, and
// Fma is fused on the portable path too (Highway's portable MulAdd is mul * x + add, two
// roundings with contraction off, so there it is std::fma lane by lane).
#pragma GCC optimize("fp-contract=off")

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/simd/optimizer.cc"
#include "kernels/cpu/simd/optimizer.h"

#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <cmath>

#include "kernels/cpu/simd/math-inl.h"

HWY_BEFORE_NAMESPACE();
namespace onyx::simd::HWY_NAMESPACE {

// a * b + c rounded once, on every path.
template <class D, class V>
HWY_INLINE V Fma(D d, V a, V b, V c) {
#if HWY_TARGET == HWY_SCALAR || HWY_TARGET == HWY_EMU128
  using T = hn::TFromD<D>;
  constexpr size_t N = hn::MaxLanes(D());
  HWY_ALIGN T ta[N], tb[N], tc[N];
  hn::Store(a, d, ta);
  hn::Store(b, d, tb);
  hn::Store(c, d, tc);
  for (size_t i = 0; i < N; ++i) ta[i] = std::fma(ta[i], tb[i], tc[i]);
  return hn::Load(d, ta);
#else
  (void)d;
  return hn::MulAdd(a, b, c);
#endif
}

// ---- AdamW --------------------------------------------------------------------------------------

// One vector of the update, operation for operation as torch 1.13's float32 CPU kernels:
//   g = g * grad_scale                             clip_grad_norm_'s mul_ (1: none)
//   p = p * keep                                   mul_
//   m = fma(g, 1-b1, m * b1)                       mul_, add_(alpha) (vectorized add is an FMA)
//   v = fma((1-b2) * g, g, v * b2)                 mul_, addcmul_ (FMA in torch's build)
//   p = p + (-step_size * m) / (sqrt(v) / sqrt(bc2) + eps)      sqrt, div, add_, addcdiv_
// The constants are broadcast here rather than kept as vectors in a struct (SVE's vectors are
// sizeless: no struct member can hold one); inlined into the loop, the broadcasts are hoisted.
HWY_INLINE void AdamWVec(DF d, const AdamWConstants& c, float keep, VF g, VF& p, VF& m, VF& v) {
  g = hn::Mul(g, hn::Set(d, c.grad_scale));
  p = hn::Mul(p, hn::Set(d, keep));
  m = Fma(d, g, hn::Set(d, c.one_minus_beta1), hn::Mul(m, hn::Set(d, c.beta1)));
  v = Fma(d, hn::Mul(hn::Set(d, c.one_minus_beta2), g), g, hn::Mul(v, hn::Set(d, c.beta2)));
  const VF denom =
      hn::Add(hn::Div(hn::Sqrt(v), hn::Set(d, c.bias_correction2_sqrt)), hn::Set(d, c.eps));
  p = hn::Add(p, hn::Div(hn::Mul(hn::Set(d, c.neg_step_size), m), denom));
}

void AdamWUpdate(float* p, const float* g, float* m, float* v, int64_t n, const AdamWConstants& c,
                 float keep) {
  const DF d;
  const int64_t L = (int64_t)hn::Lanes(d);
  int64_t i = 0;
  for (; i + L <= n; i += L) {
    VF pi = hn::LoadU(d, p + i), mi = hn::LoadU(d, m + i), vi = hn::LoadU(d, v + i);
    AdamWVec(d, c, keep, hn::LoadU(d, g + i), pi, mi, vi);
    hn::StoreU(pi, d, p + i);
    hn::StoreU(mi, d, m + i);
    hn::StoreU(vi, d, v + i);
  }
  if (i < n) {  // the missing lanes are zeros, computed and not stored
    const auto t = hn::FirstN(d, (size_t)(n - i));
    VF pi = LoadTail(t, d, p + i), mi = LoadTail(t, d, m + i), vi = LoadTail(t, d, v + i);
    AdamWVec(d, c, keep, LoadTail(t, d, g + i), pi, mi, vi);
    StoreTail(pi, t, d, p + i);
    StoreTail(mi, t, d, m + i);
    StoreTail(vi, t, d, v + i);
  }
}

// ---- SGD ----------------------------------------------------------------------------------------
// As torch 1.13's _single_tensor_sgd (dampening 0):
//   d = decay ? fma(p, wd, g) : g                  d_p.add(param, alpha=wd)
//   buf = first ? d : buf * mu + d                 clone / buf.mul_(mu).add_(d_p)
//   d = nesterov ? fma(buf, mu, d) : buf           d_p.add(buf, alpha=mu)
//   p = fma(d, -lr, p)                             param.add_(d_p, alpha=-lr)
// One vector: p, g and buf (when kMomentum && !kFirst) loaded; returns p, sets buf.
template <bool kDecay, bool kMomentum, bool kFirst, bool kNesterov>
HWY_INLINE VF SgdVec(DF d, VF wd, VF mu, VF nlr, VF p, VF g, VF& buf) {
  VF dp = g;
  if constexpr (kDecay) dp = Fma(d, p, wd, dp);
  if constexpr (kMomentum) {
    if constexpr (kFirst)
      buf = dp;
    else
      buf = hn::Add(hn::Mul(buf, mu), dp);
    if constexpr (kNesterov)
      dp = Fma(d, buf, mu, dp);
    else
      dp = buf;
  }
  return Fma(d, dp, nlr, p);
}

template <bool kDecay, bool kMomentum, bool kFirst, bool kNesterov>
void SgdRange(float* p, const float* g, float* buf, int64_t n, const SgdConstants& c) {
  const DF d;
  const int64_t L = (int64_t)hn::Lanes(d);
  const VF wd = hn::Set(d, c.weight_decay), mu = hn::Set(d, c.momentum), nlr = hn::Set(d, c.neg_lr);
  constexpr bool kReadBuf = kMomentum && !kFirst;
  int64_t i = 0;
  for (; i + L <= n; i += L) {
    VF b = kReadBuf ? hn::LoadU(d, buf + i) : hn::Zero(d);
    VF pi = SgdVec<kDecay, kMomentum, kFirst, kNesterov>(d, wd, mu, nlr, hn::LoadU(d, p + i),
                                                         hn::LoadU(d, g + i), b);
    if constexpr (kMomentum) hn::StoreU(b, d, buf + i);
    hn::StoreU(pi, d, p + i);
  }
  if (i < n) {
    const auto t = hn::FirstN(d, (size_t)(n - i));
    VF b = kReadBuf ? LoadTail(t, d, buf + i) : hn::Zero(d);
    VF pi = SgdVec<kDecay, kMomentum, kFirst, kNesterov>(d, wd, mu, nlr, LoadTail(t, d, p + i),
                                                         LoadTail(t, d, g + i), b);
    if constexpr (kMomentum) StoreTail(b, t, d, buf + i);
    StoreTail(pi, t, d, p + i);
  }
}

template <bool kDecay>
void SgdPick(float* p, const float* g, float* buf, int64_t n, const SgdConstants& c,
             unsigned flags) {
  if (!(flags & kSgdMomentum)) return SgdRange<kDecay, false, false, false>(p, g, buf, n, c);
  const bool nesterov = flags & kSgdNesterov;
  if (flags & kSgdFirst)
    return nesterov ? SgdRange<kDecay, true, true, true>(p, g, buf, n, c)
                    : SgdRange<kDecay, true, true, false>(p, g, buf, n, c);
  return nesterov ? SgdRange<kDecay, true, false, true>(p, g, buf, n, c)
                  : SgdRange<kDecay, true, false, false>(p, g, buf, n, c);
}

void SgdUpdate(float* p, const float* g, float* buf, int64_t n, const SgdConstants& c,
               unsigned flags) {
  if (flags & kSgdDecay)
    SgdPick<true>(p, g, buf, n, c, flags);
  else
    SgdPick<false>(p, g, buf, n, c, flags);
}

// ---- grad norm ----------------------------------------------------------------------------------
// One block (n <= 64) in double, in one order on every path (that of onyx's first AVX2 kernel:
// four vectors of four doubles, added vertically, then horizontally):
//   s[j] = the sum of x[i]^2 over i mod 16 = j, i below the last multiple of 16 <= n
//          (kA vectors of L doubles: lane l of vector a is s[a L + l])
//   t[l] = (s[l] + s[4 + l]) + (s[8 + l] + s[12 + l]), l < 4
//   sum  = (t[0] + t[1]) + (t[2] + t[3]), then the remaining x[i]^2 added one by one.
// Each square of a float is exact in double, so MulAdd fused or not rounds the same: once, in the
// add.
constexpr int64_t kSpan = 16;

#if ONYX_SIMD_SVE
// SVE's vectors are sizeless, so they cannot be array elements, and their width is known only at
// run time: eight named 2-lane accumulators (lane l of accumulator a is s[2a + l]) keep the order.
HWY_INLINE void SpanSquares(const float* x, int64_t n, int64_t& i, double* s) {
  const hn::FixedTag<double, 2> dd;
  const hn::FixedTag<float, 2> dh;
  using VD = hn::Vec<decltype(dd)>;
  VD a0 = hn::Zero(dd), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  auto add = [&](VD& a, const float* p) {
    const VD xd = hn::PromoteTo(dd, hn::LoadU(dh, p));
    a = hn::MulAdd(xd, xd, a);
  };
  for (; i + kSpan <= n; i += kSpan) {
    add(a0, x + i), add(a1, x + i + 2), add(a2, x + i + 4), add(a3, x + i + 6);
    add(a4, x + i + 8), add(a5, x + i + 10), add(a6, x + i + 12), add(a7, x + i + 14);
  }
  hn::StoreU(a0, dd, s), hn::StoreU(a1, dd, s + 2), hn::StoreU(a2, dd, s + 4);
  hn::StoreU(a3, dd, s + 6), hn::StoreU(a4, dd, s + 8), hn::StoreU(a5, dd, s + 10);
  hn::StoreU(a6, dd, s + 12), hn::StoreU(a7, dd, s + 14);
}
#else
HWY_INLINE void SpanSquares(const float* x, int64_t n, int64_t& i, double* s) {
  const hn::ScalableTag<double> dd;
  const hn::Rebind<float, decltype(dd)> dh;  // as many floats as dd has doubles
  using VD = hn::Vec<decltype(dd)>;
  constexpr int64_t L = (int64_t)hn::MaxLanes(decltype(dd)());  // exact on x86, NEON, portable
  static_assert(kSpan % L == 0, "a span of 16 floats is whole vectors of doubles");
  constexpr int64_t kA = kSpan / L;
  VD acc[kA];  // unrolled, so in registers
#pragma GCC unroll 16
  for (int64_t a = 0; a < kA; ++a) acc[a] = hn::Zero(dd);
  for (; i + kSpan <= n; i += kSpan) {
#pragma GCC unroll 16
    for (int64_t a = 0; a < kA; ++a) {
      const VD xd = hn::PromoteTo(dd, hn::LoadU(dh, x + i + a * L));
      acc[a] = hn::MulAdd(xd, xd, acc[a]);
    }
  }
#pragma GCC unroll 16
  for (int64_t a = 0; a < kA; ++a) hn::StoreU(acc[a], dd, s + a * L);
}
#endif

HWY_INLINE double SumSquares(const float* x, int64_t n) {
  int64_t i = 0;
  double s[kSpan];
  SpanSquares(x, n, i, s);
  double t[4];
  for (int l = 0; l < 4; ++l) t[l] = (s[l] + s[4 + l]) + (s[8 + l] + s[12 + l]);
  double sum = (t[0] + t[1]) + (t[2] + t[3]);
  for (; i < n; ++i) sum += (double)x[i] * (double)x[i];
  return sum;
}

void BlockSumSquares(const float* x, int64_t n, double* sums) {
  for (int64_t b = 0; b < n; b += kSquareSumBlock)
    *sums++ = SumSquares(x + b, std::min(kSquareSumBlock, n - b));
}

}  // namespace onyx::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace onyx::simd {
HWY_EXPORT(AdamWUpdate);
HWY_EXPORT(SgdUpdate);
HWY_EXPORT(BlockSumSquares);
void adamw_update(float* p, const float* g, float* m, float* v, int64_t n, const AdamWConstants& k,
                  float keep) {
  HWY_DYNAMIC_DISPATCH(AdamWUpdate)(p, g, m, v, n, k, keep);
}
void sgd_update(float* p, const float* g, float* buf, int64_t n, const SgdConstants& k,
                unsigned flags) {
  HWY_DYNAMIC_DISPATCH(SgdUpdate)(p, g, buf, n, k, flags);
}
void block_sum_squares(const float* x, int64_t n, double* sums) {
  HWY_DYNAMIC_DISPATCH(BlockSumSquares)(x, n, sums);
}
}  // namespace onyx::simd
#endif
