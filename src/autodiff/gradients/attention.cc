// attention.cc — gradient rule for the fused onyx.Attention op (passes/attention_fusion.cc forms
// it; kernels/attention/attention.cc runs it). Hand-written like every rule here: one fused
// backward kernel, onyx.AttentionGrad, receives dO, Q, K, V, the optional mask and the forward's
// saved row log-sum-exp (Attention's optional second output, requested with ensure_output) and
// returns dQ, dK, dV at once. The additive mask is a stop-gradient input: it gets no gradient (in
// the exported models it comes from attention_mask or a constant). Attention dropout
// (dropout_ratio) is not stored: AttentionGrad redraws the same mask from the run seed and the
// forward's rng_key.
#include "autodiff/gradient.h"

namespace onyx::autodiff {
namespace {

void attention_rule(GradContext& c) {
  std::string dO = c.GO(0);
  if (dO.empty() || !(c.needs(0) || c.needs(1) || c.needs(2))) return;
  // Copies: references into the node do not survive emitting.
  std::string q = c.I(0), k = c.I(1), v = c.I(2);
  std::string mask = c.num_inputs() > 3 ? c.I(3) : std::string();
  ONYX_CHECK(mask.empty() || !c.needs(3), c.node().describe(), ": the additive mask '", mask,
             "' depends on trainable weights, but onyx.Attention gives its mask no gradient");
  std::map<std::string, ir::Attribute> attrs = c.node().attrs;
  // With dropout the backward regenerates the forward's mask: it needs the forward's identity
  // (its rng_key, or its output name, as the kernel picks it) rather than its own output names.
  if (!attrs.count("rng_key") && c.node().attr_float("dropout_ratio", 0.0f) > 0)
    attrs["rng_key"] = attr_s(c.O(0));
  std::string lse = c.ensure_output(1);  // (B,H,Tq)
  auto g = c.emit("AttentionGrad", {dO, q, k, v, mask, lse}, attrs, "onyx", 3);
  for (int i = 0; i < 3; i++)
    if (c.needs(i)) c.set(i, g[i]);
}

}  // namespace

ONYX_REGISTER_GRADIENTS(attention) { r.add("onyx", "Attention", attention_rule); }

}  // namespace onyx::autodiff
