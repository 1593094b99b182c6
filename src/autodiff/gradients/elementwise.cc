// elementwise.cc — gradient rules for elementwise ops. Each rule is a few emitted nodes; the
// builder (GradContext::set) undoes broadcasting by summing over broadcast axes and casts a
// gradient to its input's dtype. Activations with a cheap closed form on their output or input
// use the fused "onyx" kernels of kernels/elementwise/unary.cc (GeluGrad, ReluGrad,
// SigmoidGrad, TanhGrad, ErfGrad, SiluGrad).
//
// Conventions at kinks follow PyTorch (the parity reference): Relu/Abs give 0 at 0, LeakyRelu/
// Elu/Selu take the negative branch at 0, Clip passes the gradient where min <= x <= max (as
// torch.clamp and ONNX Runtime), and Min/Max split the gradient evenly among the inputs equal to
// the result (torch.maximum/minimum and ONNX Runtime's Min/Max gradient do the same).
#include "autodiff/gradient.h"

namespace onyx::autodiff {
namespace {

DType dtype_of(GradContext& c, const std::string& v) { return c.meta(v).dtype; }

// A 0-D constant with `like`'s dtype.
std::string scalar_like(GradContext& c, double v, const std::string& like) {
  return c.const_scalar(v, dtype_of(c, like));
}

std::string mul(GradContext& c, const std::string& a, const std::string& b) {
  return c.emit1("Mul", {a, b});
}

// where(cond, a, 0) or where(cond, 0, a)
std::string where_zero(GradContext& c, const std::string& cond, const std::string& a,
                       bool keep_true = true) {
  std::string zero = scalar_like(c, 0.0, a);
  return keep_true ? c.emit1("Where", {cond, a, zero}) : c.emit1("Where", {cond, zero, a});
}

// Unary rule dx = dy * f where f is built from the forward node.
template <class F>
GradRule unary(F f) {
  return [f](GradContext& c) {
    if (!c.needs(0)) return;
    c.set(0, f(c, c.GO(0)));
  };
}

// Fused onyx kernel Name(dy, v) for a unary op; v = forward input (use_output=false) or output.
GradRule fused(const char* name, bool use_output) {
  return unary([name, use_output](GradContext& c, const std::string& dy) {
    return c.emit1(name, {dy, use_output ? c.O(0) : c.I(0)}, {}, "onyx");
  });
}

// Gelu on x (+ bias along the last axis): GeluGrad(dy, x, bias?) gives dx; bias gets dx reduced.
void gelu_rule(GradContext& c, const std::string& approximate, int bias_input) {
  bool has_bias = bias_input >= 0 && !c.I(bias_input).empty();
  if (!c.needs(0) && !(has_bias && c.needs(bias_input))) return;
  std::vector<std::string> in = {c.GO(0), c.I(0)};
  if (has_bias) {
    const Shape& xs = c.meta(c.I(0)).shape;
    const Shape& bs = c.meta(c.I(bias_input)).shape;
    if (bs.size() == 1 && !xs.empty() && bs[0] == xs.back()) {
      in.push_back(c.I(bias_input));
    } else {  // any other broadcastable bias: add it first
      in[1] = c.emit1("Add", {c.I(0), c.I(bias_input)});
    }
  }
  std::string dx = c.emit1("GeluGrad", in, {{"approximate", attr_s(approximate)}}, "onyx");
  c.set(0, dx);
  if (has_bias) c.set(bias_input, dx);
}

// Max/Min(x0, x1, ...): dy goes to the inputs equal to y, split evenly among ties.
void min_max_rule(GradContext& c) {
  const int n = c.num_inputs();
  if (n == 1) return c.set(0, c.GO(0));
  DType dt = dtype_of(c, c.O(0));
  std::vector<std::string> masks;
  for (int i = 0; i < n; i++)
    masks.push_back(
        c.emit1("Cast", {c.emit1("Equal", {c.I(i), c.O(0)})}, {{"to", attr_i((int64_t)dt)}}));
  std::string count = c.emit1("Sum", masks);
  std::string share = c.emit1("Div", {c.GO(0), count});
  for (int i = 0; i < n; i++)
    if (c.needs(i)) c.set(i, mul(c, share, masks[i]));
}

}  // namespace

// Add, Sub, Mul, Div, Neg, Identity, Sum, Mean, Pow.
ONYX_REGISTER_GRADIENTS(arithmetic) {
  // y = a + b: da = dy, db = dy
  r.add("", "Add", [](GradContext& c) {
    c.set(0, c.GO(0));
    c.set(1, c.GO(0));
  });
  // y = a - b: da = dy, db = -dy
  r.add("", "Sub", [](GradContext& c) {
    c.set(0, c.GO(0));
    if (c.needs(1)) c.set(1, c.emit1("Neg", {c.GO(0)}));
  });
  // y = a * b: da = dy * b, db = dy * a
  r.add("", "Mul", [](GradContext& c) {
    if (c.needs(0)) c.set(0, c.emit1("Mul", {c.GO(0), c.I(1)}));
    if (c.needs(1)) c.set(1, c.emit1("Mul", {c.GO(0), c.I(0)}));
  });
  // y = a / b: da = dy / b, db = -dy * y / b
  r.add("", "Div", [](GradContext& c) {
    if (c.needs(0)) c.set(0, c.emit1("Div", {c.GO(0), c.I(1)}));
    if (c.needs(1)) {
      std::string t = c.emit1("Mul", {c.GO(0), c.O(0)});
      c.set(1, c.emit1("Neg", {c.emit1("Div", {t, c.I(1)})}));
    }
  });
  r.add("", "Neg", [](GradContext& c) { c.set(0, c.emit1("Neg", {c.GO(0)})); });
  r.add("", "Identity", [](GradContext& c) { c.set(0, c.GO(0)); });
  // Sum(x0, x1, ...): every input gets dy (reduced to its shape)
  r.add("", "Sum", [](GradContext& c) {
    for (int i = 0; i < c.num_inputs(); i++) c.set(i, c.GO(0));
  });
  // Mean(x0, ..., xn-1): every input gets dy / n
  r.add("", "Mean", [](GradContext& c) {
    const int n = c.num_inputs();
    std::string g = n == 1 ? c.GO(0) : mul(c, c.GO(0), scalar_like(c, 1.0 / n, c.GO(0)));
    for (int i = 0; i < n; i++) c.set(i, g);
  });

  // y = a ^ b: da = dy * b * a^(b-1); db = dy * y * log(a), 0 where a == 0 and b >= 0 (PyTorch).
  // A constant scalar exponent (x^2 of decomposed LayerNorm, x^3 of tanh-Gelu) becomes plain
  // multiplications.
  r.add("", "Pow", [](GradContext& c) {
    const std::string dy = c.GO(0), a = c.I(0), b = c.I(1);  // copies: emitting may move nodes
    const DType adt = dtype_of(c, a);
    if (c.needs(0)) {
      const Tensor* bc = c.constant(b);
      std::string d;  // dy * d/da
      if (bc && bc->numel() == 1) {
        const double e = bc->get_as_double(0);
        if (e == 0.0) {
          d = "";  // constant output: no gradient
        } else if (e == 1.0) {
          d = dy;
        } else if (e == 2.0) {
          d = mul(c, dy, mul(c, a, c.const_scalar(2.0, adt)));
        } else if (e == 3.0) {
          d = mul(c, dy, mul(c, mul(c, a, a), c.const_scalar(3.0, adt)));
        } else if (e == 0.5) {  // y = sqrt(a): dy * 0.5 / y
          d = c.emit1("Div", {mul(c, dy, c.const_scalar(0.5, adt)), c.O(0)});
        } else {
          std::string p = c.emit1("Pow", {a, c.const_scalar(e - 1.0, adt)});
          d = mul(c, dy, mul(c, p, c.const_scalar(e, adt)));
        }
      } else {
        std::string bf =
            dtype_of(c, b) == adt ? b : c.emit1("Cast", {b}, {{"to", attr_i((int64_t)adt)}});
        std::string p = c.emit1("Pow", {a, c.emit1("Sub", {bf, c.const_scalar(1.0, adt)})});
        d = mul(c, dy, mul(c, bf, p));
      }
      if (!d.empty()) c.set(0, d);
    }
    if (c.needs(1)) {
      std::string t = mul(c, c.O(0), c.emit1("Log", {a}));
      std::string base_zero = c.emit1("Equal", {a, c.const_scalar(0.0, adt)});
      std::string exp_nonneg = c.emit1("GreaterOrEqual", {b, scalar_like(c, 0.0, b)});
      std::string cond = c.emit1("And", {base_zero, exp_nonneg});
      c.set(1, mul(c, dy, where_zero(c, cond, t, /*keep_true=*/false)));
    }
  });
}

// Sqrt, Reciprocal, Abs, Exp, Log, the trigonometric and hyperbolic functions, and the ones
// with a fused gradient kernel (Tanh, Sigmoid, Relu, Erf, onyx.Silu).
ONYX_REGISTER_GRADIENTS(unary_math) {
  // y = sqrt(x): dx = dy * 0.5 / y
  r.add("", "Sqrt", unary([](GradContext& c, const std::string& dy) {
          return c.emit1("Div", {mul(c, dy, scalar_like(c, 0.5, dy)), c.O(0)});
        }));
  // y = 1 / x: dx = -dy * y^2
  r.add("", "Reciprocal", unary([](GradContext& c, const std::string& dy) {
          return c.emit1("Neg", {mul(c, dy, mul(c, c.O(0), c.O(0)))});
        }));
  // y = |x|: dx = dy * sign(x) (0 at 0)
  r.add("", "Abs", unary([](GradContext& c, const std::string& dy) {
          return mul(c, dy, c.emit1("Sign", {c.I(0)}));
        }));
  // y = exp(x): dx = dy * y
  r.add("", "Exp", unary([](GradContext& c, const std::string& dy) { return mul(c, dy, c.O(0)); }));
  // y = sin(x): dx = dy cos(x); y = cos(x): dx = -dy sin(x) (rotary tables from a learned or
  // buffered frequency)
  r.add("", "Sin", unary([](GradContext& c, const std::string& dy) {
          return mul(c, dy, c.emit1("Cos", {c.I(0)}));
        }));
  r.add("", "Cos", unary([](GradContext& c, const std::string& dy) {
          return c.emit1("Neg", {mul(c, dy, c.emit1("Sin", {c.I(0)}))});
        }));
  // y = log(x): dx = dy / x
  r.add("", "Log", unary([](GradContext& c, const std::string& dy) {
          return c.emit1("Div", {dy, c.I(0)});
        }));
  // Trigonometric and hyperbolic functions and their inverses (PyTorch's formulas; outside the
  // domain, e.g. |x| >= 1 for Asin, the gradient is inf / nan as there).
  // y = tan(x): dx = dy (1 + y^2)
  r.add("", "Tan", unary([](GradContext& c, const std::string& dy) {
          std::string y2 = mul(c, c.O(0), c.O(0));
          return mul(c, dy, c.emit1("Add", {y2, scalar_like(c, 1.0, dy)}));
        }));
  // y = asin(x): dx = dy / sqrt(1 - x^2); y = acos(x): dx = -dy / sqrt(1 - x^2)
  auto one_minus_x2 = [](GradContext& c) {
    return c.emit1("Sub", {scalar_like(c, 1.0, c.I(0)), mul(c, c.I(0), c.I(0))});
  };
  r.add("", "Asin", unary([one_minus_x2](GradContext& c, const std::string& dy) {
          return c.emit1("Div", {dy, c.emit1("Sqrt", {one_minus_x2(c)})});
        }));
  r.add("", "Acos", unary([one_minus_x2](GradContext& c, const std::string& dy) {
          return c.emit1("Neg", {c.emit1("Div", {dy, c.emit1("Sqrt", {one_minus_x2(c)})})});
        }));
  // y = atan(x): dx = dy / (1 + x^2)
  r.add("", "Atan", unary([](GradContext& c, const std::string& dy) {
          std::string x2 = mul(c, c.I(0), c.I(0));
          return c.emit1("Div", {dy, c.emit1("Add", {x2, scalar_like(c, 1.0, c.I(0))})});
        }));
  // y = sinh(x): dx = dy cosh(x); y = cosh(x): dx = dy sinh(x)
  r.add("", "Sinh", unary([](GradContext& c, const std::string& dy) {
          return mul(c, dy, c.emit1("Cosh", {c.I(0)}));
        }));
  r.add("", "Cosh", unary([](GradContext& c, const std::string& dy) {
          return mul(c, dy, c.emit1("Sinh", {c.I(0)}));
        }));
  // y = asinh(x): dx = dy / sqrt(x^2 + 1); y = acosh(x): dx = dy / sqrt(x^2 - 1) (x > 1)
  r.add("", "Asinh", unary([](GradContext& c, const std::string& dy) {
          std::string x2 = mul(c, c.I(0), c.I(0));
          std::string s = c.emit1("Sqrt", {c.emit1("Add", {x2, scalar_like(c, 1.0, c.I(0))})});
          return c.emit1("Div", {dy, s});
        }));
  r.add("", "Acosh", unary([](GradContext& c, const std::string& dy) {
          std::string x2 = mul(c, c.I(0), c.I(0));
          std::string s = c.emit1("Sqrt", {c.emit1("Sub", {x2, scalar_like(c, 1.0, c.I(0))})});
          return c.emit1("Div", {dy, s});
        }));
  // y = atanh(x): dx = dy / (1 - x^2)
  r.add("", "Atanh", unary([one_minus_x2](GradContext& c, const std::string& dy) {
          return c.emit1("Div", {dy, one_minus_x2(c)});
        }));
  r.add("", "Tanh", fused("TanhGrad", /*use_output=*/true));
  r.add("", "Sigmoid", fused("SigmoidGrad", /*use_output=*/true));
  r.add("", "Relu", fused("ReluGrad", /*use_output=*/true));
  r.add("", "Erf", fused("ErfGrad", /*use_output=*/false));
  // onyx.Silu (silu_fusion): dx = dy · s · (1 + x · (1 − s)), s = sigmoid(x), in one SiluGrad.
  r.add("onyx", "Silu", fused("SiluGrad", /*use_output=*/false));
}

// LeakyRelu, Elu, Selu, Softplus and Clip.
ONYX_REGISTER_GRADIENTS(activations) {
  // y = x > 0 ? x : alpha x: dx = x > 0 ? dy : alpha dy
  r.add("", "LeakyRelu", unary([](GradContext& c, const std::string& dy) {
          float alpha = c.node().attr_float("alpha", 0.01f);
          std::string pos = c.emit1("Greater", {c.I(0), scalar_like(c, 0.0, c.I(0))});
          return c.emit1("Where", {pos, dy, mul(c, dy, scalar_like(c, alpha, dy))});
        }));
  // y = x > 0 ? x : alpha (e^x - 1): dx = x > 0 ? dy : dy (y + alpha)
  r.add("", "Elu", unary([](GradContext& c, const std::string& dy) {
          float alpha = c.node().attr_float("alpha", 1.0f);
          std::string pos = c.emit1("Greater", {c.I(0), scalar_like(c, 0.0, c.I(0))});
          std::string neg = mul(c, dy, c.emit1("Add", {c.O(0), scalar_like(c, alpha, dy)}));
          return c.emit1("Where", {pos, dy, neg});
        }));
  // y = gamma (x > 0 ? x : alpha (e^x - 1)): dx = x > 0 ? gamma dy : dy (y + gamma alpha)
  r.add("", "Selu", unary([](GradContext& c, const std::string& dy) {
          float alpha = c.node().attr_float("alpha", 1.67326319217681884765625f);
          float gamma = c.node().attr_float("gamma", 1.05070102214813232421875f);
          std::string pos = c.emit1("Greater", {c.I(0), scalar_like(c, 0.0, c.I(0))});
          std::string neg =
              mul(c, dy, c.emit1("Add", {c.O(0), scalar_like(c, (double)gamma * alpha, dy)}));
          return c.emit1("Where", {pos, mul(c, dy, scalar_like(c, gamma, dy)), neg});
        }));
  // y = log(1 + e^x): dx = dy * sigmoid(x)
  r.add("", "Softplus", unary([](GradContext& c, const std::string& dy) {
          return mul(c, dy, c.emit1("Sigmoid", {c.I(0)}));
        }));
  // Gelu: ONNX (opset 20) approximate = none | tanh; com.microsoft Gelu (erf), FastGelu(X, bias?)
  // (tanh), BiasGelu(A, B) (erf).
  // onyx.Gelu is gelu_fusion's form of the ONNX op in models importing an opset below 20.
  for (const char* domain : {"", "onyx"})
    r.add(domain, "Gelu",
          [](GradContext& c) { gelu_rule(c, c.node().attr_string("approximate", "none"), -1); });
  r.add("com.microsoft", "Gelu", [](GradContext& c) { gelu_rule(c, "none", -1); });
  r.add("com.microsoft", "FastGelu", [](GradContext& c) { gelu_rule(c, "tanh", 1); });
  r.add("com.microsoft", "BiasGelu", [](GradContext& c) { gelu_rule(c, "none", 1); });

  // Clip(x, min?, max?) (attributes before opset 11): dx = dy where min <= x <= max; a
  // differentiable bound gets the sum of dy where x is beyond it.
  r.add("", "Clip", [](GradContext& c) {
    const std::string x = c.I(0), dy = c.GO(0);
    std::string lo, hi;
    if (c.opset() < 11) {
      if (c.node().attrs.count("min")) lo = scalar_like(c, c.node().attr_float("min", 0), x);
      if (c.node().attrs.count("max")) hi = scalar_like(c, c.node().attr_float("max", 0), x);
    } else {
      lo = c.I(1);
      hi = c.I(2);
    }
    if (c.needs(0)) {
      std::string ge = lo.empty() ? "" : c.emit1("GreaterOrEqual", {x, lo});
      std::string le = hi.empty() ? "" : c.emit1("LessOrEqual", {x, hi});
      std::string inside = ge.empty() ? le : le.empty() ? ge : c.emit1("And", {ge, le});
      c.set(0, inside.empty() ? dy : where_zero(c, inside, dy));
    }
    if (c.opset() >= 11 && c.needs(1)) c.set(1, where_zero(c, c.emit1("Less", {x, lo}), dy));
    if (c.opset() >= 11 && c.needs(2)) c.set(2, where_zero(c, c.emit1("Greater", {x, hi}), dy));
  });
}

// Max, Min, Where and Cast: the gradient goes where the value came from.
ONYX_REGISTER_GRADIENTS(selection) {
  r.add("", "Max", min_max_rule);
  r.add("", "Min", min_max_rule);

  // Where(cond, x, y): dx = dy where cond, dy = dy elsewhere; the condition gets none.
  r.add("", "Where", [](GradContext& c) {
    if (c.needs(1)) c.set(1, where_zero(c, c.I(0), c.GO(0), true));
    if (c.needs(2)) c.set(2, where_zero(c, c.I(0), c.GO(0), false));
  });

  // Cast between float dtypes: the gradient is cast back (GradContext::set casts to the input's
  // dtype). Casts from or to non-float types carry no gradient.
  auto cast = [](GradContext& c) {
    if (is_float(dtype_of(c, c.I(0))) && is_float(dtype_of(c, c.O(0)))) c.set(0, c.GO(0));
  };
  r.add("", "Cast", cast);
  r.add("", "CastLike", cast);  // the target_type input gets no gradient
}

}  // namespace onyx::autodiff
