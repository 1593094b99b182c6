// kernels/cpu/simd/softmax.cc — the softmax rows of Softmax, LogSoftmax and their gradients
// (contiguous rows and rows over a strided axis), of Attention's backward (dS) and of the
// cross-entropy losses (SoftmaxCrossEntropyLoss's gradient, LinearCrossEntropy's
// dlogits), for every SIMD path (see nn.h). The op kernels (nn.cc, attention.cc, loss.cc,
// linear_cross_entropy.cc) keep dtypes, shapes and threading; these run one row.
// Hand-written because GCC 12 at -O2 vectorizes neither float reductions nor expf, and these rows
// are the transformer's softmax and LM-loss hot path. exp is math-inl.h's ExpNeg (every argument
// here is <= 0: x - max, or a log-probability).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/simd/softmax.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <cmath>

#include "kernels/cpu/simd/math-inl.h"
#include "kernels/cpu/simd/nn.h"
#include "kernels/cpu/simd/rows-inl.h"

HWY_BEFORE_NAMESPACE();
namespace onyx::simd::HWY_NAMESPACE {

void SoftmaxRow(const float* x, float* y, int64_t n) {
  const float m = RowMax(x, n);
  const float s = RowSumExp(x, n, m, y);
  RowScale(y, n, 1.0f / s);
}

void LogSoftmaxRow(const float* x, float* y, int64_t n) {
  const float m = RowMax(x, n);
  const float ls = std::log(RowSumExp(x, n, m, nullptr));
  const VF vm = hn::Set(DF(), m), vl = hn::Set(DF(), ls);
  Map(x, y, n, [&vm, &vl](DF, VF v) { return hn::Sub(hn::Sub(v, vm), vl); });
}

void SoftmaxColsExp(const float* x, const float* m, float* y, float* s, int64_t n) {
  const DF d;
  ForEachVector(n, [&](auto ld, auto st) {
    const VF e = ExpNeg(d, hn::Sub(ld(x), ld(m)));
    if (y) st(e, y);
    st(hn::Add(ld(s), e), s);
  });
}

void SoftmaxGradRow(const float* dy, const float* y, float* dx, int64_t n) {
  const DF d;
  const int64_t L = (int64_t)hn::Lanes(d);
  VF a0 = hn::Zero(d), a1 = a0;
  int64_t i = 0;
  for (; i + 2 * L <= n; i += 2 * L) {
    a0 = hn::MulAdd(hn::LoadU(d, dy + i), hn::LoadU(d, y + i), a0);
    a1 = hn::MulAdd(hn::LoadU(d, dy + i + L), hn::LoadU(d, y + i + L), a1);
  }
  for (; i + L <= n; i += L) a0 = hn::MulAdd(hn::LoadU(d, dy + i), hn::LoadU(d, y + i), a0);
  if (i < n) {
    const auto m = hn::FirstN(d, (size_t)(n - i));
    a1 = hn::MulAdd(LoadTail(m, d, dy + i), LoadTail(m, d, y + i), a1);
  }
  const VF vs = hn::Set(d, ReduceSum(d, hn::Add(a0, a1)));
  ForEachVector(n, [&](auto ld, auto st) { st(hn::Mul(ld(y), hn::Sub(ld(dy), vs)), dx); });
}

void LogSoftmaxGradRow(const float* dy, const float* y, float* dx, int64_t n) {
  const DF d;
  const VF vs = hn::Set(d, RowSum(dy, n));
  ForEachVector(n, [&](auto ld, auto st) { st(hn::NegMulAdd(ExpNeg(d, ld(y)), vs, ld(dy)), dx); });
}

void LogSoftmaxGradCols(const float* dy, const float* y, const float* s, float* dx, int64_t n) {
  const DF d;
  ForEachVector(n,
                [&](auto ld, auto st) { st(hn::NegMulAdd(ExpNeg(d, ld(y)), ld(s), ld(dy)), dx); });
}

void AttentionGradRow(const float* p, float* ds, int64_t n, float scale) {
  const DF d;
  VF acc = hn::Zero(d);
  ForEachVector(n, [&](auto ld, auto) { acc = hn::MulAdd(ld(ds), ld(p), acc); });
  const VF vr = hn::Set(d, ReduceSum(d, acc)), vs = hn::Set(d, scale);
  ForEachVector(
      n, [&](auto ld, auto st) { st(hn::Mul(hn::Mul(hn::Sub(ld(ds), vr), ld(p)), vs), ds); });
}

void AttentionGradRowDropout(const float* p, const float* pd, float* ds, int64_t n, float scale) {
  const DF d;
  VF acc = hn::Zero(d);
  ForEachVector(n, [&](auto ld, auto st) {
    const VF x = hn::Mul(ld(pd), ld(ds));
    st(x, ds);  // ds now holds P' ∘ dP'
    acc = hn::Add(acc, x);
  });
  const VF vr = hn::Set(d, ReduceSum(d, acc)), vs = hn::Set(d, scale);
  ForEachVector(n,
                [&](auto ld, auto st) { st(hn::Mul(hn::NegMulAdd(ld(p), vr, ld(ds)), vs), ds); });
}

void ScaledExpRow(const float* x, float* y, int64_t n, float c) {
  const VF vc = hn::Set(DF(), c);
  Map(x, y, n, [&vc](DF d, VF v) { return hn::Mul(ExpNeg(d, v), vc); });
}

void RowMulSub(float* y, int64_t n, float a, float b) {
  const VF va = hn::Set(DF(), a), vb = hn::Set(DF(), b);
  Map(y, y, n, [&va, &vb](DF, VF v) { return hn::MulSub(v, va, vb); });
}

}  // namespace onyx::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace onyx::simd {
HWY_EXPORT(SoftmaxRow);
HWY_EXPORT(LogSoftmaxRow);
HWY_EXPORT(SoftmaxColsExp);
HWY_EXPORT(SoftmaxGradRow);
HWY_EXPORT(LogSoftmaxGradRow);
HWY_EXPORT(LogSoftmaxGradCols);
HWY_EXPORT(AttentionGradRow);
HWY_EXPORT(AttentionGradRowDropout);
HWY_EXPORT(ScaledExpRow);
HWY_EXPORT(RowMulSub);
void softmax_row(const float* x, float* y, int64_t n) { HWY_DYNAMIC_DISPATCH(SoftmaxRow)(x, y, n); }
void log_softmax_row(const float* x, float* y, int64_t n) {
  HWY_DYNAMIC_DISPATCH(LogSoftmaxRow)(x, y, n);
}
void softmax_cols_exp(const float* x, const float* m, float* y, float* s, int64_t n) {
  HWY_DYNAMIC_DISPATCH(SoftmaxColsExp)(x, m, y, s, n);
}
void softmax_grad_row(const float* dy, const float* y, float* dx, int64_t n) {
  HWY_DYNAMIC_DISPATCH(SoftmaxGradRow)(dy, y, dx, n);
}
void log_softmax_grad_row(const float* dy, const float* y, float* dx, int64_t n) {
  HWY_DYNAMIC_DISPATCH(LogSoftmaxGradRow)(dy, y, dx, n);
}
void log_softmax_grad_cols(const float* dy, const float* y, const float* s, float* dx, int64_t n) {
  HWY_DYNAMIC_DISPATCH(LogSoftmaxGradCols)(dy, y, s, dx, n);
}
void attention_grad_row(const float* p, float* ds, int64_t n, float scale) {
  HWY_DYNAMIC_DISPATCH(AttentionGradRow)(p, ds, n, scale);
}
void attention_grad_row_dropout(const float* p, const float* pd, float* ds, int64_t n,
                                float scale) {
  HWY_DYNAMIC_DISPATCH(AttentionGradRowDropout)(p, pd, ds, n, scale);
}
void scaled_exp_row(const float* x, float* y, int64_t n, float c) {
  HWY_DYNAMIC_DISPATCH(ScaledExpRow)(x, y, n, c);
}
void row_mul_sub(float* y, int64_t n, float a, float b) {
  HWY_DYNAMIC_DISPATCH(RowMulSub)(y, n, a, b);
}
}  // namespace onyx::simd
#endif
