// kernels/cpu/simd/rows-inl.h — the row reductions (sum, sum of squared deviations, max, min,
// exp-sum) and row scale, per target: rows.cc exports them through the dispatch table, and the
// other per-target files (softmax.cc, norm.cc) call them directly inside their own rows.
// Included once per target (Highway's foreach_target pattern: the guard toggles).
#if defined(ONYX_SIMD_ROWS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ONYX_SIMD_ROWS_INL_H_
#undef ONYX_SIMD_ROWS_INL_H_
#else
#define ONYX_SIMD_ROWS_INL_H_
#endif

#include <hwy/highway.h>

#include <cmath>
#include <cstdint>

#include "kernels/cpu/simd/math-inl.h"

HWY_BEFORE_NAMESPACE();
namespace onyx::simd::HWY_NAMESPACE {

HWY_INLINE float RowSum(const float* x, int64_t n) {
  const DF d;
  const int64_t L = (int64_t)hn::Lanes(d);
  VF a0 = hn::Zero(d), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + 4 * L <= n; i += 4 * L) {
    a0 = hn::Add(a0, hn::LoadU(d, x + i));
    a1 = hn::Add(a1, hn::LoadU(d, x + i + L));
    a2 = hn::Add(a2, hn::LoadU(d, x + i + 2 * L));
    a3 = hn::Add(a3, hn::LoadU(d, x + i + 3 * L));
  }
  for (; i + L <= n; i += L) a0 = hn::Add(a0, hn::LoadU(d, x + i));
  if (i < n) a1 = hn::Add(a1, LoadTail(hn::FirstN(d, (size_t)(n - i)), d, x + i));
  return ReduceSum(d, hn::Add(hn::Add(a0, a1), hn::Add(a2, a3)));
}

HWY_INLINE float RowSumSqDev(const float* x, int64_t n, float c) {
  const DF d;
  const int64_t L = (int64_t)hn::Lanes(d);
  const VF vc = hn::Set(d, c);
  VF a0 = hn::Zero(d), a1 = a0;
  int64_t i = 0;
  for (; i + 2 * L <= n; i += 2 * L) {
    VF d0 = hn::Sub(hn::LoadU(d, x + i), vc), d1 = hn::Sub(hn::LoadU(d, x + i + L), vc);
    a0 = hn::MulAdd(d0, d0, a0);
    a1 = hn::MulAdd(d1, d1, a1);
  }
  for (; i + L <= n; i += L) {
    VF d0 = hn::Sub(hn::LoadU(d, x + i), vc);
    a0 = hn::MulAdd(d0, d0, a0);
  }
  if (i < n) {
    const auto m = hn::FirstN(d, (size_t)(n - i));
    VF d0 = hn::IfThenElseZero(m, hn::Sub(LoadTail(m, d, x + i), vc));
    a1 = hn::MulAdd(d0, d0, a1);
  }
  return ReduceSum(d, hn::Add(a0, a1));
}

// max (MAX) or min of a row; the tail's missing lanes are filled with the identity.
template <bool MAX>
HWY_INLINE float RowExtreme(const float* x, int64_t n) {
  const DF d;
  const int64_t L = (int64_t)hn::Lanes(d);
  const VF ident = hn::Set(d, MAX ? -HUGE_VALF : HUGE_VALF);
  auto op = [](VF a, VF b) { return MAX ? hn::Max(a, b) : hn::Min(a, b); };
  VF a0 = ident, a1 = ident;
  int64_t i = 0;
  for (; i + 2 * L <= n; i += 2 * L) {
    a0 = op(a0, hn::LoadU(d, x + i));
    a1 = op(a1, hn::LoadU(d, x + i + L));
  }
  for (; i + L <= n; i += L) a0 = op(a0, hn::LoadU(d, x + i));
  if (i < n) {
    const auto m = hn::FirstN(d, (size_t)(n - i));
    a1 = op(a1, hn::IfThenElse(m, LoadTail(m, d, x + i), ident));
  }
  return MAX ? ReduceMax(d, op(a0, a1)) : ReduceMin(d, op(a0, a1));
}
HWY_INLINE float RowMax(const float* x, int64_t n) { return RowExtreme<true>(x, n); }
HWY_INLINE float RowMin(const float* x, int64_t n) { return RowExtreme<false>(x, n); }

HWY_INLINE float RowSumExp(const float* x, int64_t n, float mx, float* y) {
  const DF d;
  const int64_t L = (int64_t)hn::Lanes(d);
  const VF vm = hn::Set(d, mx);
  VF acc = hn::Zero(d);
  int64_t i = 0;
  for (; i + L <= n; i += L) {
    VF e = ExpNeg(d, hn::Sub(hn::LoadU(d, x + i), vm));
    if (y) hn::StoreU(e, d, y + i);
    acc = hn::Add(acc, e);
  }
  if (i < n) {
    const auto m = hn::FirstN(d, (size_t)(n - i));
    VF e = hn::IfThenElseZero(m, ExpNeg(d, hn::Sub(LoadTail(m, d, x + i), vm)));
    if (y) StoreTail(e, m, d, y + i);
    acc = hn::Add(acc, e);
  }
  return ReduceSum(d, acc);
}

HWY_INLINE void RowScale(float* y, int64_t n, float s) {
  const VF vs = hn::Set(DF(), s);
  Map(y, y, n, [&vs](DF, VF v) { return hn::Mul(v, vs); });
}

}  // namespace onyx::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // ONYX_SIMD_ROWS_INL_H_
