// kernels/elementwise/binary.cc — multi-input elementwise ops with numpy broadcasting: Add Sub Mul
// Div Pow Mod BitShift PRelu, comparisons (Equal Less Greater LessOrEqual GreaterOrEqual -> bool),
// logic (And Or Xor), variadic Min Max Sum Mean, and Where.
// Hand-written so that the broadcast collapses to flat inner loops (ew::plan_walk): same-shape,
// scalar and row-broadcast operands run as contiguous `omp simd` loops (float32 Add/Sub/Mul/Div
// through simd/arith.cc, at the chosen SIMD path's width), which is what bias adds, residuals and
// scalings in transformer graphs need.
#include "kernels/elementwise/elementwise.h"

namespace onyx::kernels {
namespace {

using namespace ew;

// ---- ops on math types ----------------------------------------------------------------------

struct AddOp {
  static constexpr simd::BinaryOp kSimd = simd::BinaryOp::Add;  // float32 rows: simd/arith.cc
  template <class M>
  M operator()(M a, M b) const {
    if constexpr (std::is_integral_v<M>)
      return wrap_add(a, b);
    else
      return a + b;
  }
};
struct SubOp {
  static constexpr simd::BinaryOp kSimd = simd::BinaryOp::Sub;  // float32 rows: simd/arith.cc
  template <class M>
  M operator()(M a, M b) const {
    if constexpr (std::is_integral_v<M>)
      return wrap_sub(a, b);
    else
      return a - b;
  }
};
struct MulOp {
  static constexpr simd::BinaryOp kSimd = simd::BinaryOp::Mul;  // float32 rows: simd/arith.cc
  template <class M>
  M operator()(M a, M b) const {
    if constexpr (std::is_integral_v<M>)
      return wrap_mul(a, b);
    else
      return a * b;
  }
};
// Integer division truncates toward zero (C, as ONNX specifies); x/0 gives 0 instead of a trap.
struct DivOp {
  static constexpr simd::BinaryOp kSimd = simd::BinaryOp::Div;  // float32 rows: simd/arith.cc
  template <class M>
  M operator()(M a, M b) const {
    if constexpr (std::is_integral_v<M>) {
      if (b == 0) return 0;
      if constexpr (std::is_signed_v<M>)
        if (b == M(-1)) return wrap_sub<M>(0, a);
      return M(a / b);
    } else {
      return a / b;
    }
  }
};
// fmod=0: result takes the divisor's sign (Python %); fmod=1: the dividend's (C fmod).
struct ModOp {
  bool fmod;
  template <class M>
  M operator()(M a, M b) const {
    M r;
    if constexpr (std::is_integral_v<M>) {
      if (b == 0) return 0;
      if constexpr (std::is_signed_v<M>)
        if (b == M(-1)) return 0;
      r = M(a % b);
    } else {
      r = std::fmod(a, b);
    }
    if constexpr (std::is_signed_v<M> || std::is_floating_point_v<M>)
      if (!fmod && r != 0 && ((r < 0) != (b < 0))) r = M(r + b);
    return r;
  }
};
// A shift by a negative amount or by the bit width or more gives 0 (an arithmetic right shift of
// a negative signed value gives -1); a left shift of a signed value shifts its two's-complement
// bits (ONNX BitShift, which accepts signed types since opset 28).
struct BitShiftOp {
  bool left;
  template <class M>
  M operator()(M a, M b) const {
    using U = std::make_unsigned_t<M>;
    if (b < M(0) || b >= M(sizeof(M) * 8)) return (!left && a < M(0)) ? M(-1) : M(0);
    return left ? M(U(U(a) << U(b))) : M(a >> b);
  }
};
struct PReluOp {
  template <class M>
  M operator()(M x, M slope) const {
    if constexpr (std::is_integral_v<M>)
      return x < 0 ? wrap_mul(slope, x) : x;
    else
      return x < 0 ? slope * x : x;
  }
};
// Min/Max propagate NaN (numpy minimum/maximum).
struct MaxOp {
  template <class M>
  M operator()(M a, M b) const {
    if constexpr (std::is_floating_point_v<M>)
      if (b != b) return b;
    return b > a ? b : a;
  }
};
struct MinOp {
  template <class M>
  M operator()(M a, M b) const {
    if constexpr (std::is_floating_point_v<M>)
      if (b != b) return b;
    return b < a ? b : a;
  }
};

struct EqualOp {
  template <class M>
  bool operator()(M a, M b) const {
    return a == b;
  }
};
struct LessOp {
  template <class M>
  bool operator()(M a, M b) const {
    return a < b;
  }
};
struct GreaterOp {
  template <class M>
  bool operator()(M a, M b) const {
    return a > b;
  }
};
struct LessEqualOp {
  template <class M>
  bool operator()(M a, M b) const {
    return a <= b;
  }
};
struct GreaterEqualOp {
  template <class M>
  bool operator()(M a, M b) const {
    return a >= b;
  }
};
struct AndOp {
  bool operator()(bool a, bool b) const { return a && b; }
};
struct OrOp {
  bool operator()(bool a, bool b) const { return a || b; }
};
struct XorOp {
  bool operator()(bool a, bool b) const { return a != b; }
};

// ---- registration ---------------------------------------------------------------------------

void check_same_dtype(const InferContext& c, int i, int j) {
  ONYX_CHECK(c.input(i).dtype == c.input(j).dtype, c.node.describe(), ": input ", i, " is ",
             dtype_name(c.input(i).dtype), " but input ", j, " is ", dtype_name(c.input(j).dtype));
}

// A two-input op with one dtype for both inputs; output dtype bool (comparisons) or the input's.
template <bool kBoolOut, class L, class Make>
void add_binary(KernelFamilyRegistrar& r, const char* name, L types, Make make) {
  OpKernel k;
  k.infer = [types](InferContext& c) {
    const TensorMeta& a = c.input(0);
    const TensorMeta& b = c.input(1);
    check_same_dtype(c, 0, 1);
    require_dtype(a.dtype, types, c.node);
    c.set_output(0, kBoolOut ? DType::Bool : a.dtype, broadcast_shapes(a.shape, b.shape));
  };
  k.compute = [types, make](KernelContext& c) {
    const Tensor& a = c.input(0);
    const Tensor& b = c.input(1);
    Tensor& out = c.output(0);
    const auto op = make(c);
    dispatch(a.dtype(), types, c.node, [&](auto tag) {
      using T = typename decltype(tag)::type;
      using O = std::conditional_t<kBoolOut, bool, T>;
      binary_apply<T, T, O>(a, b, out, op);
    });
  };
  k.inplace = {{0, 0}, {0, 1}};  // out[i] reads a[i], b[i] first (never over a broadcast operand)
  r.add("", name, std::move(k)).per_token =
      OpTraits::PerToken::Binary;  // elementwise, broadcasting
}

template <bool kBoolOut, class Op, class L>
void add_simple_binary(KernelFamilyRegistrar& r, const char* name, L types) {
  add_binary<kBoolOut>(r, name, types, [](const KernelContext&) { return Op{}; });
}

// ---- Pow: base and exponent may differ in dtype; the output has the base's ------------------

using PowBaseTypes = Types<float, double, Half, BFloat16, int32_t, int64_t>;

template <class I>
I int_pow(I base, int64_t e) {
  if (e < 0) {  // only |base| == 1 survives truncation
    if (base == 1) return 1;
    if constexpr (std::is_signed_v<I>)
      if (base == I(-1)) return (e & 1) ? I(-1) : I(1);
    return 0;
  }
  I result = 1;
  while (e > 0) {
    if (e & 1) result = wrap_mul(result, base);
    base = wrap_mul(base, base);
    e >>= 1;
  }
  return result;
}

struct PowOp {
  template <class MA, class MB>
  MA operator()(MA a, MB b) const {
    if constexpr (std::is_integral_v<MA> && std::is_integral_v<MB>) {
      if constexpr (std::is_unsigned_v<MB>)
        if (b > MB(std::numeric_limits<int64_t>::max()))
          return int_pow<MA>(a, std::numeric_limits<int64_t>::max());
      return int_pow<MA>(a, (int64_t)b);
    } else if constexpr (std::is_integral_v<MA>) {
      return float_to_int<MA>(std::pow((double)a, (double)b));
    } else if constexpr (std::is_same_v<MA, float> && std::is_same_v<MB, float>) {
      return std::pow(a, b);
    } else {
      return (MA)std::pow((double)a, (double)b);
    }
  }
};

void add_pow(KernelFamilyRegistrar& r) {
  OpKernel k;
  k.infer = [](InferContext& c) {
    const TensorMeta& a = c.input(0);
    const TensorMeta& b = c.input(1);
    require_dtype(a.dtype, PowBaseTypes{}, c.node, "base");
    require_dtype(b.dtype, NumericTypes{}, c.node, "exponent");
    c.set_output(0, a.dtype, broadcast_shapes(a.shape, b.shape));
  };
  k.compute = [](KernelContext& c) {
    const Tensor& a = c.input(0);
    const Tensor& b = c.input(1);
    Tensor& out = c.output(0);
    // float32 ** scalar 2 / 3 / 0.5 / 1 / -1 (variance, tanh-Gelu and RMS decompositions): plain
    // arithmetic as PyTorch does for these exponents, instead of a libm powf per element.
    if (a.dtype() == DType::Float32 && b.numel() == 1 && out.shape() == a.shape()) {
      const double e = b.get_as_double(0);
      const float* x = a.data<float>();
      float* y = out.data<float>();
      auto run = [&](auto f) {
        parallel_for(a.numel(), kGrain, [&](int64_t lo, int64_t hi) {
#pragma omp simd
          for (int64_t i = lo; i < hi; i++) y[i] = f(x[i]);
        });
      };
      if (e == 2.0) return run([](float v) { return v * v; });
      if (e == 3.0) return run([](float v) { return v * v * v; });
      if (e == 1.0) return run([](float v) { return v; });
      if (e == -1.0) return run([](float v) { return 1.0f / v; });
      if (e == 0.5) return run([](float v) { return __builtin_sqrtf(v); });
    }
    dispatch(a.dtype(), PowBaseTypes{}, c.node, [&](auto ta) {
      using A = typename decltype(ta)::type;
      dispatch(b.dtype(), NumericTypes{}, c.node, [&](auto tb) {
        using B = typename decltype(tb)::type;
        binary_apply<A, B, A>(a, b, out, PowOp{}, kGrainMath);
      });
    });
  };
  r.add("", "Pow", std::move(k)).per_token =
      OpTraits::PerToken::Binary;  // elementwise, broadcasting
}

// ---- PRelu: slope broadcasts unidirectionally to X ------------------------------------------

void add_prelu(KernelFamilyRegistrar& r) {
  OpKernel k;
  k.infer = [](InferContext& c) {
    const TensorMeta& x = c.input(0);
    const TensorMeta& s = c.input(1);
    check_same_dtype(c, 0, 1);
    require_dtype(x.dtype, SignedTypes{}, c.node);
    ONYX_CHECK(broadcast_shapes(x.shape, s.shape) == x.shape, c.node.describe(), ": slope shape ",
               shape_str(s.shape), " does not broadcast to X shape ", shape_str(x.shape));
    c.set_output(0, x.dtype, x.shape);
  };
  k.compute = [](KernelContext& c) {
    const Tensor& x = c.input(0);
    dispatch(x.dtype(), SignedTypes{}, c.node, [&](auto tag) {
      using T = typename decltype(tag)::type;
      binary_apply<T, T, T>(x, c.input(1), c.output(0), PReluOp{});
    });
  };
  r.add("", "PRelu", std::move(k));
}

// ---- variadic Min / Max / Sum / Mean --------------------------------------------------------

template <class Op, class L>
void add_variadic(KernelFamilyRegistrar& r, const char* name, L types, bool mean) {
  OpKernel k;
  k.infer = [types](InferContext& c) {
    ONYX_CHECK(c.num_inputs() >= 1, c.node.describe(), ": needs at least one input");
    Shape shape = c.input(0).shape;
    for (int i = 1; i < c.num_inputs(); i++) {
      check_same_dtype(c, 0, i);
      shape = broadcast_shapes(shape, c.input(i).shape);
    }
    require_dtype(c.input(0).dtype, types, c.node);
    c.set_output(0, c.input(0).dtype, shape);
  };
  k.compute = [types, mean](KernelContext& c) {
    Tensor& out = c.output(0);
    const int n = c.num_inputs();
    if (n == 1 && out.raw() == c.input(0).raw()) return;  // written over its only input
    dispatch(out.dtype(), types, c.node, [&](auto tag) {
      using T = typename decltype(tag)::type;
      const Tensor& a = c.input(0);
      int next = 1;
      if (n >= 2 && broadcast_shapes(a.shape(), c.input(1).shape()) == out.shape()) {
        binary_apply<T, T, T>(a, c.input(1), out, Op{});
        next = 2;
      } else {
        expand_into(a, out);
      }
      for (int i = next; i < n; i++) binary_apply<T, T, T>(out, c.input(i), out, Op{});
      if (mean && n > 1) {
        T* y = out.data<T>();
        const Math<T> count = Math<T>(n);
        parallel_for(out.numel(), kGrain, [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; i++) y[i] = store<T>(load(y[i]) / count);
        });
      }
    });
  };
  // The output over input 0 or 1 (when one dies here with the output's element count: then
  // the first two inputs take the binary_apply branch, which reads a[i] and b[i] before writing
  // out[i], and later inputs only read out[i] before writing it). A tied weight's gradient
  // (Sum of its contributions) then needs no third weight-sized buffer.
  k.inplace = {{0, 0}, {0, 1}};
  r.add("", name, std::move(k)).per_token =
      OpTraits::PerToken::Binary;  // elementwise, broadcasting
}

// ---- Where(condition, X, Y) -----------------------------------------------------------------

// One run of Where with compile-time 0/1 strides, so each of the 8 layouts is a plain loop.
template <class U, int SC, int SX, int SY>
void where_run(const uint8_t* c, const U* a, const U* b, U* o, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; i++) o[i] = c[i * SC] ? a[i * SX] : b[i * SY];
}

