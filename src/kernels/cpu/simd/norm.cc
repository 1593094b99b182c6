// kernels/cpu/simd/norm.cc — the rows of LayerNormalization (and InstanceNormalization, which
// normalizes through it), onyx.RMSNorm and their fused gradients LayerNormGrad / RMSNormGrad, and
// GroupNormalization's per-channel rows, for every SIMD path (see nn.h). The op kernels (nn.cc)
// keep dtypes, shapes, threading and the blocked dscale / dbias reduction; these run one row.
// Hand-written because GCC 12 at -O2 does not vectorize the float reductions (the statistics and
// the gradients' row sums), and these rows sit on the transformer hot path forward and backward.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/simd/norm.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <cmath>

#include "kernels/cpu/simd/math-inl.h"
#include "kernels/cpu/simd/nn.h"
#include "kernels/cpu/simd/rows-inl.h"

HWY_BEFORE_NAMESPACE();
namespace onyx::simd::HWY_NAMESPACE {

// y = (x - mean) * inv * scale [+ bias]; two passes for the statistics. xhat (may be null)
// receives the normalized row (x - mean) * inv as the same pass computes it.
void LayerNormRow(const float* x, float* y, int64_t n, const float* scale, const float* bias,
                  float eps, float* mean_out, float* inv_out, float* xhat) {
  const float mean = RowSum(x, n) / (float)n;
  const float var = RowSumSqDev(x, n, mean) / (float)n;
  const float inv = 1.0f / std::sqrt(var + eps);
  const VF vm = hn::Set(DF(), mean), vi = hn::Set(DF(), inv);
  if (bias) {
    ForEachVector(n, [&](auto ld, auto st) {
      const VF nrm = hn::Mul(hn::Sub(ld(x), vm), vi);
      st(hn::MulAdd(nrm, ld(scale), ld(bias)), y);
      if (xhat) st(nrm, xhat);
    });
  } else {
    ForEachVector(n, [&](auto ld, auto st) {
      const VF nrm = hn::Mul(hn::Sub(ld(x), vm), vi);
      st(hn::Mul(nrm, ld(scale)), y);
      if (xhat) st(nrm, xhat);
    });
  }
  *mean_out = mean;
  *inv_out = inv;
}

// xhat = (x - mean) * inv, g = dy * scale: dx = (g - mean(g) - xhat * mean(g * xhat)) * inv,
// ds += dy * xhat, db += dy. (The tail's zero-filled lanes have dy = 0, so g = 0.) With
// `normalized`, x already holds xhat (the forward's, saved): it is read as it is.
void LayerNormGradRow(const float* dy, const float* x, const float* scale, float mean, float inv,
                      int64_t n, float* dx, float* ds, float* db, bool normalized) {
  const DF d;
  // xhat = (x - vm) * vx: exactly x itself when normalized (x - 0, times 1)
  const VF vm = hn::Set(d, normalized ? 0.0f : mean), vx = hn::Set(d, normalized ? 1.0f : inv);
  const VF vi = hn::Set(d, inv);
  VF sg = hn::Zero(d), sgx = sg;
  ForEachVector(n, [&](auto ld, auto st) {
    const VF dv = ld(dy);
    const VF xh = hn::Mul(hn::Sub(ld(x), vm), vx);
    const VF g = hn::Mul(dv, ld(scale));
    sg = hn::Add(sg, g);
    sgx = hn::MulAdd(g, xh, sgx);
    st(hn::MulAdd(dv, xh, ld(ds)), ds);
    st(hn::Add(dv, ld(db)), db);
  });
  const float mg = ReduceSum(d, sg) / (float)n, mgx = ReduceSum(d, sgx) / (float)n;
  const VF vmg = hn::Set(d, mg), vmgx = hn::Set(d, mgx);
  ForEachVector(n, [&](auto ld, auto st) {
    const VF xh = hn::Mul(hn::Sub(ld(x), vm), vx);
    const VF g = hn::Mul(ld(dy), ld(scale));
    st(hn::Mul(hn::NegMulAdd(xh, vmgx, hn::Sub(g, vmg)), vi), dx);
  });
}

// y = x * inv * scale, inv = 1 / sqrt(mean(x^2) + eps): the squares rounded into y first and
// summed by row_sum, as the unfused Mul and ReduceMean kernels take them. xhat (may be null)
// receives x * inv.
float RmsNormRow(const float* x, float* y, int64_t n, const float* scale, float eps, float* xhat) {
  Map(x, y, n, [](DF, VF v) { return hn::Mul(v, v); });
  const float inv = 1.0f / std::sqrt(RowSum(y, n) / (float)n + eps);
  const VF vi = hn::Set(DF(), inv);
  ForEachVector(n, [&](auto ld, auto st) {
    const VF xh = hn::Mul(ld(x), vi);
    st(hn::Mul(xh, ld(scale)), y);
    if (xhat) st(xh, xhat);
  });
  return inv;
}

// xhat = x * inv, g = dy * scale: dx = (g - xhat * mean(g * xhat)) * inv, ds += dy * xhat. With
// `normalized`, x already holds xhat (the forward's, saved).
void RmsNormGradRow(const float* dy, const float* x, const float* scale, float inv, int64_t n,
                    float* dx, float* ds, bool normalized) {
  const DF d;
  const VF vi = hn::Set(d, inv), vx = hn::Set(d, normalized ? 1.0f : inv);
  VF sgx = hn::Zero(d);
  ForEachVector(n, [&](auto ld, auto st) {
    const VF dv = ld(dy);
    const VF xh = hn::Mul(ld(x), vx);
    sgx = hn::MulAdd(hn::Mul(dv, ld(scale)), xh, sgx);
    st(hn::MulAdd(dv, xh, ld(ds)), ds);
  });
  const VF vmgx = hn::Set(d, ReduceSum(d, sgx) / (float)n);
  ForEachVector(n, [&](auto ld, auto st) {
    const VF xh = hn::Mul(ld(x), vx);
    const VF g = hn::Mul(ld(dy), ld(scale));
    st(hn::Mul(hn::NegMulAdd(xh, vmgx, g), vi), dx);
  });
}

// GroupNorm's rows (kernels/norm/group_norm.cc): y = (x - c) * a + b, one channel's stretch.
void ScaleShiftRow(const float* x, float* y, int64_t n, float c, float a, float b) {
  const VF vc = hn::Set(DF(), c), va = hn::Set(DF(), a), vb = hn::Set(DF(), b);
  ForEachVector(n, [&](auto ld, auto st) { st(hn::MulAdd(hn::Sub(ld(x), vc), va, vb), y); });
}

// *s_dy = sum(dy), *s_dyx = sum(dy * (x - c)). (The tail's zero-filled lanes have dy = 0.)
void GradSumsRow(const float* dy, const float* x, int64_t n, float c, float* s_dy, float* s_dyx) {
  const DF d;
  const VF vc = hn::Set(d, c);
  VF a = hn::Zero(d), b = a;
  ForEachVector(n, [&](auto ld, auto) {
    const VF dv = ld(dy);
    a = hn::Add(a, dv);
    b = hn::MulAdd(dv, hn::Sub(ld(x), vc), b);
  });
  *s_dy = ReduceSum(d, a);
  *s_dyx = ReduceSum(d, b);
}

// dx = dy * a + (x - c) * b + e.
void GradRow(const float* dy, const float* x, float* dx, int64_t n, float a, float b, float c,
             float e) {
  const DF d;
  const VF va = hn::Set(d, a), vb = hn::Set(d, b), vc = hn::Set(d, c), ve = hn::Set(d, e);
  ForEachVector(n, [&](auto ld, auto st) {
    st(hn::MulAdd(ld(dy), va, hn::MulAdd(hn::Sub(ld(x), vc), vb, ve)), dx);
  });
}

}  // namespace onyx::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace onyx::simd {
HWY_EXPORT(LayerNormRow);
HWY_EXPORT(LayerNormGradRow);
HWY_EXPORT(RmsNormRow);
HWY_EXPORT(RmsNormGradRow);
HWY_EXPORT(ScaleShiftRow);
HWY_EXPORT(GradSumsRow);
HWY_EXPORT(GradRow);
void scale_shift_row(const float* x, float* y, int64_t n, float c, float a, float b) {
  HWY_DYNAMIC_DISPATCH(ScaleShiftRow)(x, y, n, c, a, b);
}
void norm_grad_sums_row(const float* dy, const float* x, int64_t n, float c, float* s_dy,
                        float* s_dyx) {
  HWY_DYNAMIC_DISPATCH(GradSumsRow)(dy, x, n, c, s_dy, s_dyx);
}
void norm_grad_row(const float* dy, const float* x, float* dx, int64_t n, float a, float b, float c,
                   float e) {
  HWY_DYNAMIC_DISPATCH(GradRow)(dy, x, dx, n, a, b, c, e);
}
void layer_norm_row(const float* x, float* y, int64_t n, const float* scale, const float* bias,
                    float eps, float* mean, float* inv, float* xhat) {
  HWY_DYNAMIC_DISPATCH(LayerNormRow)(x, y, n, scale, bias, eps, mean, inv, xhat);
}
void layer_norm_grad_row(const float* dy, const float* x, const float* scale, float mean, float inv,
                         int64_t n, float* dx, float* ds, float* db, bool normalized) {
  HWY_DYNAMIC_DISPATCH(LayerNormGradRow)(dy, x, scale, mean, inv, n, dx, ds, db, normalized);
}
float rms_norm_row(const float* x, float* y, int64_t n, const float* scale, float eps,
                   float* xhat) {
  return HWY_DYNAMIC_DISPATCH(RmsNormRow)(x, y, n, scale, eps, xhat);
}
void rms_norm_grad_row(const float* dy, const float* x, const float* scale, float inv, int64_t n,
                       float* dx, float* ds, bool normalized) {
  HWY_DYNAMIC_DISPATCH(RmsNormGradRow)(dy, x, scale, inv, n, dx, ds, normalized);
}
}  // namespace onyx::simd
#endif
