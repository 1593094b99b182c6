// linear_fusion.cc — fuses PyTorch's exported nn.Linear into one onyx.MatMulT node (kernel in
// kernels/matmul/matmul.cc, gradient rule in autodiff/gradients/matmul.cc). Hand-written: the
// pattern is what torch.onnx emits for Linear on 3-D inputs (BERT / GPT-2 / ViT), and no library
// does this rewrite on our IR.
//
// Matched, from each MatMul (X of rank >= 2, float):
//   Y = MatMul(X, Transpose(W, perm=[1,0]))   W 2-D  → MatMulT(X, W) {transB = 1}: the GEMM reads
//                                                       W transposed, no transposed copy is made
//   Y = MatMul(X, W) then Add(Y, b) / Add(b, Y)  W 2-D → MatMulT(X, W, b) {transB = 0}
//   ... then Add(Y, b) / Add(b, Y), b (N) 1-D of Y's last dim, Y read only by that Add
//                                                     → MatMulT(X, W, b): the kernel writes the
//                                                       bias rows into Y and the GEMM adds onto
//                                                       them
// A plain MatMul(X, W) without a bias is left alone (nothing to gain). The Transpose stays when
// something else reads it (dead-node elimination removes it otherwise).
#include "passes/match.h"

namespace onyx::passes {

int fuse_linear(ir::Graph& g, PassContext& ctx) {
  GraphIndex idx(g);
  int fused = 0;
  std::vector<bool> dead(g.nodes.size(), false);
  const size_t n_nodes = g.nodes.size();
  for (size_t i = 0; i < n_nodes; i++) {
    const ir::Node& mm = g.nodes[i];
    if (dead[i] || !is_op(mm, "MatMul") || mm.inputs.size() != 2 || mm.outputs.empty()) continue;
    const std::string X = mm.inputs[0], B = mm.inputs[1], Y = mm.outputs[0];
    if (!ctx.has_meta(X) || !ctx.has_meta(B) || !ctx.has_meta(Y)) continue;
    const TensorMeta &xm = ctx.meta(X), &bm = ctx.meta(B), &ym = ctx.meta(Y);
    if (xm.shape.size() < 2 || bm.shape.size() != 2 || !is_float(xm.dtype) || bm.dtype != xm.dtype)
      continue;

    // B = Transpose(W, [1,0]) → read W with transB.
    std::string W = B;
    bool transB = false;
    if (const ir::Node* t = idx.producer_node(g, B); t && is_transpose(*t, {1, 0})) {
      W = t->inputs[0];
      transB = true;
    }

    // Y + b with b (N), Y read only by that Add.
    std::string bias;
    int ai = -1;
    if (int c = idx.sole_consumer(Y); c >= 0) {
      const ir::Node& add = g.nodes[c];
      if (!dead[c] && is_op(add, "Add") && add.inputs.size() == 2) {
        const std::string o = other_input(add, Y);
        if (o != Y && ctx.has_meta(o) && ctx.meta(o).dtype == xm.dtype &&
            ctx.meta(o).shape.size() == 1 && ctx.meta(o).shape[0] == ym.shape.back()) {
          bias = o;
          ai = c;
        }
      }
    }
    if (!transB && bias.empty()) continue;

    ir::Node f = make_node("MatMulT", "onyx", {X, W}, {});
    if (!bias.empty()) f.inputs.push_back(bias);
    if (transB) f.attrs["transB"] = ir::Attribute::of_int(1);
    if (ai >= 0) {
      // The Add becomes the fused node (its output keeps its name); the MatMul dies.
      f.name = g.nodes[ai].name + "_MatMulT";
      f.outputs = g.nodes[ai].outputs;
      g.nodes[ai] = std::move(f);
      dead[i] = true;
    } else {
      f.name = mm.name + "_MatMulT";
      f.outputs = {Y};
      g.nodes[i] = std::move(f);
    }
    fused++;
  }
  if (fused) {
    remove_nodes(g, dead);
    import_domain(g, "onyx");
    sort_topologically(g);
  }
  return fused;
}

ONYX_REGISTER_FUSION(fuse_linear, "linear_fusion", 300);

}  // namespace onyx::passes