template <class U>
void where_typed(const Tensor& cond, const Tensor& x, const Tensor& y, Tensor& out) {
  BroadcastWalk w = plan_walk(out.shape(), {cond.shape(), x.shape(), y.shape()});
  const uint8_t* pc = static_cast<const uint8_t*>(cond.raw());
  const U* px = static_cast<const U*>(x.raw());
  const U* py = static_cast<const U*>(y.raw());
  U* po = static_cast<U*>(out.raw());
  const int64_t sc = w.inner_stride[0], sx = w.inner_stride[1], sy = w.inner_stride[2];
  walk<3>(w, kGrain, [&](const int64_t* off, int64_t pos, int64_t n) {
    const uint8_t* c = pc + off[0];
    const U* a = px + off[1];
    const U* b = py + off[2];
    U* o = po + pos;
    switch (sc * 4 + sx * 2 + sy) {
      case 0:
        where_run<U, 0, 0, 0>(c, a, b, o, n);
        break;
      case 1:
        where_run<U, 0, 0, 1>(c, a, b, o, n);
        break;
      case 2:
        where_run<U, 0, 1, 0>(c, a, b, o, n);
        break;
      case 3:
        where_run<U, 0, 1, 1>(c, a, b, o, n);
        break;
      case 4:
        where_run<U, 1, 0, 0>(c, a, b, o, n);
        break;
      case 5:
        where_run<U, 1, 0, 1>(c, a, b, o, n);
        break;
      case 6:
        where_run<U, 1, 1, 0>(c, a, b, o, n);
        break;
      default:
        where_run<U, 1, 1, 1>(c, a, b, o, n);
        break;
    }
  });
}

