// kernels/elementwise/unary.cc — one-input elementwise ops: math (Exp, Log, Sqrt, Erf, trig,
// rounding...), activations (Relu, Sigmoid, Tanh, Gelu, Elu, Selu, HardSwish, Shrink, ...), Clip,
// IsNaN/IsInf, Not, com.microsoft Gelu/FastGelu/BiasGelu and onyx.Silu (x · sigmoid(x),
// silu_fusion.cc); and the fused gradients of the activations
// ("onyx" domain, emitted by the rules in autodiff/gradients/elementwise.cc):
//   GeluGrad(dy, x, bias?)  approximate = "none" | "tanh"   dx = dy * gelu'(x + bias)
//   ReluGrad(dy, y)                                         dx = y > 0 ? dy : 0
//   SigmoidGrad(dy, y)                                      dx = dy * y * (1 - y)
//   TanhGrad(dy, y)                                         dx = dy * (1 - y^2)
//   ErfGrad(dy, x)                                          dx = dy * 2/sqrt(pi) * exp(-x^2)
//   SiluGrad(dy, x)                    s = sigmoid(x)       dx = dy * s * (1 + x (1 - s))
// dy, the saved value and dx share one dtype and one shape; bias (C) runs along x's last axis
// (com.microsoft FastGelu / BiasGelu).
// Hand-written because Exp/Tanh/Sigmoid/Erf/Gelu sit on the training hot path and libm's scalar
// calls do not vectorize: float32 goes through the SIMD array kernels of simd/activations.cc (exp
// ~1 ulp, erf abs error < 1e-7, tanh abs error < 1e-7; AVX-512, AVX2 or portable, picked at
// start-up); float16/bfloat16 reuse them through float blocks;
// float64 and integers use scalar code. The gradients run once per activation per step: one pass
// instead of 4-8 emitted elementwise nodes.
#include <algorithm>

#include "kernels/cpu/nn_util.h"
#include "kernels/cpu/simd/simd.h"
#include "kernels/elementwise/elementwise.h"

