// kernels/elementwise/elementwise.cu — the CUDA kernels of the elementwise families, float32,
// bfloat16 and float16 (math in float32, as the CPU kernels do for the 16-bit types):
//   binary   Add Sub Mul Div Pow (numpy broadcasting through cuda_util.cuh's Broadcast; equal
//            shapes take a flat loop; Pow's exponent may also be int64 / int32)
//   unary    Neg Abs Relu Exp Log Sqrt Reciprocal Tanh Sigmoid Erf, Gelu ("" and onyx: erf or
//            tanh form; com.microsoft: erf), onyx.Silu
//   gradient onyx.ReluGrad SigmoidGrad TanhGrad (dy, y), ErfGrad SiluGrad (dy, x),
//            GeluGrad (dy, x, bias?) — the formulas of unary.cc's header
//   cast     Cast between float32, bfloat16 and float16 (round to nearest even)
// One thread per element, grid-stride; shape inference and traits are the CPU kernels'.
#include <cmath>

#include "kernels/cuda/cuda_util.cuh"

namespace onyx::kernels {
namespace {

using cuda::Broadcast;
using cuda::from_f;
using cuda::to_f;
using runtime::KernelContext;
using runtime::OpKernel;

constexpr int kThreads = 256;

// ---- binary -------------------------------------------------------------------------------------

enum class BinOp { Add, Sub, Mul, Div, Pow };

template <BinOp op>
__device__ __forceinline__ float apply_binary(float a, float b) {
  if constexpr (op == BinOp::Add) return a + b;
  if constexpr (op == BinOp::Sub) return a - b;
  if constexpr (op == BinOp::Mul) return a * b;
  if constexpr (op == BinOp::Div) return a / b;
  if constexpr (op == BinOp::Pow) return powf(a, b);
}

template <BinOp op, class T, class TB>
__global__ void binary_flat(const T* a, const TB* b, T* y, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    y[i] = from_f<T>(apply_binary<op>(to_f(a[i]), to_f(b[i])));
}

template <BinOp op, class T, class TB>
__global__ void binary_broadcast(const T* a, const TB* b, T* y, int64_t n, Broadcast bc) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t ia, ib;
    bc.offsets(i, ia, ib);
    y[i] = from_f<T>(apply_binary<op>(to_f(a[ia]), to_f(b[ib])));
  }
}

template <BinOp op, class T, class TB>
void launch_binary(const Tensor& a, const Tensor& b, Tensor& y, const ir::Node& node) {
  const int64_t n = y.numel();
  const unsigned blocks = cuda::blocks_for(n, kThreads);
  if (a.shape() == y.shape() && b.shape() == y.shape()) {
    binary_flat<op, T, TB>
        <<<blocks, kThreads, 0, cuda::stream()>>>(a.data<T>(), b.data<TB>(), y.data<T>(), n);
  } else {
    Broadcast bc = cuda::make_broadcast(y.shape(), a.shape(), b.shape(), node);
    binary_broadcast<op, T, TB>
        <<<blocks, kThreads, 0, cuda::stream()>>>(a.data<T>(), b.data<TB>(), y.data<T>(), n, bc);
  }
}

template <BinOp op>
OpKernel binary_kernel() {
  OpKernel k;
  k.compute = [](KernelContext& c) {
    cuda::require_device_tensors(c);
    const Tensor& a = c.input(0);
    const Tensor& b = c.input(1);
    Tensor& y = c.output(0);
    const bool int_exponent =
        op == BinOp::Pow && (b.dtype() == DType::Int64 || b.dtype() == DType::Int32);
    if (!int_exponent && (a.dtype() != b.dtype() || a.dtype() != y.dtype()))
      ONYX_UNSUPPORTED(c.node.describe(), ": ", dtype_name(a.dtype()), " and ",
                       dtype_name(b.dtype()), " operands on cuda");
    if (y.numel() == 0) return;
    cuda::dispatch_float(y.dtype(), c.node, [&](auto tag) {
      using T = typename decltype(tag)::type;
      if (b.dtype() == DType::Int64 && int_exponent)
        launch_binary<op, T, int64_t>(a, b, y, c.node);
      else if (int_exponent)
        launch_binary<op, T, int32_t>(a, b, y, c.node);
      else
        launch_binary<op, T, T>(a, b, y, c.node);
    });
    cuda::check_launch(c.node);
  };
  return k;
}

// ---- unary --------------------------------------------------------------------------------------

enum class UnOp {
  Neg,
  Abs,
  Relu,
  Exp,
  Log,
  Sqrt,
  Reciprocal,
  Tanh,
  Sigmoid,
  Erf,
  GeluErf,
  GeluTanh,
  Silu
};

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kInvSqrt2 = 0.7071067811865476f;
constexpr float kTwoOverSqrtPi = 1.1283791670955126f;

