// silu_fusion.cc — fuses SiLU (Swish) into one onyx.Silu (kernel in
// kernels/elementwise/unary.cc with its onyx.SiluGrad; rule in
// autodiff/gradients/elementwise.cc). Hand-written: it is the form torch.onnx writes for nn.SiLU /
// F.silu (UNet blocks, Llama's SwiGLU gate) at every opset the exporters use — ONNX has no Silu —
// and no library rewrites our IR. The walk-through in docs/ADDING_AN_OP.md adds this op.
//
// Matched, at every Mul (either operand order):
//   s = Sigmoid(x)       s read only by this Mul
//   y = Mul(x, s) | Mul(s, x)
// → y = onyx.Silu(x). y has x's meta by construction (same operand twice, no broadcast). One pass
// over x instead of two forward, and one fused backward (dy · s · (1 + x · (1 − s))) instead of the
// Mul and Sigmoid rules' four elementwise nodes.
#include "passes/match.h"

namespace onyx::passes {

int fuse_silu(ir::Graph& g, PassContext& ctx) {
  GraphIndex idx(g);
  int fused = 0;
  for (ir::Node& mul : g.nodes) {
    if (!is_op(mul, "Mul") || mul.inputs.size() != 2 || mul.outputs.size() != 1) continue;
    for (int side = 0; side < 2; side++) {
      const std::string& x = mul.inputs[1 - side];
      const ir::Node* sig = idx.producer_node(g, mul.inputs[side]);
      if (!sig || !is_op(*sig, "Sigmoid") || sig->inputs.size() != 1 || sig->inputs[0] != x)
        continue;
      if (!idx.single_use(mul.inputs[side]) || !ctx.has_meta(x) || !is_float(ctx.meta(x).dtype))
        continue;
      // In the Mul's place (after x's producer); the Sigmoid is left for dead-node elimination.
      mul =
          make_node("Silu", "onyx", {x}, {mul.outputs[0]}, {},
                    ctx.fresh(g, mul.name.empty() ? mul.outputs[0] + "/silu" : mul.name + "/silu"));
      fused++;
      break;
    }
  }
  if (fused) import_domain(g, "onyx");
  return fused;
}

// After gelu_fusion (whose patterns hold no Sigmoid) and before linear_fusion.
ONYX_REGISTER_FUSION(fuse_silu, "silu_fusion", 250);

}  // namespace onyx::passes
