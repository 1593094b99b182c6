// layer_norm_fusion.cc — fuses PyTorch's opset-14 decomposition of LayerNorm into one
// LayerNormalization node (onyx domain below opset 17, the standard op from 17;
// kernels/norm/layer_norm.cc; backward: the LayerNormGrad rule of autodiff/gradients/nn.cc).
// Hand-written: the pattern is what torch.onnx emits for nn.LayerNorm below opset 17 (BERT / GPT-2
// / ViT exports), and no library does this rewrite on our IR.
//
// Matched, from each ReduceMean (every intermediate value used only inside the pattern):
//   m = ReduceMean(x, axes=[last])          keepdims = 1; axes as attribute (< 18) or input (18)
//   d = Sub(x, m)
//   q = Pow(d, 2) | Mul(d, d)
//   v = ReduceMean(q, axes=[last])
//   s = Sqrt(Add(v, eps) | Add(eps, v))      eps a one-element constant
//   y = Div(d, s)
//   y = Mul(y, gamma) | Mul(gamma, y)        gamma (C); absent → a ones constant
//   y = Add(y, beta)  | Add(beta, y)         beta (C); optional
// → y = LayerNormalization(x, gamma[, beta]) {axis = -1, epsilon = eps}
// The last dim is the only one normalized (LayerNormalization's axis = -1); C is its size. The
// kernel and gradient rule do not depend on the graph's opset (LayerNormalization is opset 17 in
// ONNX; our training graphs never leave the runtime, and export uses the unfused graph).
#include "passes/match.h"

namespace onyx::passes {
namespace {

struct LayerNormMatcher : FusionMatcher {
  using FusionMatcher::FusionMatcher;

  bool reduces_last_axis(const ir::Node& n) const { return passes::reduces_last_axis(g, ctx, n); }

  // A (C) vector of x's dtype: LayerNormalization's scale or bias.
  bool is_channel_vector(const std::string& v, const TensorMeta& x) const {
    if (!ctx.has_meta(v)) return false;
    const TensorMeta& m = ctx.meta(v);
    return m.dtype == x.dtype && m.shape.size() == 1 && m.shape[0] == x.shape.back();
  }