template <UnOp op>
__device__ __forceinline__ float apply_unary(float x) {
  if constexpr (op == UnOp::Neg) return -x;
  if constexpr (op == UnOp::Abs) return fabsf(x);
  if constexpr (op == UnOp::Relu) return x > 0.0f ? x : 0.0f;
  if constexpr (op == UnOp::Exp) return expf(x);
  if constexpr (op == UnOp::Log) return logf(x);
  if constexpr (op == UnOp::Sqrt) return sqrtf(x);
  if constexpr (op == UnOp::Reciprocal) return 1.0f / x;
  if constexpr (op == UnOp::Tanh) return tanhf(x);
  if constexpr (op == UnOp::Sigmoid) return 1.0f / (1.0f + expf(-x));
  if constexpr (op == UnOp::Erf) return erff(x);
  if constexpr (op == UnOp::GeluErf) return 0.5f * x * (1.0f + erff(x * kInvSqrt2));
  if constexpr (op == UnOp::GeluTanh)
    return 0.5f * x * (1.0f + tanhf(kSqrt2OverPi * (x + 0.044715f * x * x * x)));
  if constexpr (op == UnOp::Silu) return x / (1.0f + expf(-x));
}

template <UnOp op, class T>
__global__ void unary_flat(const T* x, T* y, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    y[i] = from_f<T>(apply_unary<op>(to_f(x[i])));
}

template <UnOp op>
void launch_unary(KernelContext& c) {
  cuda::require_device_tensors(c);
  const Tensor& x = c.input(0);
  Tensor& y = c.output(0);
  const int64_t n = y.numel();
  if (n == 0) return;
  cuda::dispatch_float(y.dtype(), c.node, [&](auto tag) {
    using T = typename decltype(tag)::type;
    unary_flat<op, T><<<cuda::blocks_for(n, kThreads), kThreads, 0, cuda::stream()>>>(
        x.data<T>(), y.data<T>(), n);
  });
  cuda::check_launch(c.node);
}

template <UnOp op>
OpKernel unary_kernel() {
  OpKernel k;
  k.compute = [](KernelContext& c) { launch_unary<op>(c); };
  k.inplace = {{0, 0}};
  return k;
}

OpKernel gelu_kernel(bool attribute_decides) {
  OpKernel k;
  k.compute = [attribute_decides](KernelContext& c) {
    std::string approx = attribute_decides ? c.node.attr_string("approximate", "none") : "none";
    if (approx == "tanh") return launch_unary<UnOp::GeluTanh>(c);
    if (approx != "none") ONYX_UNSUPPORTED(c.node.describe(), ": Gelu approximate='", approx, "'");
    launch_unary<UnOp::GeluErf>(c);
  };
  k.inplace = {{0, 0}};
  return k;
}

// ---- fused activation gradients -----------------------------------------------------------------

enum class GradOp { Relu, Sigmoid, Tanh, Erf, Silu, GeluErf, GeluTanh };

template <GradOp op>
__device__ __forceinline__ float apply_grad(float dy, float v) {
  if constexpr (op == GradOp::Relu) return v > 0.0f ? dy : 0.0f;
  if constexpr (op == GradOp::Sigmoid) return dy * v * (1.0f - v);
  if constexpr (op == GradOp::Tanh) return dy * (1.0f - v * v);
  if constexpr (op == GradOp::Erf) return dy * kTwoOverSqrtPi * expf(-v * v);
  if constexpr (op == GradOp::Silu) {
    float s = 1.0f / (1.0f + expf(-v));
    return dy * s * (1.0f + v * (1.0f - s));
  }
  if constexpr (op == GradOp::GeluErf) {
    float cdf = 0.5f * (1.0f + erff(v * kInvSqrt2));
    float pdf = 0.3989422804014327f * expf(-0.5f * v * v);
    return dy * (cdf + v * pdf);
  }
  if constexpr (op == GradOp::GeluTanh) {
    float u = kSqrt2OverPi * (v + 0.044715f * v * v * v);
    float t = tanhf(u);
    float du = kSqrt2OverPi * (1.0f + 3.0f * 0.044715f * v * v);
    return dy * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du);
  }
}

// dx[i] = grad(dy[i], v[i] + bias[i % bias_n]) (bias only for GeluGrad; bias_n = 1 and a null
// bias otherwise).
template <GradOp op, class T>
__global__ void grad_flat(const T* dy, const T* v, const T* bias, int64_t bias_n, T* dx,
                          int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    float x = to_f(v[i]);
    if (bias) x += to_f(bias[i % bias_n]);
    dx[i] = from_f<T>(apply_grad<op>(to_f(dy[i]), x));
  }
}

