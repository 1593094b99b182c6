// bf16_weight_fusion.cc — frozen weights stored in bfloat16 (models/lora.h
// store_frozen_weights_bf16 keeps each as a bf16 initializer read through Cast(W, to=FLOAT)): an
// onyx.MatMulT reading that Cast as its B, or an onyx.LinearCrossEntropy as its W, reads the bf16
// initializer itself instead (their kernels' mixed-precision path: bf16 inputs, float32
// accumulation and output), so no float32 copy of the weight is made or kept for the backward.
// The Cast dies when nothing else reads it. Runs after linear_fusion and cross_entropy_fusion,
// which form those ops. Hand-written: a rewrite of our own IR's weight reads.
#include "passes/match.h"

namespace onyx::passes {

int fuse_bf16_weights(ir::Graph& g, PassContext& ctx) {
  GraphIndex idx(g);
  int fused = 0;
  for (ir::Node& n : g.nodes) {
    if (!is_op(n, "onyx", "MatMulT") && !is_op(n, "onyx", "LinearCrossEntropy")) continue;
    if (n.inputs.size() < 2 || !is_f32(ctx, n.inputs[0])) continue;
    const ir::Node* c = idx.producer_node(g, n.inputs[1]);
    if (!c || !is_op(*c, "Cast") || c->inputs.empty() ||
        c->attr_int("to", 0) != (int64_t)DType::Float32)
      continue;
    auto w = g.initializers.find(c->inputs[0]);
    if (w == g.initializers.end() || w->second.dtype() != DType::BFloat16) continue;
    n.inputs[1] = c->inputs[0];
    fused++;
  }
  if (fused) import_domain(g, "onyx");
  return fused;
}

ONYX_REGISTER_FUSION(fuse_bf16_weights, "bf16_weight_fusion", 650);

}  // namespace onyx::passes