namespace onyx::kernels {
namespace {

using namespace ew;

// The float32 array math (exp, tanh, sigmoid, silu, sqrt, erf, gelu) and the fused gradients
// block formulas live in kernels/cpu/simd/activations.cc, one copy per SIMD path.

// ---- unary ops ------------------------------------------------------------------------------
// Each op: `M operator()(M x)` on the math type (float for float16/bfloat16, the type itself
// otherwise) and optionally `f32(x, y, n)`, a vectorized float32 array kernel.

template <class Op>
concept HasF32 = requires(const Op& op, const float* x, float* y, int64_t n) {
  op.f32(x, y, n);
};

template <class T, class Op>
void unary_apply(const T* x, T* y, int64_t n, const Op& op, int64_t grain) {
  parallel_for(n, grain, [&](int64_t b, int64_t e) {
    if constexpr (std::is_same_v<T, float> && HasF32<Op>) {
      op.f32(x + b, y + b, e - b);
    } else if constexpr (is_half_like<T>) {
      constexpr int64_t kBlock = 256;
      float buf[kBlock];
      for (int64_t i = b; i < e; i += kBlock) {
        int64_t m = std::min(kBlock, e - i);
        to_float(x + i, buf, m);
        if constexpr (HasF32<Op>) {
          op.f32(buf, buf, m);
        } else {
          for (int64_t j = 0; j < m; j++) buf[j] = op(buf[j]);
        }
        from_float(buf, y + i, m);
      }
    } else {
#pragma omp simd
      for (int64_t i = b; i < e; i++) y[i] = static_cast<T>(op(x[i]));
    }
  });
}

// float32 x, bfloat16 y (output_dtype = BFLOAT16, set by passes/mixed_precision.cc on a producer
// only GEMMs read): each block computed in float32 on the stack and rounded as Cast rounds, so the
// result is Cast(op(x)) without the float32 tensor.
template <class Op>
void unary_to_bf16(const float* x, BFloat16* y, int64_t n, const Op& op, int64_t grain) {
  parallel_for(n, grain, [&](int64_t b, int64_t e) {
    constexpr int64_t kBlock = 512;
    float buf[kBlock];
    for (int64_t i = b; i < e; i += kBlock) {
      int64_t m = std::min(kBlock, e - i);
      if constexpr (HasF32<Op>) {
        op.f32(x + i, buf, m);
      } else {
        for (int64_t j = 0; j < m; j++) buf[j] = static_cast<float>(op(x[i + j]));
      }
      from_float(buf, y + i, m);
    }
  });
}

struct Neg {
  template <class M>
  M operator()(M x) const {
    if constexpr (std::is_integral_v<M>)
      return wrap_sub<M>(0, x);
    else
      return -x;
  }
};
struct Abs {
  template <class M>
  M operator()(M x) const {
    if constexpr (std::is_unsigned_v<M>)
      return x;
    else if constexpr (std::is_integral_v<M>)
      return x < 0 ? wrap_sub<M>(0, x) : x;
    else
      return std::fabs(x);
  }
};
struct Sign {
  template <class M>
  M operator()(M x) const {
    return x > 0 ? M(1) : (x < 0 ? M(-1) : x);  // keeps 0 and NaN
  }
};
struct Relu {
  template <class M>
  M operator()(M x) const {
    return x < 0 ? M(0) : x;  // NaN stays NaN
  }
};
struct Reciprocal {
  template <class M>
  M operator()(M x) const {
    return M(1) / x;
  }
};
struct Sqrt {
  template <class M>
  M operator()(M x) const {
    return std::sqrt(x);
  }
  void f32(const float* x, float* y, int64_t n) const { simd::sqrt(x, y, n); }
};
struct Exp {
  template <class M>
  M operator()(M x) const {
    return std::exp(x);
  }
  void f32(const float* x, float* y, int64_t n) const { simd::exp(x, y, n); }
};
struct Log {
  template <class M>
  M operator()(M x) const {
    return std::log(x);
  }
};
struct Tanh {
  template <class M>
  M operator()(M x) const {
    return std::tanh(x);
  }
  void f32(const float* x, float* y, int64_t n) const { simd::tanh(x, y, n); }
};
struct Sigmoid {
  template <class M>
  M operator()(M x) const {
    return M(1) / (M(1) + std::exp(-x));
  }
  void f32(const float* x, float* y, int64_t n) const { simd::sigmoid(x, y, n); }
};
// onyx.Silu (silu_fusion.cc): x · sigmoid(x), one pass instead of Sigmoid + Mul.
struct Silu {
  template <class M>
  M operator()(M x) const {
    return x / (M(1) + std::exp(-x));
  }
  void f32(const float* x, float* y, int64_t n) const { simd::silu(x, y, n); }
};
struct Erf {
  template <class M>
  M operator()(M x) const {
    return std::erf(x);
  }
  void f32(const float* x, float* y, int64_t n) const { simd::erf(x, y, n); }
};
struct Gelu {
  bool tanh_form = false;
  template <class M>
  M operator()(M x) const {
    if (tanh_form) {
      M u = M(0.79788456080286535588) * (x + M(0.044715) * x * x * x);
      return M(0.5) * x * (M(1) + std::tanh(u));
    }
    return M(0.5) * x * (M(1) + std::erf(x * M(0.70710678118654752440)));
  }
  void f32(const float* x, float* y, int64_t n) const {
    if (tanh_form)
      simd::gelu_tanh(x, y, n);
    else
      simd::gelu_erf(x, y, n);
  }
};

#define ONYX_STD_UNARY(Name, expr) \
  struct Name {                    \
    template <class M>             \
    M operator()(M x) const {      \
      return expr;                 \
    }                              \
  };
ONYX_STD_UNARY(Ceil, std::ceil(x))
ONYX_STD_UNARY(Floor, std::floor(x))
ONYX_STD_UNARY(Round, std::nearbyint(x))  // half to even (default rounding mode)
ONYX_STD_UNARY(Sin, std::sin(x))
ONYX_STD_UNARY(Cos, std::cos(x))
ONYX_STD_UNARY(Tan, std::tan(x))
ONYX_STD_UNARY(Asin, std::asin(x))
ONYX_STD_UNARY(Acos, std::acos(x))
ONYX_STD_UNARY(Atan, std::atan(x))
ONYX_STD_UNARY(Sinh, std::sinh(x))
ONYX_STD_UNARY(Cosh, std::cosh(x))
ONYX_STD_UNARY(Asinh, std::asinh(x))
ONYX_STD_UNARY(Acosh, std::acosh(x))
ONYX_STD_UNARY(Atanh, std::atanh(x))
ONYX_STD_UNARY(Softsign, x / (M(1) + std::fabs(x)))
ONYX_STD_UNARY(Softplus, x > 0 ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x)))
ONYX_STD_UNARY(Not, !x)
#undef ONYX_STD_UNARY

