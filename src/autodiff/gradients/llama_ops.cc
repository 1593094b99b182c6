// llama_ops.cc — gradient rules for onyx.SwiGLU (passes/swiglu_fusion.cc) and onyx.Rotary
// (passes/rotary_fusion.cc); kernels/llama/llama_ops.cc runs both and their backward kernels.
//   SwiGLU:  y = silu(g) * u          dg, du = onyx.SwiGLUGrad(dy, g, u)   (one pass, both)
//   Rotary:  y = x cos + rot(x) sin   dx = onyx.RotaryGrad(dy, cos, sin): the transposed rotation
// The rotary tables come from position ids and constants, so they need no gradient in the
// models onyx fuses; when they do (a learned table), RotaryGrad also writes dcos = dy * x and
// dsin = dy * rot(x) at x's shape, which `set` sums over the broadcast axes.
#include "autodiff/gradient.h"

namespace onyx::autodiff {
namespace {

void swiglu_rule(GradContext& c) {
  std::string dy = c.GO(0);
  if (dy.empty() || (!c.needs(0) && !c.needs(1))) return;
  std::string g = c.I(0), u = c.I(1);
  auto d = c.emit("SwiGLUGrad", {dy, g, u}, {}, "onyx", 2);
  c.set(0, d[0]);
  c.set(1, d[1]);
}

void rotary_rule(GradContext& c) {
  std::string dy = c.GO(0);
  if (dy.empty()) return;
  std::string x = c.I(0), cos = c.I(1), sin = c.I(2);
  if (c.needs(1) || c.needs(2)) {
    auto d = c.emit("RotaryGrad", {dy, cos, sin, x}, {}, "onyx", 3);
    c.set(0, d[0]);
    c.set(1, d[1]);
    c.set(2, d[2]);
  } else if (c.needs(0)) {
    c.set(0, c.emit1("RotaryGrad", {dy, cos, sin}, {}, "onyx"));
  }
}

}  // namespace

ONYX_REGISTER_GRADIENTS(llama) {
  r.add("onyx", "SwiGLU", swiglu_rule);
  r.add("onyx", "Rotary", rotary_rule);
}

}  // namespace onyx::autodiff
