// dropout_add_fusion.cc — fuses a dropout feeding a residual add into one onyx.DropoutAdd
// (kernels/cpu/dropout_add.cc; gradient rule autodiff/gradients/dropout_add.cc). Hand-written: it
// is the hidden-dropout pattern of PyTorch's opset-14 training-mode exports, on our IR.
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
#include "passes/pass.h"

namespace onyx::passes {
namespace {

bool is_op(const ir::Node& n, const char* op) { return n.domain.empty() && n.op_type == op; }

}  // namespace

int fuse_dropout_add(ir::Graph& g, PassContext& ctx) {
  if (g.opset("") < 12) return 0;  // older Dropouts are the identity, already removed
  GraphIndex idx(g);
  int fused = 0;
  auto f32_shape = [&](const std::string& v, const Shape& s) {
    return !v.empty() && ctx.has_meta(v) && ctx.meta(v).dtype == DType::Float32 &&
           ctx.meta(v).shape == s;
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
      if (di < 0 || !is_op(g.nodes[di], "Dropout") || idx.uses(d) != 1 || d == residual) continue;
      const ir::Node& dn = g.nodes[di];
      if (dn.inputs.empty() || dn.outputs[0] != d) continue;
      bool mask_unused = true;
      for (size_t o = 1; o < dn.outputs.size(); o++)
        mask_unused &= dn.outputs[o].empty() || idx.uses(dn.outputs[o]) == 0;
      if (!mask_unused) continue;
      const std::string& y = dn.inputs[0];
      if (!f32_shape(y, shape) || !f32_shape(d, shape) || !f32_shape(residual, shape)) continue;

      ir::Node fn;
      fn.name = ctx.fresh(g, dn.name.empty() ? d + "/dropout_add" : dn.name + "/dropout_add");
      fn.op_type = "DropoutAdd";
      fn.domain = "onyx";
      fn.inputs = {y, residual};
      for (size_t i = 1; i < dn.inputs.size() && i < 3; i++) fn.inputs.push_back(dn.inputs[i]);
      while (fn.inputs.size() > 2 && fn.inputs.back().empty()) fn.inputs.pop_back();
      fn.outputs = {out};
      fn.attrs["seed"].kind = ir::Attribute::Kind::Int;
      fn.attrs["seed"].i = dn.attr_int("seed", 0);
      fn.attrs["rng_key"].kind = ir::Attribute::Kind::String;
      fn.attrs["rng_key"].s = dn.has_attr("rng_key") ? dn.attr_string("rng_key", "") : d;
      // In the Add's place (after y's and residual's producers); the Dropout is left for
      // dead-node elimination.
      g.nodes[ai] = fn;
      fused++;
      break;
    }
  }
  return fused;
}

}  // namespace onyx::passes