template <GradOp op>
void launch_grad(KernelContext& c) {
  cuda::require_device_tensors(c);
  const Tensor& dy = c.input(0);
  const Tensor& v = c.input(1);
  const Tensor* bias = c.has_input(2) ? &c.input(2) : nullptr;
  Tensor& dx = c.output(0);
  ONYX_CHECK(dy.shape() == v.shape() && dy.dtype() == v.dtype(), c.node.describe(), ": dy ",
             shape_str(dy.shape()), " and the saved value ", shape_str(v.shape()), " differ");
  const int64_t n = dx.numel();
  if (n == 0) return;
  int64_t bias_n = 1;
  if (bias) {
    bias_n = bias->numel();
    ONYX_CHECK(bias->dtype() == dy.dtype() && v.rank() > 0 && bias_n == v.dim(-1),
               c.node.describe(), ": bias ", shape_str(bias->shape()),
               " must run along the last axis of ", shape_str(v.shape()));
  }
  cuda::dispatch_float(dx.dtype(), c.node, [&](auto tag) {
    using T = typename decltype(tag)::type;
    grad_flat<op, T><<<cuda::blocks_for(n, kThreads), kThreads, 0, cuda::stream()>>>(
        dy.data<T>(), v.data<T>(), bias ? bias->data<T>() : nullptr, bias_n, dx.data<T>(), n);
  });
  cuda::check_launch(c.node);
}

template <GradOp op>
OpKernel grad_kernel() {
  OpKernel k;
  k.compute = [](KernelContext& c) { launch_grad<op>(c); };
  k.inplace = {{0, 0}};
  return k;
}

OpKernel gelu_grad_kernel() {
  OpKernel k;
  k.compute = [](KernelContext& c) {
    std::string approx = c.node.attr_string("approximate", "none");
    if (approx == "tanh") return launch_grad<GradOp::GeluTanh>(c);
    if (approx != "none") ONYX_UNSUPPORTED(c.node.describe(), ": approximate='", approx, "'");
    launch_grad<GradOp::GeluErf>(c);
  };
  k.inplace = {{0, 0}};
  return k;
}

// ---- cast ---------------------------------------------------------------------------------------

template <class From, class To>
__global__ void cast_flat(const From* x, To* y, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    y[i] = from_f<To>(to_f(x[i]));
}

OpKernel cast_kernel() {
  OpKernel k;
  k.compute = [](KernelContext& c) {
    cuda::require_device_tensors(c);
    const Tensor& x = c.input(0);
    Tensor& y = c.output(0);
    const int64_t n = y.numel();
    if (n == 0) return;
    if (x.dtype() == y.dtype()) {
      ONYX_CUDA_CHECK(
          cudaMemcpyAsync(y.raw(), x.raw(), y.nbytes(), cudaMemcpyDeviceToDevice, cuda::stream()));
      return;
    }
    cuda::dispatch_float(x.dtype(), c.node, [&](auto from) {
      cuda::dispatch_float(y.dtype(), c.node, [&](auto to) {
        using F = typename decltype(from)::type;
        using T = typename decltype(to)::type;
        cast_flat<F, T><<<cuda::blocks_for(n, kThreads), kThreads, 0, cuda::stream()>>>(
            x.data<F>(), y.data<T>(), n);
      });
    });
    cuda::check_launch(c.node);
  };
  return k;
}

}  // namespace

ONYX_REGISTER_KERNELS(binary, Cuda) {
  r.add("", "Add", binary_kernel<BinOp::Add>());
  r.add("", "Sub", binary_kernel<BinOp::Sub>());
  r.add("", "Mul", binary_kernel<BinOp::Mul>());
  r.add("", "Div", binary_kernel<BinOp::Div>());
  r.add("", "Pow", binary_kernel<BinOp::Pow>());
}

ONYX_REGISTER_KERNELS(unary, Cuda) {
  r.add("", "Neg", unary_kernel<UnOp::Neg>());
  r.add("", "Abs", unary_kernel<UnOp::Abs>());
  r.add("", "Relu", unary_kernel<UnOp::Relu>());
  r.add("", "Exp", unary_kernel<UnOp::Exp>());
  r.add("", "Log", unary_kernel<UnOp::Log>());
  r.add("", "Sqrt", unary_kernel<UnOp::Sqrt>());
  r.add("", "Reciprocal", unary_kernel<UnOp::Reciprocal>());
  r.add("", "Tanh", unary_kernel<UnOp::Tanh>());
  r.add("", "Sigmoid", unary_kernel<UnOp::Sigmoid>());
  r.add("", "Erf", unary_kernel<UnOp::Erf>());
  r.add("", "Gelu", gelu_kernel(true));
  r.add("onyx", "Gelu", gelu_kernel(true));
  r.add("com.microsoft", "Gelu", gelu_kernel(false));
  r.add("onyx", "Silu", unary_kernel<UnOp::Silu>());
  r.add("onyx", "ReluGrad", grad_kernel<GradOp::Relu>());
  r.add("onyx", "SigmoidGrad", grad_kernel<GradOp::Sigmoid>());
  r.add("onyx", "TanhGrad", grad_kernel<GradOp::Tanh>());
  r.add("onyx", "ErfGrad", grad_kernel<GradOp::Erf>());
  r.add("onyx", "SiluGrad", grad_kernel<GradOp::Silu>());
  r.add("onyx", "GeluGrad", gelu_grad_kernel());
}

ONYX_REGISTER_KERNELS(cast, Cuda) { r.add("", "Cast", cast_kernel()); }

}  // namespace onyx::kernels
