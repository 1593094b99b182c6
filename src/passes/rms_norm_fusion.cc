// rms_norm_fusion.cc — fuses RMSNorm (Transformers' LlamaRMSNorm, also Mistral's and Qwen2's) into
// one onyx.RMSNorm (kernels/norm/layer_norm.cc, with onyx.RMSNormGrad; rule in
// autodiff/gradients/nn.cc). Hand-written: the pattern is what onyx's own Llama builder
// (models/llama.cc) and both torch.onnx exporters write for `x * torch.rsqrt(x.pow(2).mean(-1,
// keepdim=True) + eps) * weight`, and no library does this rewrite on our IR. ONNX's
// RMSNormalization is opset 23, newer than any model onyx trains imports (DESIGN decision 11), and
// has no output for the inverse RMS the backward reads; so the fused op is onyx's own.
//
// Matched, from each ReduceMean (every intermediate value used only inside the pattern):
//   q = Mul(x, x) | Pow(x, 2)
//   v = ReduceMean(q, axes=[last])           keepdims = 1; axes as attribute (< 18) or input (18)
//   s = Sqrt(Add(v, eps) | Add(eps, v))      eps a one-element constant >= 0
//   n = Mul(x, Reciprocal(s)) | Mul(x, Div(1, s)) (either operand order) | Div(x, s)
//   y = Mul(n, w) | Mul(w, n)                w (C); optional (absent: a ones scale)
// → y = onyx.RMSNorm(x, w) {epsilon = eps}. C is x's last dim, the only one normalized.
#include "passes/match.h"

namespace onyx::passes {
namespace {

struct RmsNormMatcher : FusionMatcher {
  using FusionMatcher::FusionMatcher;

  // The one node reading v inside the pattern (v has no other reader), if unclaimed.
  int next(const std::string& v) const {
    int i = idx.sole_consumer(v);
    return free(i) ? i : -1;
  }

  bool try_fuse(int vi) {
    const ir::Node& mean = g.nodes[vi];
    if (!reduces_last_axis(g, ctx, mean)) return false;
    const std::string q = mean.inputs[0];
    const ir::Node* sq = idx.producer_node(g, q);
    if (!sq || sq->inputs.size() != 2 || !idx.single_use(q)) return false;
    const std::string x = sq->inputs[0];
    if (is_op(*sq, "Mul")) {
      if (sq->inputs[1] != x) return false;
    } else if (!is_op(*sq, "Pow") || !is_scalar_near(ctx, g, sq->inputs[1], 2.0, 1e-6)) {
      return false;
    }
    int qi = idx.producer(q);
    if (!free(qi) || !ctx.has_meta(x)) return false;
    const TensorMeta& xm = ctx.meta(x);
    if (!is_float(xm.dtype) || xm.shape.empty() || xm.shape.back() <= 0) return false;
    std::vector<int> nodes{qi, vi};

    // s = Sqrt(v + eps)
    int ai = next(mean.outputs[0]);
    if (ai < 0 || !is_op(g.nodes[ai], "Add")) return false;
    auto eps = ctx.scalar(g, other_input(g.nodes[ai], mean.outputs[0]));
    if (!eps || *eps < 0) return false;
    nodes.push_back(ai);
    int si = next(g.nodes[ai].outputs[0]);
    if (si < 0 || !is_op(g.nodes[si], "Sqrt")) return false;
    nodes.push_back(si);
    const std::string s = g.nodes[si].outputs[0];

    // n = x / s, or x * (1 / s)
    int ni = next(s);
    if (ni < 0) return false;
    const ir::Node& after = g.nodes[ni];
    if (is_op(after, "Div") && after.inputs.size() == 2 && after.inputs[0] == x &&
        after.inputs[1] == s) {
      nodes.push_back(ni);
    } else {
      bool recip = is_op(after, "Reciprocal") && after.inputs.size() == 1;
      bool one_over = is_op(after, "Div") && after.inputs.size() == 2 && after.inputs[1] == s &&
                      is_scalar_near(ctx, g, after.inputs[0], 1.0, 1e-7);
      if (!recip && !one_over) return false;
      nodes.push_back(ni);
      const std::string r = after.outputs[0];
      ni = next(r);
      if (ni < 0 || !is_op(g.nodes[ni], "Mul") || other_input(g.nodes[ni], r) != x) return false;
      nodes.push_back(ni);
    }
    int last = ni;
    std::string y = g.nodes[ni].outputs[0];

    // y = n * w
    std::string w;
    int wi = next(y);
    if (wi >= 0 && is_op(g.nodes[wi], "Mul")) {
      std::string o = other_input(g.nodes[wi], y);
      if (!o.empty() && o != y && ctx.has_meta(o)) {
        const TensorMeta& wm = ctx.meta(o);
        if (wm.dtype == xm.dtype && wm.shape.size() == 1 && wm.shape[0] == xm.shape.back()) {
          w = o;
          nodes.push_back(wi);
          last = wi;
        }
      }
    }
    if (w.empty()) {
      int64_t C = xm.shape.back();
      Tensor ones;
      if (xm.dtype == DType::Float32)
        ones = Tensor::from_vector<float>(DType::Float32, {C}, std::vector<float>(C, 1.f));
      else if (xm.dtype == DType::Float64)
        ones = Tensor::from_vector<double>(DType::Float64, {C}, std::vector<double>(C, 1.0));
      else
        return false;
      w = ctx.fresh(g, mean.outputs[0] + "_ones");
      g.add_initializer(w, ones);
    }
    std::string base = mean.name;
    auto slash = base.rfind('/');
    ir::Node rn =
        make_node("RMSNorm", "onyx", {x, w}, {g.nodes[last].outputs[0]},
                  {{"epsilon", ir::Attribute::of_float((float)*eps)}},
                  ctx.fresh(g, slash == std::string::npos ? base + "_RMSNorm"
                                                          : base.substr(0, slash + 1) + "RMSNorm"));
    for (int n : nodes) claimed[n] = true;
    // The last node becomes the fused one (same output name); the others are left for dead-node
    // elimination.
    g.nodes[last] = std::move(rn);
    return true;
  }
};

}  // namespace

int fuse_rms_norm(ir::Graph& g, PassContext& ctx) {
  RmsNormMatcher m(g, ctx);
  int fused = 0;
  for (int i = 0; i < (int)g.nodes.size(); i++)
    if (!m.claimed[i] && is_op(g.nodes[i], "ReduceMean") && m.try_fuse(i)) fused++;
  if (fused) {
    import_domain(g, "onyx");
    sort_topologically(g);
  }
  return fused;
}

// After layer_norm_fusion (whose pattern subtracts the mean first) and before linear_fusion.
ONYX_REGISTER_FUSION(fuse_rms_norm, "rms_norm_fusion", 110);

}  // namespace onyx::passes
