// grad_elementwise.cc — fused gradient kernels of the elementwise family ("onyx" domain), emitted
// by the rules in autodiff/gradients/elementwise.cc:
//   GeluGrad(dy, x, bias?)  approximate = "none" | "tanh"   dx = dy * gelu'(x + bias)
//   ReluGrad(dy, y)                                         dx = y > 0 ? dy : 0
//   SigmoidGrad(dy, y)                                      dx = dy * y * (1 - y)
//   TanhGrad(dy, y)                                         dx = dy * (1 - y^2)
//   ErfGrad(dy, x)                                          dx = dy * 2/sqrt(pi) * exp(-x^2)
// dy, the saved value and dx share one dtype and one shape; bias (C) runs along x's last axis
// (com.microsoft FastGelu / BiasGelu). Hand-written because these run once per activation per
// step: one pass instead of 4-8 emitted elementwise nodes. float32 works in blocks of kBlock so
// the erf/exp of elementwise_unary.cc (AVX2) are used and every other loop vectorizes;
// float16/bfloat16 go through the same float blocks; float64 is scalar.
#include "kernels/cpu/elementwise.h"

namespace onyx::runtime {
namespace {

using namespace ew;

constexpr int64_t kBlock = 512;
constexpr float kInvSqrt2 = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;  // 1 / sqrt(2 pi)
constexpr float kTwoInvSqrtPi = 1.1283791670955126f;  // 2 / sqrt(pi)
constexpr float kTanhA = 0.79788456080286536f;        // sqrt(2 / pi)
constexpr float kTanhB = 0.044715f;

// ---- per-block float32 formulas (n <= kBlock; dx may alias dy, never x) ---------------------
// (GCC cannot see that the simd loops fill e[0..n) before erf_f32/exp_f32 read it.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// gelu(x) = 0.5 x (1 + erf(x/sqrt2));  gelu'(x) = 0.5 (1 + erf(x/sqrt2)) + x exp(-x^2/2)/sqrt(2pi)
void gelu_erf_grad_block(const float* dy, const float* x, float* dx, int64_t n) {
  alignas(32) float e[kBlock], g[kBlock];
#pragma omp simd
  for (int64_t i = 0; i < n; i++) {
    e[i] = x[i] * kInvSqrt2;
    g[i] = -0.5f * x[i] * x[i];
  }
  erf_f32(e, e, n);
  exp_f32(g, g, n);
#pragma omp simd
  for (int64_t i = 0; i < n; i++)
    dx[i] = dy[i] * (0.5f * (1.0f + e[i]) + x[i] * g[i] * kInvSqrt2Pi);
}

// The forward computes 0.5 x (1 + tanh u) as x s with s = sigmoid(2u), u = a (x + b x^3);
// gelu'(x) = s + x s (1 - s) 2 u',  u' = a (1 + 3 b x^2). No cancellation for negative x.
void gelu_tanh_grad_block(const float* dy, const float* x, float* dx, int64_t n) {
  alignas(32) float e[kBlock];
#pragma omp simd
  for (int64_t i = 0; i < n; i++) {
    float v = x[i];
    e[i] = -2.0f * kTanhA * (v + kTanhB * v * v * v);
  }
  exp_f32(e, e, n);
#pragma omp simd
  for (int64_t i = 0; i < n; i++) {
    float v = x[i];
    float s = 1.0f / (1.0f + e[i]);
    float du = 2.0f * kTanhA * (1.0f + 3.0f * kTanhB * v * v);
    dx[i] = dy[i] * (s + v * s * (1.0f - s) * du);
  }
}

void erf_grad_block(const float* dy, const float* x, float* dx, int64_t n) {
  alignas(32) float e[kBlock];
#pragma omp simd
  for (int64_t i = 0; i < n; i++) e[i] = -x[i] * x[i];
  exp_f32(e, e, n);
#pragma omp simd
  for (int64_t i = 0; i < n; i++) dx[i] = dy[i] * kTwoInvSqrtPi * e[i];
}

#pragma GCC diagnostic pop

void relu_grad_block(const float* dy, const float* y, float* dx, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; i++) dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

void sigmoid_grad_block(const float* dy, const float* y, float* dx, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; i++) dx[i] = dy[i] * y[i] * (1.0f - y[i]);
}

void tanh_grad_block(const float* dy, const float* y, float* dx, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; i++) dx[i] = dy[i] * (1.0f - y[i] * y[i]);
}

// ---- float64 scalar formulas ----------------------------------------------------------------

double gelu_erf_grad(double dy, double x) {
  return dy * (0.5 * (1.0 + std::erf(x * 0.70710678118654752440)) +
               x * std::exp(-0.5 * x * x) * 0.39894228040143267794);
}
double gelu_tanh_grad(double dy, double x) {
  const double a = 0.79788456080286535588, b = 0.044715;
  double s = 1.0 / (1.0 + std::exp(-2.0 * a * (x + b * x * x * x)));
  return dy * (s + x * s * (1.0 - s) * 2.0 * a * (1.0 + 3.0 * b * x * x));
}

using BlockFn = void (*)(const float*, const float*, float*, int64_t);
using ScalarFn = double (*)(double, double);

