// swiglu_fusion.cc — fuses Llama's SwiGLU MLP activation, silu(gate) * up, into one onyx.SwiGLU
// (kernels/llama/llama_ops.cc, with onyx.SwiGLUGrad; rule in autodiff/gradients/llama_ops.cc).
// Hand-written: it is what onyx's Llama builder (models/llama.cc) and both torch.onnx exporters
// write for `act_fn(gate_proj(x)) * up_proj(x)`, after silu_fusion has made the SiLU one node; no
// library rewrites our IR.
//
// Matched, at every Mul (either operand order):
//   a = onyx.Silu(g)      a read only by this Mul
//   y = Mul(a, u) | Mul(u, a)      g and u of one float dtype and one shape (no broadcast)
// → y = onyx.SwiGLU(g, u). One pass over the two (tokens × intermediate) operands instead of two,
// the SiLU output is not kept for backward, and one backward node writes dg and du.
#include "passes/match.h"

namespace onyx::passes {

int fuse_swiglu(ir::Graph& g, PassContext& ctx) {
  GraphIndex idx(g);
  int fused = 0;
  for (ir::Node& mul : g.nodes) {
    if (!is_op(mul, "Mul") || mul.inputs.size() != 2 || mul.outputs.size() != 1) continue;
    for (int side = 0; side < 2; side++) {
      const std::string a = mul.inputs[side], u = mul.inputs[1 - side];
      const ir::Node* silu = idx.producer_node(g, a);
      if (!silu || !is_op(*silu, "onyx", "Silu") || silu->inputs.size() != 1 || a == u) continue;
      const std::string gate = silu->inputs[0];
      if (!idx.single_use(a) || !ctx.has_meta(gate) || !ctx.has_meta(u)) continue;
      const TensorMeta &gm = ctx.meta(gate), &um = ctx.meta(u);
      if (!is_float(gm.dtype) || gm.dtype != um.dtype || gm.shape != um.shape) continue;
      // In the Mul's place (after both operands' producers); the Silu is left for dead-node
      // elimination.
      mul = make_node(
          "SwiGLU", "onyx", {gate, u}, {mul.outputs[0]}, {},
          ctx.fresh(g, mul.name.empty() ? mul.outputs[0] + "/swiglu" : mul.name + "/swiglu"));
      fused++;
      break;
    }
  }
  if (fused) import_domain(g, "onyx");
  return fused;
}

// Right after silu_fusion (which forms the onyx.Silu matched here), before linear_fusion.
ONYX_REGISTER_FUSION(fuse_swiglu, "swiglu_fusion", 260);

}  // namespace onyx::passes