void add_where(KernelFamilyRegistrar& r) {
  OpKernel k;
  k.infer = [](InferContext& c) {
    ONYX_CHECK(c.input(0).dtype == DType::Bool, c.node.describe(), ": condition must be bool, got ",
               dtype_name(c.input(0).dtype));
    check_same_dtype(c, 1, 2);
    require_dtype(c.input(1).dtype, AllTypes{}, c.node);
    Shape s =
        broadcast_shapes(c.input(0).shape, broadcast_shapes(c.input(1).shape, c.input(2).shape));
    c.set_output(0, c.input(1).dtype, s);
  };
  k.compute = [](KernelContext& c) {
    Tensor& out = c.output(0);
    if (out.numel() == 0) return;
    const Tensor &cond = c.input(0), &x = c.input(1), &y = c.input(2);
    switch (dtype_size(out.dtype())) {
      case 1:
        where_typed<uint8_t>(cond, x, y, out);
        break;
      case 2:
        where_typed<uint16_t>(cond, x, y, out);
        break;
      case 4:
        where_typed<uint32_t>(cond, x, y, out);
        break;
      case 8:
        where_typed<uint64_t>(cond, x, y, out);
        break;
      default:
        ONYX_UNSUPPORTED(c.node.describe(), ": dtype ", dtype_name(out.dtype()));
    }
  };
  r.add("", "Where", std::move(k));
}

}  // namespace