// dx[i] = f(dy[i], v[i] + bias[i % C]) over blocks, parallel; bias may be null.
template <class T>
void grad_map(const T* dy, const T* v, const T* bias, int64_t C, T* dx, int64_t n, BlockFn block,
              ScalarFn scalar, int64_t grain) {
  if constexpr (std::is_same_v<T, double>) {
    parallel_for(n, grain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; i++) dx[i] = scalar(dy[i], bias ? v[i] + bias[i % C] : v[i]);
    });
  } else {
    std::vector<float> biasf;
    const float* pb = nullptr;
    if (bias) {
      if constexpr (std::is_same_v<T, float>) {
        pb = bias;
      } else {
        biasf.resize(C);
        to_float(bias, biasf.data(), C);
        pb = biasf.data();
      }
    }
    parallel_for(n, grain, [&](int64_t b, int64_t e) {
      alignas(32) float xb[kBlock], dyb[kBlock], out[kBlock];
      for (int64_t i = b; i < e; i += kBlock) {
        const int64_t m = std::min(kBlock, e - i);
        const float* px;
        const float* pdy;
        float* pdx;
        if constexpr (std::is_same_v<T, float>) {
          px = v + i;
          pdy = dy + i;
          pdx = dx + i;
        } else {
          to_float(v + i, xb, m);
          to_float(dy + i, dyb, m);
          px = xb;
          pdy = dyb;
          pdx = out;
        }
        if (pb) {  // xb = v + bias, bias running along the last axis
          int64_t col = i % C;
          for (int64_t j = 0; j < m; j++) {
            xb[j] = px[j] + pb[col];
            if (++col == C) col = 0;
          }
          px = xb;
        }
        block(pdy, px, pdx, m);
        if constexpr (!std::is_same_v<T, float>) from_float(out, dx + i, m);
      }
    });
  }
}

// Registers `name`(dy, v[, bias]) -> dx with dx = f(dy, v).
void add_grad_kernel(KernelRegistry& r, const char* name, bool with_bias,
                     std::function<std::pair<BlockFn, ScalarFn>(const KernelContext&)> pick,
                     int64_t grain) {
  OpKernel k;
  k.infer = [with_bias](InferContext& c) {
    const TensorMeta& dy = c.input(0);
    const TensorMeta& v = c.input(1);
    require_dtype(dy.dtype, FloatTypes{}, c.node);
    ONYX_CHECK(dy.dtype == v.dtype && dy.shape == v.shape, c.node.describe(), ": dy ",
               dtype_name(dy.dtype), " ", shape_str(dy.shape), " and input 1 ", dtype_name(v.dtype),
               " ", shape_str(v.shape), " must have the same dtype and shape");
    if (with_bias && c.has_input(2)) {
      const TensorMeta& b = c.input(2);
      ONYX_CHECK(b.dtype == v.dtype && b.shape.size() == 1 && !v.shape.empty() &&
                     b.shape[0] == v.shape.back(),
                 c.node.describe(), ": bias ", dtype_name(b.dtype), " ", shape_str(b.shape),
                 " must be 1-D of the last dimension of ", shape_str(v.shape));
    }
    c.set_output(0, dy.dtype, dy.shape);
  };
  k.compute = [with_bias, pick, grain](KernelContext& c) {
    const Tensor& dy = c.input(0);
    const Tensor& v = c.input(1);
    Tensor& dx = c.output(0);
    const Tensor* bias = with_bias && c.has_input(2) ? &c.input(2) : nullptr;
    if (dx.numel() == 0) return;
    auto [block, scalar] = pick(c);
    dispatch(dy.dtype(), FloatTypes{}, c.node, [&](auto tag) {
      using T = typename decltype(tag)::type;
      grad_map<T>(dy.data<T>(), v.data<T>(), bias ? bias->data<T>() : nullptr,
                  bias ? bias->numel() : 1, dx.data<T>(), dx.numel(), block, scalar, grain);
    });
  };
  k.inplace = {{0, 0}};  // dx may alias dy (never x)
  r.add("onyx", name, std::move(k));
}

}  // namespace

void register_elementwise_grad_kernels(KernelRegistry& r) {
  add_grad_kernel(
      r, "GeluGrad", /*with_bias=*/true,
      [](const KernelContext& c) -> std::pair<BlockFn, ScalarFn> {
        std::string approx = c.node.attr_string("approximate", "none");
        if (approx == "tanh") return {gelu_tanh_grad_block, gelu_tanh_grad};
        if (approx != "none") ONYX_UNSUPPORTED(c.node.describe(), ": approximate='", approx, "'");
        return {gelu_erf_grad_block, gelu_erf_grad};
      },
      kGrainMath);
  add_grad_kernel(
      r, "ErfGrad", false,
      [](const KernelContext&) -> std::pair<BlockFn, ScalarFn> {
        return {erf_grad_block,
                [](double dy, double x) { return dy * 1.12837916709551257390 * std::exp(-x * x); }};
      },
      kGrainMath);
  add_grad_kernel(
      r, "ReluGrad", false,
      [](const KernelContext&) -> std::pair<BlockFn, ScalarFn> {
        return {relu_grad_block, [](double dy, double y) { return y > 0 ? dy : 0.0; }};
      },
      kGrain);
  add_grad_kernel(
      r, "SigmoidGrad", false,
      [](const KernelContext&) -> std::pair<BlockFn, ScalarFn> {
        return {sigmoid_grad_block, [](double dy, double y) { return dy * y * (1.0 - y); }};
      },
      kGrain);
  add_grad_kernel(
      r, "TanhGrad", false,
      [](const KernelContext&) -> std::pair<BlockFn, ScalarFn> {
        return {tanh_grad_block, [](double dy, double y) { return dy * (1.0 - y * y); }};
      },
      kGrain);
}

}  // namespace onyx::runtime
