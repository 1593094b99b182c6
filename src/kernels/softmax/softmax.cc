// kernels/softmax/softmax.cc — Softmax and LogSoftmax (ONNX domain "", opsets 1–13 as each
// defines its axis) and their fused backward kernels ("onyx" domain, emitted by the rules in
// autodiff/gradients/nn.cc, DESIGN decision 6):
//   SoftmaxGrad(dy, y)     dx = y * (dy - sum(dy * y))   over the axis
//   LogSoftmaxGrad(dy, y)  dx = dy - exp(y) * sum(dy)    over the axis
// Hand-written because softmax, forward and backward, sits on the transformer hot path: float32
// rows are threaded over rows here and processed by the SIMD row kernels of simd/nn.h
// (simd/softmax.cc: max-subtracted exp), which run AVX-512, AVX2 or portable code by run-time
// dispatch; other float types convert through float32 or compute in double.
#include <cmath>
#include <vector>

#include "kernels/cpu/nn_util.h"
#include "kernels/cpu/simd/nn.h"
#include "kernels/kernel_api.h"
#include "kernels/softmax/softmax_dims.h"

namespace onyx::kernels {
namespace {

using namespace nnutil;

// ---- Softmax / LogSoftmax -----------------------------------------------------------------------

// float32: rows when I == 1, else column blocks processed with vector exp.
template <bool LOG>
void softmax_f32(const float* x, float* y, SoftmaxDims d) {  // x, y (O,R,I)
  if (d.I == 1) {
    parallel_for(d.O, rows_grain(d.R), [&](int64_t b, int64_t e) {
      for (int64_t o = b; o < e; o++) {
        if constexpr (LOG)
          simd::log_softmax_row(x + o * d.R, y + o * d.R, d.R);
        else
          simd::softmax_row(x + o * d.R, y + o * d.R, d.R);
      }
    });
    return;
  }
  parallel_for(d.O, rows_grain(d.R * d.I), [&](int64_t b, int64_t e) {
    std::vector<float> m(d.I), s(d.I);
    for (int64_t o = b; o < e; o++) {
      const float* xo = x + o * d.R * d.I;
      float* yo = y + o * d.R * d.I;
      std::fill(m.begin(), m.end(), -INFINITY);
      std::fill(s.begin(), s.end(), 0.f);
      float *mp = m.data(), *sp = s.data();
      for (int64_t r = 0; r < d.R; r++) {
        const float* xr = xo + r * d.I;
#pragma omp simd
        for (int64_t j = 0; j < d.I; j++) mp[j] = xr[j] > mp[j] ? xr[j] : mp[j];
      }
      for (int64_t r = 0; r < d.R; r++)
        simd::softmax_cols_exp(xo + r * d.I, mp, LOG ? nullptr : yo + r * d.I, sp, d.I);
      if constexpr (LOG) {
        for (int64_t j = 0; j < d.I; j++) sp[j] = std::log(sp[j]);
        for (int64_t r = 0; r < d.R; r++) {
          const float* xr = xo + r * d.I;
          float* yr = yo + r * d.I;
#pragma omp simd
          for (int64_t j = 0; j < d.I; j++) yr[j] = (xr[j] - mp[j]) - sp[j];
        }
      } else {
        for (int64_t j = 0; j < d.I; j++) sp[j] = 1.0f / sp[j];
        for (int64_t r = 0; r < d.R; r++) {
          float* yr = yo + r * d.I;
#pragma omp simd
          for (int64_t j = 0; j < d.I; j++) yr[j] *= sp[j];
        }
      }
    }
  });
}

// Other float types: double arithmetic, strided.
template <bool LOG, class T>
void softmax_generic(const T* x, T* y, SoftmaxDims d) {
  parallel_for(d.O * d.I, rows_grain(d.R), [&](int64_t b, int64_t e) {
    for (int64_t q = b; q < e; q++) {
      int64_t o = q / d.I, j = q % d.I;
      const T* xq = x + o * d.R * d.I + j;
      T* yq = y + o * d.R * d.I + j;
      double m = -INFINITY;
      for (int64_t r = 0; r < d.R; r++) {
        double v = Elem<T>::load(xq[r * d.I]);
        m = (v > m || v != v) ? v : m;
      }
      double s = 0;
      for (int64_t r = 0; r < d.R; r++) s += std::exp(Elem<T>::load(xq[r * d.I]) - m);
      double ls = std::log(s);
      for (int64_t r = 0; r < d.R; r++) {
        double v = Elem<T>::load(xq[r * d.I]) - m;
        yq[r * d.I] = Elem<T>::store(LOG ? v - ls : std::exp(v) / s);
      }
    }
  });
}

template <bool LOG>
OpKernel make_softmax_kernel() {
  OpKernel k;
  k.infer = [](InferContext& ctx) {
    const TensorMeta& in = ctx.input(0);
    forward_softmax_dims(ctx.node, ctx.opset, in.shape);  // validates axis
    ctx.set_output(0, in.dtype, in.shape);
  };
  k.compute = [](KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    Tensor& y = ctx.output(0);
    SoftmaxDims d = forward_softmax_dims(ctx.node, ctx.opset, x.shape());
    if (x.numel() == 0) return;
    dispatch(x.dtype(), kFloats, ctx.node, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (std::is_same_v<T, float>)
        softmax_f32<LOG>(x.data<float>(), y.data<float>(), d);
      else
        softmax_generic<LOG, T>(x.data<T>(), y.data<T>(), d);
    });
  };
  k.inplace = {{0, 0}};  // every path reads x[i] before it writes y[i]
  return k;
}

// ---- onyx.SoftmaxGrad / onyx.LogSoftmaxGrad -----------------------------------------------------
//   SoftmaxGrad(dy, y)     dx = y * (dy - sum(dy * y))   over the softmax's axes
//   LogSoftmaxGrad(dy, y)  dx = dy - exp(y) * sum(dy)    (y = log-softmax)
// Attributes: axis (default -1); flatten = 1 for the opset < 13 semantics of the forward (the
// input coerced to 2-D at `axis`), which the gradient rule sets for a forward below opset 13.

template <bool LOG>
void softmax_grad_f32(const float* dy, const float* y, float* dx, SoftmaxDims d) {  // all (O, R, I)
  if (d.I == 1) {
    parallel_for(d.O, rows_grain(d.R), [&](int64_t b, int64_t e) {
      for (int64_t o = b; o < e; o++) {
        if constexpr (LOG)
          simd::log_softmax_grad_row(dy + o * d.R, y + o * d.R, dx + o * d.R, d.R);
        else
          simd::softmax_grad_row(dy + o * d.R, y + o * d.R, dx + o * d.R, d.R);
      }
    });
    return;
  }
  // Reduction over a strided axis: tasks are (o, block of 256 inner columns), vectorized over j.
  const int64_t JB = 256;
  int64_t njb = (d.I + JB - 1) / JB;
  parallel_for(d.O * njb, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, d.R * JB)),
               [&](int64_t b, int64_t e) {
                 float s[JB];
                 for (int64_t t = b; t < e; t++) {
                   int64_t o = t / njb, j0 = (t % njb) * JB, nj = std::min(JB, d.I - j0);
                   int64_t base = o * d.R * d.I + j0;
                   for (int64_t j = 0; j < nj; j++) s[j] = 0.f;
                   for (int64_t r = 0; r < d.R; r++) {
                     const float* dyr = dy + base + r * d.I;
                     const float* yr = y + base + r * d.I;
                     if constexpr (LOG) {
#pragma omp simd
                       for (int64_t j = 0; j < nj; j++) s[j] += dyr[j];
                     } else {
#pragma omp simd
                       for (int64_t j = 0; j < nj; j++) s[j] += dyr[j] * yr[j];
                     }
                   }
                   for (int64_t r = 0; r < d.R; r++) {
                     const float* dyr = dy + base + r * d.I;
                     const float* yr = y + base + r * d.I;
                     float* dxr = dx + base + r * d.I;
                     if constexpr (LOG) {
                       simd::log_softmax_grad_cols(dyr, yr, s, dxr, nj);
                     } else {
#pragma omp simd
                       for (int64_t j = 0; j < nj; j++) dxr[j] = yr[j] * (dyr[j] - s[j]);
                     }
                   }
                 }
               });
}

