// kernels/softmax/softmax.cu — the CUDA kernels of the softmax family (formulas in softmax.cc's
// header): Softmax, LogSoftmax, onyx.SoftmaxGrad, onyx.LogSoftmaxGrad; float32, bfloat16 and
// float16 with float32 math. x is viewed as (O, R, I) (softmax_dims.h, as the CPU kernels); I = 1
// (the last axis, attention's case) runs one block per row with block reductions, other axes one
// thread per (o, i) column walking R.
#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/cuda_util.cuh"
#include "kernels/softmax/softmax_dims.h"

namespace onyx::kernels {
namespace {

using cuda::from_f;
using cuda::to_f;
using runtime::KernelContext;
using runtime::OpKernel;

constexpr int kRowThreads = 256;

// Element r of row (o, i) is at o·R·I + r·I + i.
template <bool kLog, class T>
__global__ void softmax_rows(const T* x, T* y, int64_t R) {
  const T* xr = x + blockIdx.x * R;
  T* yr = y + blockIdx.x * R;
  float m = -INFINITY;
  for (int64_t r = threadIdx.x; r < R; r += blockDim.x) m = fmaxf(m, to_f(xr[r]));
  m = cuda::block_max(m);
  float s = 0.f;
  for (int64_t r = threadIdx.x; r < R; r += blockDim.x) s += expf(to_f(xr[r]) - m);
  s = cuda::block_sum(s);
  const float log_s = logf(s), inv = 1.f / s;
  for (int64_t r = threadIdx.x; r < R; r += blockDim.x) {
    float v = to_f(xr[r]) - m;
    yr[r] = from_f<T>(kLog ? v - log_s : expf(v) * inv);
  }
}

template <bool kLog, class T>
__global__ void softmax_columns(const T* x, T* y, int64_t O, int64_t R, int64_t I) {
  for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c < O * I;
       c += (int64_t)gridDim.x * blockDim.x) {
    const int64_t base = (c / I) * R * I + c % I;
    float m = -INFINITY;
    for (int64_t r = 0; r < R; r++) m = fmaxf(m, to_f(x[base + r * I]));
    float s = 0.f;
    for (int64_t r = 0; r < R; r++) s += expf(to_f(x[base + r * I]) - m);
    const float log_s = logf(s), inv = 1.f / s;
    for (int64_t r = 0; r < R; r++) {
      float v = to_f(x[base + r * I]) - m;
      y[base + r * I] = from_f<T>(kLog ? v - log_s : expf(v) * inv);
    }
  }
}

// SoftmaxGrad: dx = y (dy − Σ dy·y); LogSoftmaxGrad: dx = dy − exp(y) Σ dy.
template <bool kLog, class T>
__global__ void softmax_grad_rows(const T* dy, const T* y, T* dx, int64_t R) {
  const int64_t off = blockIdx.x * R;
  float s = 0.f;
  for (int64_t r = threadIdx.x; r < R; r += blockDim.x)
    s += kLog ? to_f(dy[off + r]) : to_f(dy[off + r]) * to_f(y[off + r]);
  s = cuda::block_sum(s);
  for (int64_t r = threadIdx.x; r < R; r += blockDim.x) {
    float g = to_f(dy[off + r]), v = to_f(y[off + r]);
    dx[off + r] = from_f<T>(kLog ? g - expf(v) * s : v * (g - s));
  }
}

template <bool kLog, class T>
__global__ void softmax_grad_columns(const T* dy, const T* y, T* dx, int64_t O, int64_t R,
                                     int64_t I) {
  for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c < O * I;
       c += (int64_t)gridDim.x * blockDim.x) {
    const int64_t base = (c / I) * R * I + c % I;
    float s = 0.f;
    for (int64_t r = 0; r < R; r++) {
      const int64_t k = base + r * I;
      s += kLog ? to_f(dy[k]) : to_f(dy[k]) * to_f(y[k]);
    }
    for (int64_t r = 0; r < R; r++) {
      const int64_t k = base + r * I;
      float g = to_f(dy[k]), v = to_f(y[k]);
      dx[k] = from_f<T>(kLog ? g - expf(v) * s : v * (g - s));
    }
  }
}

template <bool kLog>
OpKernel softmax_kernel() {
  OpKernel k;
  k.compute = [](KernelContext& c) {
    cuda::require_device_tensors(c);
    const Tensor& x = c.input(0);
    Tensor& y = c.output(0);
    const SoftmaxDims d = forward_softmax_dims(c.node, c.opset, x.shape());
    if (x.numel() == 0) return;
    cuda::dispatch_float(x.dtype(), c.node, [&](auto tag) {
      using T = typename decltype(tag)::type;
      if (d.I == 1)
        softmax_rows<kLog, T>
            <<<(unsigned)d.O, kRowThreads, 0, cuda::stream()>>>(x.data<T>(), y.data<T>(), d.R);
      else
        softmax_columns<kLog, T><<<cuda::blocks_for(d.O * d.I, 256), 256, 0, cuda::stream()>>>(
            x.data<T>(), y.data<T>(), d.O, d.R, d.I);
    });
    cuda::check_launch(c.node);
  };
  k.inplace = {{0, 0}};
  return k;
}

template <bool kLog>
OpKernel softmax_grad_kernel() {
  OpKernel k;
  k.compute = [](KernelContext& c) {
    cuda::require_device_tensors(c);
    const Tensor& dy = c.input(0);
    const Tensor& y = c.input(1);
    Tensor& dx = c.output(0);
    ONYX_CHECK(dy.shape() == y.shape() && dy.dtype() == y.dtype(), c.node.describe(),
               ": dy and y differ");
    const SoftmaxDims d = grad_softmax_dims(c.node, y.shape());
    if (y.numel() == 0) return;
    cuda::dispatch_float(y.dtype(), c.node, [&](auto tag) {
      using T = typename decltype(tag)::type;
      if (d.I == 1)
        softmax_grad_rows<kLog, T><<<(unsigned)d.O, kRowThreads, 0, cuda::stream()>>>(
            dy.data<T>(), y.data<T>(), dx.data<T>(), d.R);
      else
        softmax_grad_columns<kLog, T><<<cuda::blocks_for(d.O * d.I, 256), 256, 0, cuda::stream()>>>(
            dy.data<T>(), y.data<T>(), dx.data<T>(), d.O, d.R, d.I);
    });
    cuda::check_launch(c.node);
  };
  return k;
}

}  // namespace

ONYX_REGISTER_KERNELS(softmax, Cuda) {
  r.add("", "Softmax", softmax_kernel<false>());
  r.add("", "LogSoftmax", softmax_kernel<true>());
  r.add("onyx", "SoftmaxGrad", softmax_grad_kernel<false>());
  r.add("onyx", "LogSoftmaxGrad", softmax_grad_kernel<true>());
}

}  // namespace onyx::kernels
