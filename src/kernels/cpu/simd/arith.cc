// kernels/cpu/simd/arith.cc — float32 Add / Sub / Mul / Div rows with scalar or vector operands
// (the broadcast-collapsed inner loops of elementwise_binary.cc) for every SIMD path (see simd.h).
// Plain `omp simd` loops: inside Highway's per-target region GCC vectorizes them at that target's
// width, which the baseline build (no -march) would not.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/simd/arith.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "kernels/cpu/simd/simd.h"

HWY_BEFORE_NAMESPACE();
namespace onyx::simd::HWY_NAMESPACE {

template <class F>
HWY_INLINE void Rows(const float* a, bool av, const float* b, bool bv, float* o, int64_t n, F f) {
  if (av && bv) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) o[i] = f(a[i], b[i]);
  } else if (av) {
    const float y = b[0];
#pragma omp simd
    for (int64_t i = 0; i < n; i++) o[i] = f(a[i], y);
  } else if (bv) {
    const float x = a[0];
#pragma omp simd
    for (int64_t i = 0; i < n; i++) o[i] = f(x, b[i]);
  } else {
    const float v = f(a[0], b[0]);
#pragma omp simd
    for (int64_t i = 0; i < n; i++) o[i] = v;
  }
}

void Binary(BinaryOp op, const float* a, bool av, const float* b, bool bv, float* o, int64_t n) {
  switch (op) {
    case BinaryOp::Add:
      return Rows(a, av, b, bv, o, n, [](float x, float y) { return x + y; });
    case BinaryOp::Sub:
      return Rows(a, av, b, bv, o, n, [](float x, float y) { return x - y; });
    case BinaryOp::Mul:
      return Rows(a, av, b, bv, o, n, [](float x, float y) { return x * y; });
    case BinaryOp::Div:
      return Rows(a, av, b, bv, o, n, [](float x, float y) { return x / y; });
  }
}

}  // namespace onyx::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace onyx::simd {
HWY_EXPORT(Binary);
void binary(BinaryOp op, const float* a, bool a_vec, const float* b, bool b_vec, float* o,
            int64_t n) {
  HWY_DYNAMIC_DISPATCH(Binary)(op, a, a_vec, b, b_vec, o, n);
}
}  // namespace onyx::simd
#endif