struct LeakyRelu {
  float alpha;
  template <class M>
  M operator()(M x) const {
    return x < 0 ? M(alpha) * x : x;
  }
};
struct ThresholdedRelu {
  float alpha;
  template <class M>
  M operator()(M x) const {
    return x > M(alpha) ? x : M(0);
  }
};
struct Elu {
  float alpha;
  template <class M>
  M operator()(M x) const {
    return x < 0 ? M(alpha) * std::expm1(x) : x;
  }
};
struct Celu {
  float alpha;
  template <class M>
  M operator()(M x) const {
    M a = M(alpha);
    return std::max(M(0), x) + std::min(M(0), a * std::expm1(x / a));
  }
};
struct Selu {
  float alpha, gamma;
  template <class M>
  M operator()(M x) const {
    return x > 0 ? M(gamma) * x : M(gamma) * (M(alpha) * std::exp(x) - M(alpha));
  }
};
struct HardSigmoid {
  float alpha, beta;
  template <class M>
  M operator()(M x) const {
    return std::max(M(0), std::min(M(1), M(alpha) * x + M(beta)));
  }
};
struct Shrink {
  float lambd, bias;
  template <class M>
  M operator()(M x) const {
    using C = std::conditional_t<std::is_integral_v<M>, double, M>;  // ints compare exactly
    C v = C(x), l = C(lambd), b = C(bias);
    return v < -l ? M(v + b) : (v > l ? M(v - b) : M(0));
  }
};
struct HardSwish {
  template <class M>
  M operator()(M x) const {
    return x * std::max(M(0), std::min(M(1), M(1.0 / 6.0) * x + M(0.5)));
  }
};

// ---- registration ---------------------------------------------------------------------------

template <class L, class Make>
void add_unary(KernelFamilyRegistrar& r, const char* domain, const char* name, L types, Make make,
               int64_t grain) {
  OpKernel k;
  k.infer = [types](InferContext& c) {
    const TensorMeta& x = c.input(0);
    require_dtype(x.dtype, types, c.node);
    c.set_output(0, nnutil::low_precision_output(c.node, x.dtype), x.shape);
  };
  k.compute = [types, make, grain](KernelContext& c) {
    const Tensor& x = c.input(0);
    Tensor& y = c.output(0);
    const auto op = make(c);
    if (x.dtype() == DType::Float32 && y.dtype() == DType::BFloat16)
      return unary_to_bf16(x.data<float>(), y.data<BFloat16>(), x.numel(), op, grain);
    dispatch(x.dtype(), types, c.node, [&](auto tag) {
      using T = typename decltype(tag)::type;
      unary_apply<T>(x.data<T>(), y.data<T>(), x.numel(), op, grain);
    });
  };
  k.inplace = {{0, 0}};  // y[i] = f(x[i]); x == y is allowed
  r.add(domain, name, std::move(k)).per_token = OpTraits::PerToken::Unary;  // elementwise
}

