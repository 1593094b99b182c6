// kernels/norm/group_norm.cc — GroupNormalization (ONNX domain "", opset 18: scale and bias per
// group; opset 21: per channel, stash_type) and its backward onyx.GroupNormGrad, which also serves
// InstanceNormalization (num_groups = C, per-channel scale; autodiff/gradients/nn_spatial.cc):
//   GroupNormGrad(dY, X, scale)  num_groups epsilon per_channel  -> dX, dscale, dbias
// x (N, C, d...) is viewed as (N, G, C/G · d); each (n, g) is normalized over its C/G · d
// elements: y = (x − mean) / sqrt(var + epsilon) · scale + bias. The backward recomputes the
// statistics (the forward saves none) and gives
//   dx = inv · (dŷ − mean(dŷ) − x̂ · mean(dŷ · x̂)),  dŷ = dy · scale   over each (n, g),
//   dscale = Σ dy · x̂, dbias = Σ dy  over n and d (and the group's channels when per group).
// Statistics and sums in double; (n, g) blocks are threaded, the per-(n, c) partial sums of
// dscale/dbias are added over n in order afterwards, so results do not depend on threads.
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/nn_util.h"
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
    GNDims d = gn_dims(ctx.node, xt.shape(), ctx.node.attr_int_required("num_groups"));
    bool pc = gn_per_channel(ctx.opset);
    std::vector<double> scale = ctx.input(1).to_double_vector();
    std::vector<double> bias = ctx.input(2).to_double_vector();
    double eps = ctx.node.attr_float("epsilon", 1e-5f);
    Tensor& yt = ctx.output(0);
    if (xt.numel() == 0) return;
    int64_t D = d.Cg * d.S;
    dispatch(xt.dtype(), kFloats, ctx.node, [&](auto tag) {
      using T = decltype(tag);
      const T* x = xt.data<T>();
      T* y = yt.data<T>();
      parallel_for(d.N * d.G, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, D)),
                   [&](int64_t b, int64_t e) {
                     for (int64_t q = b; q < e; q++) {
                       int64_t g = q % d.G;
                       const T* xq = x + q * D;
                       T* yq = y + q * D;
                       double mean, inv;
                       group_stats(xq, D, eps, mean, inv);
                       for (int64_t cc = 0; cc < d.Cg; cc++) {
                         int64_t c = g * d.Cg + cc;
                         double a = (pc ? scale[c] : scale[g]) * inv;
                         double bb = (pc ? bias[c] : bias[g]) - mean * a;
                         const T* xr = xq + cc * d.S;
                         T* yr = yq + cc * d.S;
                         for (int64_t i = 0; i < d.S; i++)
                           yr[i] = Elem<T>::store(Elem<T>::load(xr[i]) * a + bb);
                       }
                     }
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
    GNDims d = gn_dims(ctx.node, xt.shape(), ctx.node.attr_int_required("num_groups"));
    bool pc = ctx.node.attr_int("per_channel", 1) != 0;
    std::vector<double> scale = ctx.input(2).to_double_vector();
    double eps = ctx.node.attr_float("epsilon", 1e-5f);
    int64_t D = d.Cg * d.S;
    std::vector<double> pds(d.N * d.C, 0.0), pdb(d.N * d.C, 0.0);  // per (n, c)
    if (xt.numel() > 0) {
      dispatch(xt.dtype(), kFloats, ctx.node, [&](auto tag) {
        using T = decltype(tag);
        const T* x = xt.data<T>();
        const T* dy = dyt.data<T>();
        T* dx = ctx.output(0).data<T>();
        parallel_for(d.N * d.G, std::max<int64_t>(1, 8192 / std::max<int64_t>(1, D)),
                     [&](int64_t b, int64_t e) {
                       for (int64_t q = b; q < e; q++) {
                         int64_t n = q / d.G, g = q % d.G;
                         const T* xq = x + q * D;
                         const T* dq = dy + q * D;
                         T* oq = dx + q * D;
                         double mean, inv;
                         group_stats(xq, D, eps, mean, inv);
                         double s1 = 0, s2 = 0;
                         for (int64_t cc = 0; cc < d.Cg; cc++) {
                           int64_t c = g * d.Cg + cc;
                           double gam = pc ? scale[c] : scale[g];
                           double sdy = 0, sdyx = 0;
                           for (int64_t i = 0; i < d.S; i++) {
                             double gv = Elem<T>::load(dq[cc * d.S + i]);
                             double xh = (Elem<T>::load(xq[cc * d.S + i]) - mean) * inv;
                             sdy += gv;
                             sdyx += gv * xh;
                           }
                           pdb[n * d.C + c] = sdy;
                           pds[n * d.C + c] = sdyx;
                           s1 += gam * sdy;
                           s2 += gam * sdyx;
                         }
                         double m1 = D > 0 ? s1 / (double)D : 0, m2 = D > 0 ? s2 / (double)D : 0;
                         for (int64_t cc = 0; cc < d.Cg; cc++) {
                           int64_t c = g * d.Cg + cc;
                           double gam = pc ? scale[c] : scale[g];
                           for (int64_t i = 0; i < d.S; i++) {
                             int64_t kk = cc * d.S + i;
                             double xh = (Elem<T>::load(xq[kk]) - mean) * inv;
                             oq[kk] =
                                 Elem<T>::store(inv * (Elem<T>::load(dq[kk]) * gam - m1 - xh * m2));
                           }
                         }
                       }
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
