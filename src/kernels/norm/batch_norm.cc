// kernels/norm/batch_norm.cc — BatchNormalization (training and inference mode, its running
// statistics written back in training) and InstanceNormalization (ONNX domain ""), and the fused
// backward onyx.BatchNormGrad(dy, x, scale, mean, var) -> dx, dscale, dbias. Per-channel
// statistics in double over (N, S).
#include <cmath>
#include <vector>

#include "kernels/cpu/nn_util.h"
#include "kernels/cpu/simd/nn.h"
#include "kernels/kernel_api.h"

namespace onyx::kernels {
namespace {

using namespace nnutil;

// ---- BatchNormalization / InstanceNormalization -------------------------------------------------

// x viewed as (N, C, S).
void ncs_dims(const Shape& s, const ir::Node& node, int64_t& N, int64_t& C, int64_t& S) {
  ONYX_CHECK(s.size() >= 2, node.describe(), ": input must have rank >= 2, got ", shape_str(s));
  N = s[0];
  C = s[1];
  S = 1;
  for (size_t i = 2; i < s.size(); i++) S *= s[i];
}

void check_channel_vec(const Tensor& t, int64_t C, const ir::Node& node, const char* what) {
  ONYX_CHECK(t.numel() == C, node.describe(), ": ", what, " must have ", C, " elements, got shape ",
             shape_str(t.shape()));
}

std::vector<double> as_doubles(const Tensor& t) { return t.to_double_vector(); }

bool bn_training(const KernelContext& ctx) {
  return ctx.opset >= 14 && ctx.node.attr_int("training_mode", 0) != 0;
}

OpKernel make_batch_norm_kernel() {
  OpKernel k;
  k.infer = [](InferContext& ctx) {
    const TensorMeta& x = ctx.input(0);
    ONYX_CHECK(x.rank() >= 2, ctx.node.describe(), ": input must have rank >= 2, got ",
               shape_str(x.shape));
    if (ctx.opset < 9 && ctx.node.attr_int("spatial", 1) == 0)
      ONYX_UNSUPPORTED(ctx.node.describe(), ": spatial=0 is not supported");
    bool training = ctx.opset >= 14 && ctx.node.attr_int("training_mode", 0) != 0;
    ctx.set_output(0, x.dtype, x.shape);
    if (ctx.num_outputs() > 1) {
      if (!training) {
        // Opsets < 14 put training statistics here; an inference node lists only Y.
        for (int i = 1; i < ctx.num_outputs(); i++)
          if (!ctx.node.outputs[i].empty())
            ONYX_UNSUPPORTED(ctx.node.describe(),
                             ": training-mode outputs need opset >= 14 with training_mode=1");
      } else {
        const TensorMeta& mean = ctx.input(3);
        for (int i = 1; i < ctx.num_outputs() && i < 3; i++)
          ctx.set_output(i, mean.dtype, {x.shape[1]});
      }
    }
  };
  k.compute = [](KernelContext& ctx) {
    const ir::Node& node = ctx.node;
    const Tensor& xt = ctx.input(0);
    int64_t N, C, S;
    ncs_dims(xt.shape(), node, N, C, S);
    const char* names[] = {"", "scale", "B", "input_mean", "input_var"};
    for (int i = 1; i <= 4; i++) check_channel_vec(ctx.input(i), C, node, names[i]);
    std::vector<double> scale = as_doubles(ctx.input(1)), bias = as_doubles(ctx.input(2));
    std::vector<double> mean = as_doubles(ctx.input(3)), var = as_doubles(ctx.input(4));
    double eps = node.attr_float("epsilon", 1e-5f);
    bool training = bn_training(ctx);
    const Tensor& x = xt;
    if (training) {
      double momentum = node.attr_float("momentum", 0.9f);
      // ONNX: running_var = input_var * momentum + current_var * (1 - momentum) with current_var
      // the population variance (the spec: "this formula does not use sample size N - 1"), as
      // here by default. PyTorch's BatchNorm updates running_var with the unbiased batch variance
      // (N - 1); train::TrainingSession asks for that with the onyx-internal attribute
      // onyx_unbiased_var=1 (config batch_norm_running_var: unbiased). Y always uses the
      // population variance, as both define it.
      const bool unbiased = node.attr_int("onyx_unbiased_var", 0) != 0;
      std::vector<double> bm(C, 0.0), bv(C, 0.0);
      dispatch(x.dtype(), kFloats, node, [&](auto tag) {
        using T = decltype(tag);
        const T* xp = x.data<T>();
        parallel_for(C, 1, [&](int64_t b, int64_t e) {
          for (int64_t c = b; c < e; c++) {
            double s = 0, ss = 0;
            for (int64_t n = 0; n < N; n++)
              for (int64_t i = 0; i < S; i++) s += Elem<T>::load(xp[(n * C + c) * S + i]);
            double cnt = (double)(N * S), m = cnt > 0 ? s / cnt : 0;
            for (int64_t n = 0; n < N; n++)
              for (int64_t i = 0; i < S; i++) {
                double d = Elem<T>::load(xp[(n * C + c) * S + i]) - m;
                ss += d * d;
              }
            bm[c] = m;
            bv[c] = cnt > 0 ? ss / cnt : 0;
          }
        });
      });
      const double count = (double)(N * S);
      std::vector<double> bv_run = bv;
      if (unbiased && count > 1)
        for (auto& v : bv_run) v *= count / (count - 1);
      for (int o = 1; o <= 2; o++) {
        if (!ctx.has_output(o)) continue;
        Tensor& out = ctx.output(o);
        const std::vector<double>& run = o == 1 ? mean : var;
        const std::vector<double>& cur = o == 1 ? bm : bv_run;
        dispatch(out.dtype(), kFloats, node, [&](auto tag) {
          using T = decltype(tag);
          T* p = out.data<T>();
          for (int64_t c = 0; c < C; c++)
            p[c] = Elem<T>::store(run[c] * momentum + cur[c] * (1 - momentum));
        });
      }
      mean = bm;
      var = bv;
    }
    // y = x * a + b per channel
    std::vector<float> a(C), b(C);
    for (int64_t c = 0; c < C; c++) {
      double inv = 1.0 / std::sqrt(var[c] + eps);
      a[c] = (float)(scale[c] * inv);
      b[c] = (float)(bias[c] - mean[c] * scale[c] * inv);
    }
    Tensor& yt = ctx.output(0);
    dispatch(x.dtype(), kFloats, node, [&](auto tag) {
      using T = decltype(tag);
      const T* xp = x.data<T>();
      T* yp = yt.data<T>();
      parallel_for(N * C, rows_grain(S), [&](int64_t rb, int64_t re) {
        for (int64_t r = rb; r < re; r++) {
          int64_t c = r % C;
          const T* xr = xp + r * S;
          T* yr = yp + r * S;
          float ac = a[c], bc = b[c];
          if constexpr (std::is_same_v<T, float>) {
#pragma omp simd
            for (int64_t i = 0; i < S; i++) yr[i] = xr[i] * ac + bc;
          } else {
            for (int64_t i = 0; i < S; i++) yr[i] = Elem<T>::store(Elem<T>::load(xr[i]) * ac + bc);
          }
        }
      });
    });
  };
  return k;
}

// ---- onyx.BatchNormGrad -------------------------------------------------------------------------
// BatchNormGrad(dy, x, scale, mean, var) -> dx, dscale, dbias: x (N, C, d..), scale, mean and var
// (C); attributes epsilon, training_mode.
// training_mode=1: the forward normalized with the batch statistics (recomputed here, as the
// forward at opset >= 14 saves none):
//   dx = scale * inv * (dy - mean(dy) - xhat * mean(dy * xhat)) per channel
// training_mode=0: the forward used the given running statistics: dx = dy * scale * inv.
// Both: dscale = sum(dy * xhat), dbias = sum(dy).
OpKernel make_batch_norm_grad_kernel() {
  OpKernel k;
  k.infer = [](InferContext& ctx) {
    const TensorMeta& dy = ctx.input(0);
    const TensorMeta& x = ctx.input(1);
    check_same_shape(ctx.node, dy, x, "dy", "x");
    ONYX_CHECK(x.rank() >= 2, ctx.node.describe(), ": input must have rank >= 2, got ",
               shape_str(x.shape));
    for (int i = 2; i <= 4; i++)
      ONYX_CHECK(ctx.input(i).numel() == x.shape[1], ctx.node.describe(), ": input ", i,
                 " must have ", x.shape[1], " elements, got ", shape_str(ctx.input(i).shape));
    ctx.set_output(0, x.dtype, x.shape);
    for (int i = 1; i < ctx.num_outputs() && i < 3; i++)
      ctx.set_output(i, ctx.input(2).dtype, ctx.input(2).shape);
  };
  k.compute = [](KernelContext& ctx) {
    const ir::Node& node = ctx.node;
    const Tensor& dyt = ctx.input(0);
    const Tensor& xt = ctx.input(1);
    int64_t N, C, S;
    ncs_dims(xt.shape(), node, N, C, S);
    std::vector<double> scale = ctx.input(2).to_double_vector();
    std::vector<double> rmean = ctx.input(3).to_double_vector();
    std::vector<double> rvar = ctx.input(4).to_double_vector();
    double eps = node.attr_float("epsilon", 1e-5f);
    bool training = node.attr_int("training_mode", 0) != 0;
    std::vector<double> ds(C, 0.0), db(C, 0.0);
    double cnt = (double)(N * S);
    dispatch(xt.dtype(), kFloats, node, [&](auto tag) {
      using T = decltype(tag);
      const T* x = xt.data<T>();
      const T* dy = dyt.data<T>();
      T* dx = ctx.output(0).data<T>();
      parallel_for(C, 1, [&](int64_t b, int64_t e) {
        for (int64_t c = b; c < e; c++) {
          double m = rmean[c], var = rvar[c];
          if (training) {
            double sum = 0, ss = 0;
            for (int64_t n = 0; n < N; n++)
              for (int64_t i = 0; i < S; i++) sum += Elem<T>::load(x[(n * C + c) * S + i]);
            m = cnt > 0 ? sum / cnt : 0;
            for (int64_t n = 0; n < N; n++)
              for (int64_t i = 0; i < S; i++) {
                double d = Elem<T>::load(x[(n * C + c) * S + i]) - m;
                ss += d * d;
              }
            var = cnt > 0 ? ss / cnt : 0;
          }
          double inv = 1.0 / std::sqrt(var + eps);
          double sdy = 0, sdyx = 0;
          for (int64_t n = 0; n < N; n++)
            for (int64_t i = 0; i < S; i++) {
              int64_t kk = (n * C + c) * S + i;
              double g = Elem<T>::load(dy[kk]);
              sdy += g;
              sdyx += g * (Elem<T>::load(x[kk]) - m) * inv;
            }
          ds[c] = sdyx;
          db[c] = sdy;
          double a = scale[c] * inv;
          double mg = training && cnt > 0 ? sdy / cnt : 0.0;
          double mgx = training && cnt > 0 ? sdyx / cnt : 0.0;
          for (int64_t n = 0; n < N; n++)
            for (int64_t i = 0; i < S; i++) {
              int64_t kk = (n * C + c) * S + i;
              double g = Elem<T>::load(dy[kk]);
              double xh = (Elem<T>::load(x[kk]) - m) * inv;
              dx[kk] = Elem<T>::store(a * (g - mg - xh * mgx));
            }
        }
      });
    });
    for (int o = 1; o <= 2; o++) {
      if (!ctx.has_output(o)) continue;
      Tensor& out = ctx.output(o);
      const std::vector<double>& v = o == 1 ? ds : db;
      dispatch(out.dtype(), kFloats, node, [&](auto tag) {
        using P = decltype(tag);
        for (int64_t c = 0; c < C; c++) out.data<P>()[c] = Elem<P>::store(v[c]);
      });
    }
  };
  return k;
}

OpKernel make_instance_norm_kernel() {
  OpKernel k;
  k.infer = [](InferContext& ctx) {
    const TensorMeta& x = ctx.input(0);
    ONYX_CHECK(x.rank() >= 2, ctx.node.describe(), ": input must have rank >= 2, got ",
               shape_str(x.shape));
    ctx.set_output(0, x.dtype, x.shape);
  };
  k.compute = [](KernelContext& ctx) {
    const ir::Node& node = ctx.node;
    const Tensor& x = ctx.input(0);
    int64_t N, C, S;
    ncs_dims(x.shape(), node, N, C, S);
    check_channel_vec(ctx.input(1), C, node, "scale");
    check_channel_vec(ctx.input(2), C, node, "B");
    std::vector<double> scale = as_doubles(ctx.input(1)), bias = as_doubles(ctx.input(2));
    float eps = node.attr_float("epsilon", 1e-5f);
    if (x.numel() == 0) return;
    Tensor& yt = ctx.output(0);
    dispatch(x.dtype(), kFloats, node, [&](auto tag) {
      using T = decltype(tag);
      const T* xp = x.data<T>();
      T* yp = yt.data<T>();
      parallel_for(N * C, rows_grain(S), [&](int64_t rb, int64_t re) {
        std::vector<float> xb(S), yb(S), sc(S), bs(S);
        for (int64_t r = rb; r < re; r++) {
          int64_t c = r % C;
          std::fill(sc.begin(), sc.end(), (float)scale[c]);
          std::fill(bs.begin(), bs.end(), (float)bias[c]);
          for (int64_t i = 0; i < S; i++) xb[i] = Elem<T>::load(xp[r * S + i]);
          float m, inv;
          simd::layer_norm_row(xb.data(), yb.data(), S, sc.data(), bs.data(), eps, &m, &inv);
          for (int64_t i = 0; i < S; i++) yp[r * S + i] = Elem<T>::store(yb[i]);
        }
      });
    });
  };
  return k;
}

}  // namespace

ONYX_REGISTER_KERNELS(batch_norm, Cpu) {
  r.add("", "BatchNormalization", make_batch_norm_kernel());
  r.add("", "InstanceNormalization", make_instance_norm_kernel());
  r.add("onyx", "BatchNormGrad", make_batch_norm_grad_kernel());
}

}  // namespace onyx::kernels