template <class Op, class L>
void add_simple(KernelFamilyRegistrar& r, const char* name, L types, int64_t grain) {
  add_unary(
      r, "", name, types, [](const KernelContext&) { return Op{}; }, grain);
}

// IsNaN / IsInf: float in, bool out.
template <class Pred>
void add_predicate(KernelFamilyRegistrar& r, const char* name, Pred pred) {
  OpKernel k;
  k.infer = [](InferContext& c) {
    const TensorMeta& x = c.input(0);
    require_dtype(x.dtype, FloatTypes{}, c.node);
    c.set_output(0, DType::Bool, x.shape);
  };
  k.compute = [pred](KernelContext& c) {
    const Tensor& x = c.input(0);
    bool* y = c.output(0).data<bool>();
    const bool pos = c.node.attr_int("detect_positive", 1) != 0;
    const bool neg = c.node.attr_int("detect_negative", 1) != 0;
    dispatch(x.dtype(), FloatTypes{}, c.node, [&](auto tag) {
      using T = typename decltype(tag)::type;
      const T* px = x.data<T>();
      parallel_for(x.numel(), kGrain, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; i++) y[i] = pred(load(px[i]), pos, neg);
      });
    });
  };
  r.add("", name, std::move(k));
}

// Clip: bounds are attributes before opset 11, optional scalar inputs from opset 11.
struct ClipOp {
  template <class M>
  struct Bounds {
    M lo, hi;
    // min(max(x, lo), hi): when lo > hi every element becomes hi (ONNX Clip, numpy.clip).
    M operator()(M x) const {
      M y = x < lo ? lo : x;
      return y > hi ? hi : y;
    }
  };
};

template <class T>
Math<T> clip_bound(const KernelContext& c, int i, bool upper) {
  using M = Math<T>;
  if (c.opset < 11) {
    if constexpr (!std::is_floating_point_v<M>)
      ONYX_UNSUPPORTED(c.node.describe(), ": Clip-6 on dtype ", dtype_name(dtype_of<T>()));
    float def = upper ? INFINITY : -INFINITY;
    return (M)c.node.attr_float(upper ? "max" : "min", def);
  }
  if (c.has_input(i)) {
    const Tensor& t = c.input(i);
    ONYX_CHECK(t.numel() == 1, c.node.describe(), ": Clip ", upper ? "max" : "min",
               " must be a scalar, got shape ", shape_str(t.shape()));
    ONYX_CHECK(t.dtype() == c.input(0).dtype(), c.node.describe(), ": Clip bound dtype ",
               dtype_name(t.dtype()), " differs from input dtype ", dtype_name(c.input(0).dtype()));
    return load(t.data<T>()[0]);
  }
  if constexpr (std::is_floating_point_v<M>)
    return upper ? M(INFINITY) : M(-INFINITY);
  else
    return upper ? std::numeric_limits<M>::max() : std::numeric_limits<M>::lowest();
}

void add_clip(KernelFamilyRegistrar& r) {
  OpKernel k;
  k.infer = [](InferContext& c) {
    const TensorMeta& x = c.input(0);
    require_dtype(x.dtype, NumericTypes{}, c.node);
    c.set_output(0, x.dtype, x.shape);
  };
  k.compute = [](KernelContext& c) {
    const Tensor& x = c.input(0);
    Tensor& y = c.output(0);
    dispatch(x.dtype(), NumericTypes{}, c.node, [&](auto tag) {
      using T = typename decltype(tag)::type;
      ClipOp::Bounds<Math<T>> op{clip_bound<T>(c, 1, false), clip_bound<T>(c, 2, true)};
      unary_apply<T>(x.data<T>(), y.data<T>(), x.numel(), op, kGrain);
    });
  };
  r.add("", "Clip", std::move(k));
}

