// kernels/norm/group_norm.cc — GroupNormalization (ONNX domain "", opset 18: scale and bias per
// group; opset 21: per channel, stash_type) and its backward onyx.GroupNormGrad, which also serves
// InstanceNormalization (num_groups = C, per-channel scale; autodiff/gradients/nn_spatial.cc):
//   GroupNormGrad(dY, X, scale)  num_groups epsilon per_channel  -> dX, dscale, dbias
// x (N, C, d...) is viewed as (N, G, C/G · d); each (n, g) is normalized over its C/G · d
// elements: y = (x − mean) / sqrt(var + epsilon) · scale + bias. The backward recomputes the
// statistics (the forward saves none) and gives
//   dx = inv · (dŷ − mean(dŷ) − x̂ · mean(dŷ · x̂)),  dŷ = dy · scale   over each (n, g),
//   dscale = Σ dy · x̂, dbias = Σ dy  over n and d (and the group's channels when per group).
// float32 runs on the SIMD rows of kernels/cpu/simd/norm.cc (statistics and per-channel sums in
// float32 vector lanes, as LayerNorm's and PyTorch's GroupNorm; the per-channel sums combined in
// double): the scalar double loops they replace ran the Fashion-MNIST UNet's GroupNorms 4× slower
// than PyTorch. Other dtypes: statistics and sums in double. (n, g) blocks are threaded, the
// per-(n, c) partial sums of dscale/dbias are added over n in order afterwards, so results do not
// depend on threads.
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/cpu/nn_util.h"
#include "kernels/cpu/simd/nn.h"
#include "kernels/cpu/simd/simd.h"
#include "kernels/kernel_api.h"

