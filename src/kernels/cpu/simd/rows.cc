// kernels/cpu/simd/rows.cc — row reductions of LayerNorm, softmax and cross-entropy (sum, sum of
// squared deviations, max, min, exp-sum) and a row scale, for every SIMD path (see simd.h): the
// dispatch-table exports of rows-inl.h, which the other per-target files also inline.
// Hand-written because GCC 12 at -O2 vectorizes neither float reductions nor expf.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/simd/rows.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <cmath>

#include "kernels/cpu/simd/math-inl.h"
#include "kernels/cpu/simd/rows-inl.h"
#include "kernels/cpu/simd/simd.h"

HWY_BEFORE_NAMESPACE();
namespace onyx::simd::HWY_NAMESPACE {

int64_t DispatchedTarget() { return HWY_TARGET; }

}  // namespace onyx::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace onyx::simd {
HWY_EXPORT(DispatchedTarget);
int64_t dispatched_target() { return HWY_DYNAMIC_DISPATCH(DispatchedTarget)(); }
HWY_EXPORT(RowSum);
HWY_EXPORT(RowSumSqDev);
HWY_EXPORT(RowMax);
HWY_EXPORT(RowMin);
HWY_EXPORT(RowSumExp);
HWY_EXPORT(RowScale);
float row_sum(const float* x, int64_t n) { return HWY_DYNAMIC_DISPATCH(RowSum)(x, n); }
float row_sum_sq_dev(const float* x, int64_t n, float c) {
  return HWY_DYNAMIC_DISPATCH(RowSumSqDev)(x, n, c);
}
float row_max(const float* x, int64_t n) { return HWY_DYNAMIC_DISPATCH(RowMax)(x, n); }
float row_min(const float* x, int64_t n) { return HWY_DYNAMIC_DISPATCH(RowMin)(x, n); }
float row_sum_exp(const float* x, int64_t n, float m, float* y) {
  return HWY_DYNAMIC_DISPATCH(RowSumExp)(x, n, m, y);
}
void row_scale(float* y, int64_t n, float s) { HWY_DYNAMIC_DISPATCH(RowScale)(y, n, s); }
}  // namespace onyx::simd
#endif
