// kernels/norm/mvn.cc — MeanVarianceNormalization (ONNX domain ""), as its function body
// defines it.
#include <cmath>
#include <vector>

#include "kernels/cpu/nn_util.h"
#include "kernels/kernel_api.h"

namespace onyx::kernels {
namespace {

using namespace nnutil;

// ---- MeanVarianceNormalization ------------------------------------------------------------------
// Y = (X - E[X]) / (sqrt(E[X^2] - E[X]^2) + 1e-9) over `axes` (default [0, 2, 3]), as the ONNX
// function body defines it. Rare op: statistics in double, one thread.
OpKernel make_mvn_kernel() {
  OpKernel k;
  k.infer = [](InferContext& ctx) {
    const TensorMeta& x = ctx.input(0);
    for (int64_t a : ctx.node.attr_ints("axes", {0, 2, 3})) normalize_axis(a, x.rank(), ctx.node);
    ctx.set_output(0, x.dtype, x.shape);
  };
  k.compute = [](KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    const Shape& s = x.shape();
    int64_t rank = x.rank();
    std::vector<bool> red(rank, false);
    for (int64_t a : ctx.node.attr_ints("axes", {0, 2, 3}))
      red[normalize_axis(a, rank, ctx.node)] = true;
    // group index of each element = its index over the kept axes
    int64_t groups = 1;
    for (int64_t i = 0; i < rank; i++)
      if (!red[i]) groups *= s[i];
    int64_t n = x.numel();
    if (n == 0) return;
    std::vector<int64_t> gidx(n);
    std::vector<int64_t> idx(rank, 0);
    for (int64_t e = 0; e < n; e++) {
      int64_t g = 0;
      for (int64_t i = 0; i < rank; i++)
        if (!red[i]) g = g * s[i] + idx[i];
      gidx[e] = g;
      for (int64_t i = rank - 1; i >= 0; i--) {
        if (++idx[i] < s[i]) break;
        idx[i] = 0;
      }
    }
    double count = (double)(n / groups);
    Tensor& yt = ctx.output(0);
    dispatch(x.dtype(), kFloats, ctx.node, [&](auto tag) {
      using T = decltype(tag);
      const T* xp = x.data<T>();
      T* yp = yt.data<T>();
      std::vector<double> sum(groups, 0.0), sq(groups, 0.0);
      for (int64_t e = 0; e < n; e++) {
        double v = Elem<T>::load(xp[e]);
        sum[gidx[e]] += v;
        sq[gidx[e]] += v * v;
      }
      for (int64_t g = 0; g < groups; g++) {
        sum[g] /= count;
        double var = sq[g] / count - sum[g] * sum[g];
        sq[g] = std::sqrt(var > 0 ? var : 0.0) + 1e-9;
      }
      for (int64_t e = 0; e < n; e++)
        yp[e] = Elem<T>::store((Elem<T>::load(xp[e]) - sum[gidx[e]]) / sq[gidx[e]]);
    });
  };
  return k;
}

}  // namespace

ONYX_REGISTER_KERNELS(mvn, Cpu) { r.add("", "MeanVarianceNormalization", make_mvn_kernel()); }

}  // namespace onyx::kernels
