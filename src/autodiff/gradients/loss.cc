// loss.cc — gradient rule for onyx.LinearCrossEntropy (the fused LM-head / classifier + softmax
// cross-entropy made by passes/cross_entropy_fusion.cc; kernel in
// kernels/loss/linear_cross_entropy.cc). Hand-written like every rule here: the kernel computes d
// loss / d (H, W, bias) for a unit incoming gradient during the forward, chunk by chunk, so no
// (tokens × vocab) tensor is ever kept for the backward. The rule only asks for those outputs
// (ensure_output) and scales them by the incoming scalar gradient — no node at all when that
// gradient is the constant 1 (the usual training seed). And for onyx.LinearLogProbs (per-token
// log-probabilities for preference and RL losses, whose gradient per row is only known after the
// forward): onyx.LinearLogProbsGrad recomputes the logits chunk by chunk.
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

// Inputs H, W, labels, [bias]; outputs logps, [entropy], [mean_logits], [is_top1]: only logps
// is differentiable. dW (and dbias) are asked of the kernel only when needed (a frozen LM head
// costs no dW GEMM).
void linear_log_probs_rule(GradContext& c) {
  std::string dlogps = c.GO(0);
  const bool has_bias = c.num_inputs() > 3 && !c.I(3).empty();
  const bool weights = c.needs(1) || (has_bias && c.needs(3));
  if (dlogps.empty() || !(c.needs(0) || weights)) return;
  std::vector<std::string> in = {c.I(0), c.I(1), c.I(2), has_bias ? c.I(3) : "", dlogps};
  auto g =
      c.emit("LinearLogProbsGrad", in, c.node().attrs, "onyx", weights ? (has_bias ? 3 : 2) : 1);
  if (c.needs(0)) c.set(0, g[0]);
  if (c.needs(1)) c.set(1, g[1]);
  if (has_bias && c.needs(3)) c.set(3, g[2]);
}

}  // namespace

ONYX_REGISTER_GRADIENTS(loss) {
  r.add("onyx", "LinearCrossEntropy", linear_cross_entropy_rule);
  r.add("onyx", "LinearLogProbs", linear_log_probs_rule);
}

}  // namespace onyx::autodiff
