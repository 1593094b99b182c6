// quant4_weight_fusion.cc — frozen weights stored 4-bit (quant/store_4bit.h keeps each as its
// bitsandbytes state read through onyx.Dequantize4Bit): an onyx.MatMulT reading that dequantized
// weight as its B (transA = 0, alpha = 1, any transB, optional bias; a Conv1D weight's transposed
// Dequantize4Bit flips transB) becomes onyx.MatMul4Bit on
// the 4-bit tensors themselves (kernels/quant/matmul_4bit.cc: dequantized a tile at a time inside
// the GEMM), so no float32 copy of the weight is made or kept for the backward — whose dX is a
// MatMul4Bit too. The Dequantize4Bit dies when nothing else reads it. Runs after linear_fusion,
// which forms the MatMulTs. Hand-written: a rewrite of our own IR's weight reads.
#include "passes/match.h"

namespace onyx::passes {

int fuse_quant4_weights(ir::Graph& g, PassContext& ctx) {
  GraphIndex idx(g);
  int fused = 0;
  for (ir::Node& n : g.nodes) {
    if (!is_op(n, "onyx", "MatMulT") || n.inputs.size() < 2 || !is_f32(ctx, n.inputs[0])) continue;
    if (n.attr_int("transA", 0) != 0 || n.attr_float("alpha", 1.0f) != 1.0f) continue;
    const ir::Node* d = idx.producer_node(g, n.inputs[1]);
    if (!d || !is_op(*d, "onyx", "Dequantize4Bit")) continue;
    std::vector<std::string> in = {n.inputs[0]};
    for (size_t i = 0; i < 4; i++) in.push_back(i < d->inputs.size() ? d->inputs[i] : "");
    if (n.inputs.size() > 2 && !n.inputs[2].empty()) in.push_back(n.inputs[2]);
    // A Conv1D weight's Dequantize4Bit gives the quantized matrix transposed: X · op(Qᵀ).
    std::map<std::string, ir::Attribute> attrs = d->attrs;
    const int64_t transposed = attrs.count("transpose") ? d->attr_int("transpose", 0) : 0;
    attrs.erase("transpose");
    attrs["transB"] = ir::Attribute::of_int(n.attr_int("transB", 0) ^ (transposed != 0));
    n.op_type = "MatMul4Bit";
    n.inputs = std::move(in);
    n.attrs = std::move(attrs);
    fused++;
  }
  if (fused) import_domain(g, "onyx");
  return fused;
}

ONYX_REGISTER_FUSION(fuse_quant4_weights, "quant4_weight_fusion", 651);

}  // namespace onyx::passes