namespace onyx::kernels {
namespace {

using namespace nnutil;

struct GNDims {
  int64_t N, C, S, G, Cg;
};

GNDims gn_dims(const ir::Node& node, const Shape& x, int64_t groups) {
  ONYX_CHECK(x.size() >= 2, node.describe(), ": input must have rank >= 2, got ", shape_str(x));
  GNDims d{x[0], x[1], 1, groups, 0};
  for (size_t i = 2; i < x.size(); i++) d.S *= x[i];
  ONYX_CHECK(groups >= 1 && d.C % groups == 0, node.describe(), ": num_groups ", groups,
             " must divide the ", d.C, " channels of input ", shape_str(x));
  d.Cg = d.C / groups;
  return d;
}

// scale/bias per channel (opset >= 21) or per group (opset 18).
bool gn_per_channel(int64_t opset) { return opset >= 21; }

void check_affine(const ir::Node& node, const TensorMeta& t, const GNDims& d, bool per_channel,
                  const char* what) {
  int64_t want = per_channel ? d.C : d.G;
  ONYX_CHECK(t.numel() == want, node.describe(), ": ", what, " must have ", want,
             " elements (one per ", per_channel ? "channel" : "group", "), got shape ",
             shape_str(t.shape));
}

// Mean and 1/sqrt(var + eps) of x[(n, g)] (Cg·S contiguous elements).
template <class T>
void group_stats(const T* x, int64_t n, double eps, double& mean, double& inv) {
  double s = 0;
  for (int64_t i = 0; i < n; i++) s += Elem<T>::load(x[i]);
  mean = n > 0 ? s / (double)n : 0;
  double ss = 0;
  for (int64_t i = 0; i < n; i++) {
    double v = Elem<T>::load(x[i]) - mean;
    ss += v * v;
  }
  inv = 1.0 / std::sqrt((n > 0 ? ss / (double)n : 0) + eps);
}

// What a forward or backward needs besides the tensors: dims, scale (and bias) as doubles.
struct GNAffine {
  GNDims d;
  bool per_channel;
  std::vector<double> scale, bias;
  double eps;
  double gamma(int64_t c) const { return per_channel ? scale[c] : scale[c / d.Cg]; }
  double beta(int64_t c) const { return per_channel ? bias[c] : bias[c / d.Cg]; }
};

// Mean and 1/sqrt(var + eps) of one (n, g) block: float32 on the SIMD rows (two passes, vector
// lanes, as LayerNorm's), other dtypes in double.
template <class T>
void block_stats(const T* x, int64_t n, double eps, double& mean, double& inv) {
  if constexpr (std::is_same_v<T, float>) {
    const float m = n > 0 ? simd::row_sum(x, n) / (float)n : 0.0f;
    const float var = n > 0 ? simd::row_sum_sq_dev(x, n, m) / (float)n : 0.0f;
    mean = m;
    inv = 1.0 / std::sqrt((double)var + eps);
  } else {
    group_stats(x, n, eps, mean, inv);
  }
}

// y = (x - mean) * inv * scale + bias over block q (channels g·Cg.. of sample q / G).
template <class T>
void normalize_group(const GNAffine& p, int64_t q, const T* xq, T* yq) {
  const int64_t g = q % p.d.G, D = p.d.Cg * p.d.S;
  double mean, inv;
  block_stats(xq, D, p.eps, mean, inv);
  for (int64_t cc = 0; cc < p.d.Cg; cc++) {
    const int64_t c = g * p.d.Cg + cc;
    const double a = p.gamma(c) * inv;
    const T* xr = xq + cc * p.d.S;
    T* yr = yq + cc * p.d.S;
    if constexpr (std::is_same_v<T, float>) {
      simd::scale_shift_row(xr, yr, p.d.S, (float)mean, (float)a, (float)p.beta(c));
    } else {
      const double bb = p.beta(c) - mean * a;
      for (int64_t i = 0; i < p.d.S; i++) yr[i] = Elem<T>::store(Elem<T>::load(xr[i]) * a + bb);
    }
  }
}

// Per channel of block q: Σ dy and Σ dy·x̂ (x̂ = (x − mean)·inv), into sdy / sdyx.
template <class T>
void channel_sums(const GNDims& d, const T* xq, const T* dq, double mean, double inv, double* sdy,
                  double* sdyx) {
  for (int64_t cc = 0; cc < d.Cg; cc++) {
    const T* xr = xq + cc * d.S;
    const T* dr = dq + cc * d.S;
    if constexpr (std::is_same_v<T, float>) {
      float a, b;
      simd::norm_grad_sums_row(dr, xr, d.S, (float)mean, &a, &b);
      sdy[cc] = a;
      sdyx[cc] = b * inv;
    } else {
      double a = 0, b = 0;
      for (int64_t i = 0; i < d.S; i++) {
        const double gv = Elem<T>::load(dr[i]);
        a += gv;
        b += gv * ((Elem<T>::load(xr[i]) - mean) * inv);  // dy · x̂, as before
      }
      sdy[cc] = a;
      sdyx[cc] = b;
    }
  }
}

// dx of block q = sample n, group g: inv · (dy·γ − m1 − x̂·m2), m1 = mean(dy·γ), m2 = mean(dy·γ·x̂)
// over the block; the per-(n, c) sums Σ dy and Σ dy·x̂ go to pdb / pds.
template <class T>
void group_grad(const GNAffine& p, int64_t q, const T* xq, const T* dq, T* oq, double* pds,
                double* pdb) {
  const GNDims& d = p.d;
  const int64_t n = q / d.G, g = q % d.G, c0 = g * d.Cg, D = d.Cg * d.S;
  double mean, inv;
  block_stats(xq, D, p.eps, mean, inv);
  double* sdy = pdb + n * d.C + c0;
  double* sdyx = pds + n * d.C + c0;
  channel_sums(d, xq, dq, mean, inv, sdy, sdyx);
  double s1 = 0, s2 = 0;
  for (int64_t cc = 0; cc < d.Cg; cc++) {
    s1 += p.gamma(c0 + cc) * sdy[cc];
    s2 += p.gamma(c0 + cc) * sdyx[cc];
  }
  const double m1 = D > 0 ? s1 / (double)D : 0, m2 = D > 0 ? s2 / (double)D : 0;
  for (int64_t cc = 0; cc < d.Cg; cc++) {
    const double gam = p.gamma(c0 + cc);
    const int64_t at = cc * d.S;
    if constexpr (std::is_same_v<T, float>) {  // dy·(inv·γ) + (x − mean)·(−inv²·m2) − inv·m1
      simd::norm_grad_row(dq + at, xq + at, oq + at, d.S, (float)(inv * gam),
                          (float)(-inv * inv * m2), (float)mean, (float)(-inv * m1));
    } else {
      for (int64_t i = 0; i < d.S; i++) {
        const double xh = (Elem<T>::load(xq[at + i]) - mean) * inv;
        oq[at + i] = Elem<T>::store(inv * (Elem<T>::load(dq[at + i]) * gam - m1 - xh * m2));
      }
    }
  }
}

OpKernel make_group_norm_kernel() {
  OpKernel k;
  k.infer = [](InferContext& ctx) {
    const TensorMeta& x = ctx.input(0);
    GNDims d = gn_dims(ctx.node, x.shape, ctx.node.attr_int_required("num_groups"));
    bool pc = gn_per_channel(ctx.opset);
    check_affine(ctx.node, ctx.input(1), d, pc, "scale");
    check_affine(ctx.node, ctx.input(2), d, pc, "bias");
    int64_t st = ctx.node.attr_int("stash_type", 1);
    if (st != 1 && st != 11)
      ONYX_UNSUPPORTED(ctx.node.describe(), ": stash_type ", st, " (float32 or float64 only)");
    ctx.set_output(0, x.dtype, x.shape);
  };
  k.compute = [](KernelContext& ctx) {
    const Tensor& xt = ctx.input(0);
    GNAffine p{gn_dims(ctx.node, xt.shape(), ctx.node.attr_int_required("num_groups")),
               gn_per_channel(ctx.opset), ctx.input(1).to_double_vector(),
               ctx.input(2).to_double_vector(), ctx.node.attr_float("epsilon", 1e-5f)};
    Tensor& yt = ctx.output(0);
    if (xt.numel() == 0) return;
    const int64_t D = p.d.Cg * p.d.S;
    dispatch(xt.dtype(), kFloats, ctx.node, [&](auto tag) {
      using T = decltype(tag);
      const T* x = xt.data<T>();
      T* y = yt.data<T>();
      parallel_for(p.d.N * p.d.G, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, D)),
                   [&](int64_t b, int64_t e) {
                     for (int64_t q = b; q < e; q++) normalize_group(p, q, x + q * D, y + q * D);
                   });
    });
  };
  return k;
}

