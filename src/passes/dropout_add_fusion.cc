// dropout_add_fusion.cc — fuses a dropout feeding a residual add into one onyx.DropoutAdd
// (kernels/dropout/dropout_add.cc; gradient rule autodiff/gradients/dropout_add.cc). Hand-written:
// it is the hidden-dropout pattern of PyTorch's opset-14 training-mode exports, on our IR.
//
// Matched, at every Add (either operand order):
//   d   = Dropout(y, ratio, training_mode)     opset >= 12; its mask output unused; d read once
//   out = Add(d, residual) | Add(residual, d)  y, residual, out float32 of one shape (no broadcast)
// → out = onyx.DropoutAdd(y, residual, ratio, training_mode) {seed, rng_key}
// with the Dropout's own seed attribute and identity (its rng_key attribute, else its output
// name): the fused kernel draws the very mask the Dropout would have drawn for a run seed (DESIGN
// decision 10), so fused and unfused training are bit-identical. ratio and training_mode are
// passed through as they are (constants or run-time inputs; the kernel decides, as Dropout does).
//
// In BERT and ViT it is `LayerNorm(Dropout(dense(h)) + input)` twice per layer, in GPT-2
// `x + Dropout(c_proj(a))`: y is usually linear_fusion's onyx.MatMulT(x, W, bias), so a layer's
// output projection, dropout and residual become two kernels with one pass over the activation
// between them, forward and backward (the backward needs only dout and the bool mask).
#include "passes/match.h"

namespace onyx::passes {

int fuse_dropout_add(ir::Graph& g, PassContext& ctx) {
  if (g.opset("") < 12) return 0;  // older Dropouts are the identity, already removed
  GraphIndex idx(g);
  int fused = 0;
  auto f32_shape = [&](const std::string& v, const Shape& s) {
    return is_f32(ctx, v) && ctx.meta(v).shape == s;
  };
  for (size_t ai = 0; ai < g.nodes.size(); ai++) {
    const ir::Node& add = g.nodes[ai];
    if (!is_op(add, "Add") || add.inputs.size() != 2 || add.outputs.size() != 1) continue;
    const std::string& out = add.outputs[0];
    if (!ctx.has_meta(out)) continue;
    const Shape shape = ctx.meta(out).shape;
    for (int side = 0; side < 2; side++) {
      const std::string& d = add.inputs[side];
      const std::string& residual = add.inputs[1 - side];
      int di = idx.producer(d);
      if (di < 0 || !is_op(g.nodes[di], "Dropout") || !idx.single_use(d) || d == residual) continue;
      const ir::Node& dn = g.nodes[di];
      if (dn.inputs.empty() || dn.outputs[0] != d) continue;
      if (!idx.outputs_unused(dn)) continue;  // the mask is read
      const std::string& y = dn.inputs[0];
      if (!f32_shape(y, shape) || !f32_shape(d, shape) || !f32_shape(residual, shape)) continue;

      ir::Node fn =
          make_node("DropoutAdd", "onyx", {y, residual}, {out},
                    {{"seed", ir::Attribute::of_int(dn.attr_int("seed", 0))},
                     {"rng_key", ir::Attribute::of_string(dropout_rng_key(dn))}},
                    ctx.fresh(g, dn.name.empty() ? d + "/dropout_add" : dn.name + "/dropout_add"));
      for (size_t i = 1; i < dn.inputs.size() && i < 3; i++) fn.inputs.push_back(dn.inputs[i]);
      while (fn.inputs.size() > 2 && fn.inputs.back().empty()) fn.inputs.pop_back();
      // In the Add's place (after y's and residual's producers); the Dropout is left for
      // dead-node elimination.
      g.nodes[ai] = fn;
      fused++;
      break;
    }
  }
  if (fused) import_domain(g, "onyx");
  return fused;
}

ONYX_REGISTER_FUSION(fuse_dropout_add, "dropout_add_fusion", 500);

}  // namespace onyx::passes