ONYX_REGISTER_KERNELS(binary, Cpu) {
  add_simple_binary<false, AddOp>(r, "Add", NumericTypes{});
  add_simple_binary<false, SubOp>(r, "Sub", NumericTypes{});
  add_simple_binary<false, MulOp>(r, "Mul", NumericTypes{});
  add_simple_binary<false, DivOp>(r, "Div", NumericTypes{});
  add_binary<false>(r, "Mod", NumericTypes{},
                    [](const KernelContext& c) { return ModOp{c.node.attr_int("fmod", 0) != 0}; });
  add_binary<false>(r, "BitShift", IntTypes{}, [](const KernelContext& c) {
    std::string dir = c.node.attr_string("direction", "");
    ONYX_CHECK(dir == "LEFT" || dir == "RIGHT", c.node.describe(),
               ": direction must be LEFT or RIGHT, got '", dir, "'");
    return BitShiftOp{dir == "LEFT"};
  });
  add_pow(r);
  add_prelu(r);

  add_simple_binary<true, EqualOp>(r, "Equal", AllTypes{});
  add_simple_binary<true, LessOp>(r, "Less", NumericTypes{});
  add_simple_binary<true, GreaterOp>(r, "Greater", NumericTypes{});
  add_simple_binary<true, LessEqualOp>(r, "LessOrEqual", NumericTypes{});
  add_simple_binary<true, GreaterEqualOp>(r, "GreaterOrEqual", NumericTypes{});
  add_simple_binary<true, AndOp>(r, "And", BoolTypes{});
  add_simple_binary<true, OrOp>(r, "Or", BoolTypes{});
  add_simple_binary<true, XorOp>(r, "Xor", BoolTypes{});

  add_variadic<MaxOp>(r, "Max", NumericTypes{}, false);
  add_variadic<MinOp>(r, "Min", NumericTypes{}, false);
  add_variadic<AddOp>(r, "Sum", FloatTypes{}, false);
  add_variadic<AddOp>(r, "Mean", FloatTypes{}, true);
  add_where(r);
}

}  // namespace onyx::kernels