// com.microsoft FastGelu(X, bias?) / BiasGelu(A, B): gelu(x + bias), bias broadcast over the
// last dimension: X (..., C), bias (C).
void add_bias_gelu(KernelFamilyRegistrar& r, const char* name, bool tanh_form, bool bias_required) {
  OpKernel k;
  k.infer = [bias_required](InferContext& c) {
    const TensorMeta& x = c.input(0);
    require_dtype(x.dtype, FloatTypes{}, c.node);
    if (bias_required) c.input(1);
    if (c.has_input(1)) {
      const TensorMeta& b = c.input(1);
      ONYX_CHECK(b.dtype == x.dtype, c.node.describe(), ": bias dtype ", dtype_name(b.dtype),
                 " differs from input dtype ", dtype_name(x.dtype));
      ONYX_CHECK(broadcast_shapes(x.shape, b.shape) == x.shape, c.node.describe(), ": bias shape ",
                 shape_str(b.shape), " does not broadcast to input shape ", shape_str(x.shape));
    }
    c.set_output(0, x.dtype, x.shape);
  };
  k.compute = [tanh_form](KernelContext& c) {
    const Tensor& x = c.input(0);
    Tensor& y = c.output(0);
    const Tensor* src = &x;
    dispatch(x.dtype(), FloatTypes{}, c.node, [&](auto tag) {
      using T = typename decltype(tag)::type;
      if (c.has_input(1)) {  // y = x + bias, then gelu in place
        binary_apply<T, T, T>(x, c.input(1), y, [](auto a, auto b) { return a + b; });
        src = &y;
      }
      unary_apply<T>(src->data<T>(), y.data<T>(), x.numel(), Gelu{tanh_form}, kGrainMath);
    });
  };
  r.add("com.microsoft", name, std::move(k));
}

// ---- fused gradients ("onyx" domain) ------------------------------------------------------------
// GeluGrad(dy, x, bias?), ErfGrad(dy, x) and ReluGrad / SigmoidGrad / TanhGrad(dy, y) (see the top
// comment). float32 works in blocks of kGradBlock so the erf / exp above are used and every other
// loop vectorizes; float16/bfloat16 go through the same float blocks; float64 is scalar.

using simd::kGradBlock;

