// loss.cc — gradient rule for onyx.LinearCrossEntropy (the fused LM-head / classifier + softmax
// cross-entropy made by passes/cross_entropy_fusion.cc; kernel in
// kernels/loss/linear_cross_entropy.cc). Hand-written like every rule here: the kernel computes d
// loss / d (H, W, bias) for a unit incoming gradient during the forward, chunk by chunk, so no
// (tokens × vocab) tensor is ever kept for the backward. The rule only asks for those outputs
// (ensure_output) and scales them by the incoming scalar gradient — no node at all when that
// gradient is the constant 1 (the usual training seed).
#include "autodiff/gradient.h"

namespace onyx::autodiff {
namespace {

// Inputs H (N,C), W, labels (N), [bias]; outputs loss, [dH], [dW], [dbias].
void linear_cross_entropy_rule(GradContext& c) {
  std::string dloss = c.GO(0);
  if (dloss.empty()) return;
  bool has_bias = c.num_inputs() > 3 && !c.I(3).empty();
  const Tensor* k = c.constant(dloss);
  bool unit = k && k->numel() == 1 && k->get_as_double(0) == 1.0;
  auto scaled = [&](const std::string& g) { return unit ? g : c.emit1("Mul", {g, dloss}); };
  if (c.needs(0)) c.set(0, scaled(c.ensure_output(1)));
  if (c.needs(1)) c.set(1, scaled(c.ensure_output(2)));
  if (has_bias && c.needs(3)) c.set(3, scaled(c.ensure_output(3)));
}

}  // namespace

ONYX_REGISTER_GRADIENTS(loss) { r.add("onyx", "LinearCrossEntropy", linear_cross_entropy_rule); }

}  // namespace onyx::autodiff