  // Tries the pattern rooted at ReduceMean node `mi`; rewrites and returns true on a match.
  bool try_fuse(int mi) {
    const ir::Node& mean = g.nodes[mi];
    if (!reduces_last_axis(mean)) return false;
    const std::string x = mean.inputs[0];
    const TensorMeta& xm = ctx.meta(x);
    if (!is_float(xm.dtype) || xm.shape.empty() || xm.shape.back() <= 0) return false;
    std::vector<int> nodes{mi};

    // d = Sub(x, m)
    int si = idx.sole_consumer(mean.outputs[0]);
    if (!free(si) || !is_op(g.nodes[si], "Sub") || g.nodes[si].inputs.size() != 2 ||
        g.nodes[si].inputs[0] != x || g.nodes[si].inputs[1] != mean.outputs[0])
      return false;
    nodes.push_back(si);
    const std::string d = g.nodes[si].outputs[0];

    // d feeds exactly the square and the Div.
    if (idx.is_graph_output(d)) return false;
    int qi = -1, di = -1;
    for (int c : idx.consumers(d)) {
      const ir::Node& n = g.nodes[c];
      if (is_op(n, "Div") && n.inputs.size() == 2 && n.inputs[0] == d && n.inputs[1] != d) {
        if (di >= 0 && di != c) return false;
        di = c;
      } else if (is_op(n, "Pow") && n.inputs.size() == 2 && n.inputs[0] == d &&
                 is_scalar_near(ctx, g, n.inputs[1], 2.0, 1e-6)) {
        if (qi >= 0 && qi != c) return false;
        qi = c;
      } else if (is_op(n, "Mul") && n.inputs.size() == 2 && n.inputs[0] == d && n.inputs[1] == d) {
        if (qi >= 0 && qi != c) return false;
        qi = c;
      } else {
        return false;
      }
    }
    if (!free(qi) || !free(di)) return false;
    nodes.push_back(qi);
    nodes.push_back(di);

    // v = ReduceMean(q), then Add eps, then Sqrt, which is the Div's denominator.
    int vi = idx.sole_consumer(g.nodes[qi].outputs[0]);
    if (!free(vi) || !reduces_last_axis(g.nodes[vi])) return false;
    nodes.push_back(vi);
    int ai = idx.sole_consumer(g.nodes[vi].outputs[0]);
    if (!free(ai) || !is_op(g.nodes[ai], "Add")) return false;
    std::string eps_name = other_input(g.nodes[ai], g.nodes[vi].outputs[0]);
    auto eps = ctx.scalar(g, eps_name);
    if (!eps || *eps < 0) return false;
    nodes.push_back(ai);
    int ri = idx.sole_consumer(g.nodes[ai].outputs[0]);
    if (!free(ri) || !is_op(g.nodes[ri], "Sqrt")) return false;
    nodes.push_back(ri);
    if (idx.sole_consumer(g.nodes[ri].outputs[0]) != di ||
        g.nodes[di].inputs[1] != g.nodes[ri].outputs[0])
      return false;

    // y = Div(d, s) [* gamma] [+ beta]
    std::string y = g.nodes[di].outputs[0];
    int last = di;
    std::string gamma, beta;
    int gi = idx.sole_consumer(y);
    if (free(gi) && is_op(g.nodes[gi], "Mul")) {
      std::string o = other_input(g.nodes[gi], y);
      if (!o.empty() && o != y && is_channel_vector(o, xm)) {
        gamma = o;
        nodes.push_back(gi);
        last = gi;
        y = g.nodes[gi].outputs[0];
      }
    }
    int bi = idx.sole_consumer(y);
    if (free(bi) && is_op(g.nodes[bi], "Add")) {
      std::string o = other_input(g.nodes[bi], y);
      if (!o.empty() && o != y && is_channel_vector(o, xm)) {
        beta = o;
        nodes.push_back(bi);
        last = bi;
      }
    }
    // Every intermediate (all but the last node's output) stays inside the pattern: checked by
    // sole_consumer above, except d (checked by its consumer scan) and the last output itself.

    if (gamma.empty()) {  // LayerNormalization requires a scale: ones (float32 / float64)
      int64_t C = xm.shape.back();
      Tensor ones;
      if (xm.dtype == DType::Float32)
        ones = Tensor::from_vector<float>(DType::Float32, {C}, std::vector<float>(C, 1.f));
      else if (xm.dtype == DType::Float64)
        ones = Tensor::from_vector<double>(DType::Float64, {C}, std::vector<double>(C, 1.0));
      else
        return false;
      gamma = ctx.fresh(g, mean.outputs[0] + "_ones");
      g.add_initializer(gamma, ones);
    }
    std::string base = mean.name;
    auto slash = base.rfind('/');
    std::vector<std::string> inputs{x, gamma};
    if (!beta.empty()) inputs.push_back(beta);
    // The standard op exists from opset 17; below it the same op in the onyx domain (never a
    // default-domain op of a newer opset than the model imports).
    const bool standard = g.opset("") >= 17;
    if (!standard) import_domain(g, "onyx");
    ir::Node ln = make_node(
        "LayerNormalization", standard ? "" : "onyx", std::move(inputs), {g.nodes[last].outputs[0]},
        {{"axis", ir::Attribute::of_int(-1)}, {"epsilon", ir::Attribute::of_float((float)*eps)}},
        slash == std::string::npos ? base + "_LayerNormalization"
                                   : base.substr(0, slash + 1) + "LayerNormalization");
    for (int n : nodes) claimed[n] = true;
    // The last node becomes the fused one (same output name); the others are left for dead-node
    // elimination (their outputs are now unread).
    g.nodes[last] = std::move(ln);
    return true;
  }
};

}  // namespace

int fuse_layer_norm(ir::Graph& g, PassContext& ctx) {
  LayerNormMatcher m(g, ctx);
  int fused = 0;
  for (int i = 0; i < (int)g.nodes.size(); i++)
    if (!m.claimed[i] && is_op(g.nodes[i], "ReduceMean") && m.try_fuse(i)) fused++;
  if (fused) sort_topologically(g);
  return fused;
}

ONYX_REGISTER_FUSION(fuse_layer_norm, "layer_norm_fusion", 100);

}  // namespace onyx::passes