template <bool LOG, class T>
void softmax_grad_generic(const T* dy, const T* y, T* dx, SoftmaxDims d) {
  parallel_for(d.O * d.I, rows_grain(d.R), [&](int64_t b, int64_t e) {
    for (int64_t q = b; q < e; q++) {
      int64_t base = (q / d.I) * d.R * d.I + q % d.I;
      double s = 0;
      for (int64_t r = 0; r < d.R; r++) {
        int64_t k = base + r * d.I;
        s += LOG ? Elem<T>::load(dy[k]) : Elem<T>::load(dy[k]) * Elem<T>::load(y[k]);
      }
      for (int64_t r = 0; r < d.R; r++) {
        int64_t k = base + r * d.I;
        double g = Elem<T>::load(dy[k]), yv = Elem<T>::load(y[k]);
        dx[k] = Elem<T>::store(LOG ? g - std::exp(yv) * s : yv * (g - s));
      }
    }
  });
}

template <bool LOG>
OpKernel make_softmax_grad_kernel() {
  OpKernel k;
  k.infer = [](InferContext& ctx) {
    const TensorMeta& dy = ctx.input(0);
    check_same_shape(ctx.node, dy, ctx.input(1), "dy", "y");
    grad_softmax_dims(ctx.node, dy.shape);  // validates axis
    ctx.set_output(0, dy.dtype, dy.shape);
  };
  k.compute = [](KernelContext& ctx) {
    const Tensor& dy = ctx.input(0);
    const Tensor& y = ctx.input(1);
    Tensor& dx = ctx.output(0);
    ONYX_CHECK(dy.dtype() == y.dtype(), ctx.node.describe(), ": dy and y dtypes differ");
    if (dy.numel() == 0) return;
    SoftmaxDims d = grad_softmax_dims(ctx.node, dy.shape());
    dispatch(dy.dtype(), kFloats, ctx.node, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (std::is_same_v<T, float>)
        softmax_grad_f32<LOG>(dy.data<float>(), y.data<float>(), dx.data<float>(), d);
      else
        softmax_grad_generic<LOG, T>(dy.data<T>(), y.data<T>(), dx.data<T>(), d);
    });
  };
  return k;
}

}  // namespace

ONYX_REGISTER_KERNELS(softmax, Cpu) {
  r.add("", "Softmax", make_softmax_kernel<false>()).precision = OpTraits::Precision::Fp32;
  r.add("", "LogSoftmax", make_softmax_kernel<true>()).precision = OpTraits::Precision::Fp32;
  r.add("onyx", "SoftmaxGrad", make_softmax_grad_kernel<false>());
  r.add("onyx", "LogSoftmaxGrad", make_softmax_grad_kernel<true>());
}

}  // namespace onyx::kernels