// float64 scalar formulas.
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
      alignas(32) float xb[kGradBlock], dyb[kGradBlock], out[kGradBlock];
      for (int64_t i = b; i < e; i += kGradBlock) {
        const int64_t m = std::min(kGradBlock, e - i);
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
void add_grad_kernel(KernelFamilyRegistrar& r, const char* name, bool with_bias,
                     std::function<std::pair<BlockFn, ScalarFn>(const KernelContext&)> pick,
                     int64_t grain) {
  OpKernel k;
  k.infer = [with_bias](InferContext& c) {
    const TensorMeta& dy = c.input(0);
    const TensorMeta& v = c.input(1);
    require_dtype(dy.dtype, FloatTypes{}, c.node);
    // float32 dy with a bfloat16 v (a GEMM output the mixed-precision pass stores in bf16): dx
    // float32
    const bool mixed =
        dy.dtype == DType::Float32 && v.dtype == DType::BFloat16 && !(with_bias && c.has_input(2));
    ONYX_CHECK((dy.dtype == v.dtype || mixed) && dy.shape == v.shape, c.node.describe(), ": dy ",
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
    if (dy.dtype() == DType::Float32 && v.dtype() == DType::BFloat16) {
      const float* pdy = dy.data<float>();
      const BFloat16* pv = v.data<BFloat16>();
      float* pdx = dx.data<float>();
      parallel_for(dx.numel(), grain, [&](int64_t b, int64_t e) {
        alignas(32) float xb[kGradBlock];
        for (int64_t i = b; i < e; i += kGradBlock) {
          const int64_t m = std::min(kGradBlock, e - i);
          to_float(pv + i, xb, m);
          block(pdy + i, xb, pdx + i, m);
        }
      });
      return;
    }
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

ONYX_REGISTER_KERNELS(unary, Cpu) {
  // cheap ops
  add_simple<Neg>(r, "Neg", SignedTypes{}, kGrain);
  add_simple<Abs>(r, "Abs", NumericTypes{}, kGrain);
  add_simple<Sign>(r, "Sign", NumericTypes{}, kGrain);
  add_simple<Relu>(r, "Relu", SignedTypes{}, kGrain);
  add_simple<Reciprocal>(r, "Reciprocal", FloatTypes{}, kGrain);
  add_simple<Sqrt>(r, "Sqrt", FloatTypes{}, kGrain);
  add_simple<Ceil>(r, "Ceil", FloatTypes{}, kGrain);
  add_simple<Floor>(r, "Floor", FloatTypes{}, kGrain);
  add_simple<Round>(r, "Round", FloatTypes{}, kGrain);
  add_simple<Not>(r, "Not", BoolTypes{}, kGrain);
  add_simple<Softsign>(r, "Softsign", FloatTypes{}, kGrain);
  add_simple<HardSwish>(r, "HardSwish", FloatTypes{}, kGrain);
  add_unary(
      r, "", "LeakyRelu", FloatTypes{},
      [](const KernelContext& c) { return LeakyRelu{c.node.attr_float("alpha", 0.01f)}; }, kGrain);
  add_unary(
      r, "", "ThresholdedRelu", FloatTypes{},
      [](const KernelContext& c) { return ThresholdedRelu{c.node.attr_float("alpha", 1.0f)}; },
      kGrain);
  add_unary(
      r, "", "HardSigmoid", FloatTypes{},
      [](const KernelContext& c) {
        return HardSigmoid{c.node.attr_float("alpha", 0.2f), c.node.attr_float("beta", 0.5f)};
      },
      kGrain);
  add_unary(
      r, "", "Shrink", NumericTypes{},
      [](const KernelContext& c) {
        return Shrink{c.node.attr_float("lambd", 0.5f), c.node.attr_float("bias", 0.0f)};
      },
      kGrain);

  // transcendental ops
  add_simple<Exp>(r, "Exp", FloatTypes{}, kGrainMath);
  add_simple<Log>(r, "Log", FloatTypes{}, kGrainMath);
  add_simple<Tanh>(r, "Tanh", FloatTypes{}, kGrainMath);
  add_simple<Sigmoid>(r, "Sigmoid", FloatTypes{}, kGrainMath);
  add_simple<Erf>(r, "Erf", FloatTypes{}, kGrainMath);
  add_simple<Sin>(r, "Sin", FloatTypes{}, kGrainMath);
  add_simple<Cos>(r, "Cos", FloatTypes{}, kGrainMath);
  add_simple<Tan>(r, "Tan", FloatTypes{}, kGrainMath);
  add_simple<Asin>(r, "Asin", FloatTypes{}, kGrainMath);
  add_simple<Acos>(r, "Acos", FloatTypes{}, kGrainMath);
  add_simple<Atan>(r, "Atan", FloatTypes{}, kGrainMath);
  add_simple<Sinh>(r, "Sinh", FloatTypes{}, kGrainMath);
  add_simple<Cosh>(r, "Cosh", FloatTypes{}, kGrainMath);
  add_simple<Asinh>(r, "Asinh", FloatTypes{}, kGrainMath);
  add_simple<Acosh>(r, "Acosh", FloatTypes{}, kGrainMath);
  add_simple<Atanh>(r, "Atanh", FloatTypes{}, kGrainMath);
  add_simple<Softplus>(r, "Softplus", FloatTypes{}, kGrainMath);
  add_unary(
      r, "", "Elu", FloatTypes{},
      [](const KernelContext& c) { return Elu{c.node.attr_float("alpha", 1.0f)}; }, kGrainMath);
  add_unary(
      r, "", "Celu", FloatTypes{},
      [](const KernelContext& c) { return Celu{c.node.attr_float("alpha", 1.0f)}; }, kGrainMath);
  add_unary(
      r, "", "Selu", FloatTypes{},
      [](const KernelContext& c) {
        return Selu{c.node.attr_float("alpha", 1.67326319217681884765625f),
                    c.node.attr_float("gamma", 1.05070102214813232421875f)};
      },
      kGrainMath);

  // Gelu: ONNX (opset 20) with approximate = "none" | "tanh", and the same op in the onyx domain
  // (what gelu_fusion emits into models importing an opset below 20); com.microsoft Gelu (erf
  // form).
  for (const char* domain : {"", "onyx"})
    add_unary(
        r, domain, "Gelu", FloatTypes{},
        [](const KernelContext& c) {
          std::string approx = c.node.attr_string("approximate", "none");
          if (approx != "none" && approx != "tanh")
            ONYX_UNSUPPORTED(c.node.describe(), ": Gelu approximate='", approx, "'");
          return Gelu{approx == "tanh"};
        },
        kGrainMath);
  add_unary(
      r, "com.microsoft", "Gelu", FloatTypes{}, [](const KernelContext&) { return Gelu{false}; },
      kGrainMath);
  add_unary(
      r, "onyx", "Silu", FloatTypes{}, [](const KernelContext&) { return Silu{}; }, kGrainMath);
  add_bias_gelu(r, "FastGelu", /*tanh_form=*/true, /*bias_required=*/false);
  add_bias_gelu(r, "BiasGelu", /*tanh_form=*/false, /*bias_required=*/true);

  add_clip(r);
  add_predicate(r, "IsNaN", [](auto v, bool, bool) { return v != v; });
  add_predicate(r, "IsInf", [](auto v, bool pos, bool neg) {
    return std::isinf(v) && ((v > 0 && pos) || (v < 0 && neg));
  });

  // the fused gradients
  add_grad_kernel(
      r, "GeluGrad", /*with_bias=*/true,
      [](const KernelContext& c) -> std::pair<BlockFn, ScalarFn> {
        std::string approx = c.node.attr_string("approximate", "none");
        if (approx == "tanh") return {simd::gelu_tanh_grad, gelu_tanh_grad};
        if (approx != "none") ONYX_UNSUPPORTED(c.node.describe(), ": approximate='", approx, "'");
        return {simd::gelu_erf_grad, gelu_erf_grad};
      },
      kGrainMath);
  add_grad_kernel(
      r, "ErfGrad", false,
      [](const KernelContext&) -> std::pair<BlockFn, ScalarFn> {
        return {simd::erf_grad,
                [](double dy, double x) { return dy * 1.12837916709551257390 * std::exp(-x * x); }};
      },
      kGrainMath);
  add_grad_kernel(
      r, "SiluGrad", false,
      [](const KernelContext&) -> std::pair<BlockFn, ScalarFn> {
        return {simd::silu_grad, [](double dy, double x) {
                  double s = 1.0 / (1.0 + std::exp(-x));
                  return dy * s * (1.0 + x * (1.0 - s));
                }};
      },
      kGrainMath);
  add_grad_kernel(
      r, "ReluGrad", false,
      [](const KernelContext&) -> std::pair<BlockFn, ScalarFn> {
        return {simd::relu_grad, [](double dy, double y) { return y > 0 ? dy : 0.0; }};
      },
      kGrain);
  add_grad_kernel(
      r, "SigmoidGrad", false,
      [](const KernelContext&) -> std::pair<BlockFn, ScalarFn> {
        return {simd::sigmoid_grad, [](double dy, double y) { return dy * y * (1.0 - y); }};
      },
      kGrain);
  add_grad_kernel(
      r, "TanhGrad", false,
      [](const KernelContext&) -> std::pair<BlockFn, ScalarFn> {
        return {simd::tanh_grad, [](double dy, double y) { return dy * (1.0 - y * y); }};
      },
      kGrain);
}

// Exposed for the kernel tests: float32 vector math against libm.
namespace ew {
void erf_f32(const float* x, float* y, int64_t n) { simd::erf(x, y, n); }
void exp_f32(const float* x, float* y, int64_t n) { simd::exp(x, y, n); }
void tanh_f32(const float* x, float* y, int64_t n) { simd::tanh(x, y, n); }
}  // namespace ew

}  // namespace onyx::kernels