OpKernel make_group_norm_grad_kernel() {
  OpKernel k;
  k.infer = [](InferContext& ctx) {
    const TensorMeta& dy = ctx.input(0);
    const TensorMeta& x = ctx.input(1);
    ONYX_CHECK(dy.shape == x.shape, ctx.node.describe(), ": dY ", shape_str(dy.shape), " and X ",
               shape_str(x.shape), " must have the same shape");
    GNDims d = gn_dims(ctx.node, x.shape, ctx.node.attr_int_required("num_groups"));
    bool pc = ctx.node.attr_int("per_channel", 1) != 0;
    const TensorMeta& scale = ctx.input(2);
    check_affine(ctx.node, scale, d, pc, "scale");
    ctx.set_output(0, x.dtype, x.shape);
    for (int i = 1; i < ctx.num_outputs() && i < 3; i++)
      ctx.set_output(i, scale.dtype, scale.shape);
  };
  k.compute = [](KernelContext& ctx) {
    const Tensor& dyt = ctx.input(0);
    const Tensor& xt = ctx.input(1);
    GNAffine p{gn_dims(ctx.node, xt.shape(), ctx.node.attr_int_required("num_groups")),
               ctx.node.attr_int("per_channel", 1) != 0,
               ctx.input(2).to_double_vector(),
               {},
               ctx.node.attr_float("epsilon", 1e-5f)};
    const GNDims& d = p.d;
    const bool pc = p.per_channel;
    const int64_t D = d.Cg * d.S;
    std::vector<double> pds(d.N * d.C, 0.0), pdb(d.N * d.C, 0.0);  // per (n, c)
    if (xt.numel() > 0) {
      dispatch(xt.dtype(), kFloats, ctx.node, [&](auto tag) {
        using T = decltype(tag);
        const T* x = xt.data<T>();
        const T* dy = dyt.data<T>();
        T* dx = ctx.output(0).data<T>();
        parallel_for(d.N * d.G, std::max<int64_t>(1, 8192 / std::max<int64_t>(1, D)),
                     [&](int64_t b, int64_t e) {
                       for (int64_t q = b; q < e; q++)
                         group_grad(p, q, x + q * D, dy + q * D, dx + q * D, pds.data(),
                                    pdb.data());
                     });
      });
    }
    for (int o = 1; o <= 2; o++) {
      if (!ctx.has_output(o)) continue;
      const std::vector<double>& part = o == 1 ? pds : pdb;
      int64_t cnt = pc ? d.C : d.G;
      std::vector<double> tot(cnt, 0.0);
      for (int64_t n = 0; n < d.N; n++)
        for (int64_t c = 0; c < d.C; c++) tot[pc ? c : c / d.Cg] += part[n * d.C + c];
      Tensor& out = ctx.output(o);
      dispatch(out.dtype(), kFloats, ctx.node, [&](auto tag) {
        using P = decltype(tag);
        for (int64_t i = 0; i < cnt; i++) out.data<P>()[i] = Elem<P>::store(tot[i]);
      });
    }
  };
  return k;
}

}  // namespace

ONYX_REGISTER_KERNELS(group_norm, Cpu) {
  r.add("", "GroupNormalization", make_group_norm_kernel()).precision = OpTraits::Precision::Fp32;
  r.add("onyx", "GroupNormGrad", make_group_norm_grad_kernel()).precision =
      OpTraits::Precision::Fp32;
}

}  // namespace onyx::kernels
