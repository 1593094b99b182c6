// cross_entropy_fusion.cc — fuses a linear layer that feeds SoftmaxCrossEntropyLoss into one
// onyx.LinearCrossEntropy (kernels/loss/linear_cross_entropy.cc), so the (tokens × vocab) logits,
// their log-softmax and their gradient are never materialized: the kernel works on chunks of rows
// and computes the loss's gradient in the same pass (gradient rule: autodiff/gradients/loss.cc).
// Hand-written (ORT-style: a chain of guards, then the rewrite) for the LM heads of exported
// language models, where those tensors are most of the peak memory (gpt2: 2048 × 50257 fp32).
//
// Matched, walking back from SoftmaxCrossEntropyLoss(x (N,V), labels (N)) with reduction mean or
// sum, no class weights and no log_prob output in use:
//   x      = [Reshape | Flatten]( [Slice]( [Add(·, bias (V))]( linear ) ) )   each at most once
//   linear = MatMul(h, Transpose(W (V,C)))        → W, transB=1
//          | MatMul(h, W (C,V))                   → W, transB=0
//          | onyx.MatMulT(h, W, [bias], transB=t) (transA=0, alpha=1, 2-D W) → W, transB=t
//          | Gemm(h (N,C), W, [bias], transB=t)   (transA=0, alpha=1, beta=1)
// Every intermediate must have one use and not be a graph output. The reshape must keep the last
// axis (its output is (N, V) for logits (..., V)), which makes it a merge of leading axes; a Slice
// must not touch the last axis. Then the Slice moves onto h (same starts/ends/axes/steps), h is
// reshaped to (N, C), and the loss node becomes LinearCrossEntropy(h', W, labels, [bias]) with the
// loss's ignore_index and reduction; its output keeps the loss's name. The labels keep their own
// Slice/Reshape. The old nodes become dead and are removed by the pipeline's dead-node elimination.
#include "passes/match.h"

namespace onyx::passes {
namespace {

// What the match found.
struct Match {
  std::string h;  // (..., C) input of the linear layer
  std::string w;  // (V,C) with transB, else (C,V)
  bool transB = true;
  std::string bias;  // "" or (V) / (1,V)
  int slice = -1;    // index of the Slice on the logits, or -1
};

// The Slice's axes (from input 3, the `axes` attribute before opset 10, or the default
// 0..len(starts)-1); nullopt when not known at pass time.
std::optional<std::vector<int64_t>> slice_axes(const ir::Graph& g, const ir::Node& s,
                                               const PassContext& ctx) {
  if (s.has_input(3)) {
    const Tensor* t = ctx.constant(g, s.inputs[3]);
    if (!t) return std::nullopt;
    return t->to_int64_vector();
  }
  if (s.has_attr("axes")) return s.attr_ints("axes");
  size_t n = 0;
  if (s.has_input(1)) {
    const Tensor* t = ctx.constant(g, s.inputs[1]);
    if (!t) return std::nullopt;
    n = (size_t)t->numel();
  } else {
    n = s.attr_ints("starts").size();
  }
  std::vector<int64_t> axes(n);
  for (size_t i = 0; i < n; i++) axes[i] = (int64_t)i;
  return axes;
}

// The linear layer producing `y` (logits (..., V)), or false.
bool match_linear(const ir::Graph& g, const GraphIndex& idx, const PassContext& ctx, int p,
                  int64_t V, Match& m) {
  const ir::Node& n = g.nodes[p];
  if (is_op(n, "MatMul") || is_op(n, "onyx", "MatMulT")) {
    if (!n.has_input(0) || !n.has_input(1)) return false;
    const std::string& b = n.inputs[1];
    if (!ctx.has_meta(b) || ctx.meta(b).rank() != 2 || !is_f32(ctx, n.inputs[0])) return false;
    m.h = n.inputs[0];
    if (is_op(n, "onyx", "MatMulT")) {
      if (n.attr_int("transA", 0) != 0 || n.attr_float("alpha", 1.0f) != 1.0f) return false;
      m.w = b;
      m.transB = n.attr_int("transB", 0) != 0;
      if (n.has_input(2)) m.bias = n.inputs[2];  // linear_fusion's MatMulT(X, W, b)
    } else {
      const ir::Node* t = idx.producer_node(g, b);
      bool tr = t && is_transpose(*t, {1, 0});
      m.w = tr ? t->inputs[0] : b;
      m.transB = tr;
    }
  } else if (is_op(n, "Gemm")) {
    if (n.attr_int("transA", 0) != 0 || n.attr_float("alpha", 1.0f) != 1.0f) return false;
    if (!is_f32(ctx, n.inputs[0]) || ctx.meta(n.inputs[0]).rank() != 2) return false;
    m.h = n.inputs[0];
    m.w = n.inputs[1];
    m.transB = n.attr_int("transB", 0) != 0;
    if (n.has_input(2)) {
      if (n.attr_float("beta", 1.0f) != 1.0f) return false;
      m.bias = n.inputs[2];
    }
  } else {
    return false;
  }
  if (!is_f32(ctx, m.w) || ctx.meta(m.w).rank() != 2) return false;
  const Shape& ws = ctx.meta(m.w).shape;
  int64_t C = ctx.meta(m.h).shape.back();
  if ((m.transB ? ws[0] : ws[1]) != V || (m.transB ? ws[1] : ws[0]) != C) return false;
  return true;
}

bool bias_ok(const PassContext& ctx, const std::string& b, int64_t V) {
  if (!is_f32(ctx, b)) return false;
  const Shape& s = ctx.meta(b).shape;
  return (s == Shape{V}) || (s == Shape{1, V});
}

}  // namespace

int fuse_cross_entropy(ir::Graph& g, PassContext& ctx) {
  int fused = 0;
  for (int li = 0; li < (int)g.nodes.size(); li++) {
    GraphIndex idx(g);  // rebuilt per candidate: a fusion inserts nodes
    const ir::Node& loss = g.nodes[li];
    if (!is_op(loss, "SoftmaxCrossEntropyLoss") || loss.inputs.size() < 2) continue;
    if (loss.has_input(2)) continue;          // class weights
    if (!idx.outputs_unused(loss)) continue;  // log_prob used
    std::string red = loss.attr_string("reduction", "mean");
    if (red != "mean" && red != "sum") continue;
    const std::string x = loss.inputs[0], labels = loss.inputs[1];
    if (!ctx.has_meta(x) || ctx.meta(x).rank() != 2 || !is_f32(ctx, x)) continue;
    const int64_t N = ctx.meta(x).shape[0], V = ctx.meta(x).shape[1];
    if (!ctx.has_meta(labels) || ctx.meta(labels).shape != Shape{N}) continue;

    // Walk back: [Reshape|Flatten] ← [Slice] ← [Add bias] ← linear. Every step single-use.
    auto single = [&](const std::string& v) { return idx.single_use(v); };
    Match m;
    std::string cur = x;
    int p = idx.producer(cur);
    if (p >= 0 && (is_op(g.nodes[p], "Reshape") || is_op(g.nodes[p], "Flatten"))) {
      if (!single(cur)) continue;
      cur = g.nodes[p].inputs[0];
      if (!ctx.has_meta(cur) || ctx.meta(cur).shape.empty() || ctx.meta(cur).shape.back() != V)
        continue;  // the reshape must only merge leading axes
      p = idx.producer(cur);
    }
    if (p >= 0 && is_op(g.nodes[p], "Slice")) {
      if (!single(cur) || !g.nodes[p].has_input(0)) continue;
      int64_t rank = ctx.meta(g.nodes[p].inputs[0]).rank();
      auto axes = slice_axes(g, g.nodes[p], ctx);
      if (!axes) continue;
      bool last = false;
      for (int64_t a : *axes) last |= a == rank - 1 || a == -1;
      if (last) continue;
      m.slice = p;
      cur = g.nodes[p].inputs[0];
      p = idx.producer(cur);
    }
    std::string add_bias;
    if (p >= 0 && is_op(g.nodes[p], "Add")) {
      if (!single(cur)) continue;
      const ir::Node& a = g.nodes[p];
      int q0 = idx.producer(a.inputs[0]), q1 = idx.producer(a.inputs[1]);
      bool lin0 =
          q0 >= 0 && bias_ok(ctx, a.inputs[1], V) && ctx.meta(a.inputs[0]).shape.back() == V;
      bool lin1 =
          q1 >= 0 && bias_ok(ctx, a.inputs[0], V) && ctx.meta(a.inputs[1]).shape.back() == V;
      if (!lin0 && !lin1) continue;
      add_bias = lin0 ? a.inputs[1] : a.inputs[0];
      cur = lin0 ? a.inputs[0] : a.inputs[1];
      if (ctx.meta(cur).shape != ctx.meta(a.outputs[0]).shape) continue;  // no broadcast of cur
      p = idx.producer(cur);
    }
    if (p < 0 || !single(cur)) continue;
    if (!match_linear(g, idx, ctx, p, V, m)) continue;
    if (!add_bias.empty()) {
      if (!m.bias.empty()) continue;
      m.bias = add_bias;
    }
    if (!m.bias.empty() && !bias_ok(ctx, m.bias, V)) continue;
    const int64_t C = ctx.meta(m.h).shape.back();
    if (ctx.meta(m.h).numel() / C !=
        (m.slice >= 0 ? ctx.meta(g.nodes[m.slice].inputs[0]).numel() : ctx.meta(cur).numel()) / V)
      continue;  // h's rows are the logits' rows

    // Rewrite: [Slice h] → [Reshape (N,C)] → LinearCrossEntropy.
    std::vector<ir::Node> added;
    std::string h = m.h;
    if (m.slice >= 0) {
      ir::Node s = g.nodes[m.slice];
      s.name = ctx.fresh(g, s.name + "/on_h");
      s.inputs[0] = h;
      h = ctx.fresh(g, m.h + "/sliced");
      s.outputs = {h};
      added.push_back(std::move(s));
    }
    const bool is_2d = m.slice < 0 && ctx.meta(m.h).shape == Shape{N, C};
    if (!is_2d) {
      std::string shape = add_i64_constant(g, ctx, m.h + "/rows_shape", {N, C});
      std::string name = ctx.fresh(g, loss.name + "/rows");
      std::string rows = ctx.fresh(g, m.h + "/rows");
      added.push_back(make_node("Reshape", "", {h, shape}, {rows}, {}, name));
      h = rows;
    }
    ir::Node f = make_node("LinearCrossEntropy", "onyx", {h, m.w, labels}, {loss.outputs[0]},
                           {{"transB", ir::Attribute::of_int(m.transB ? 1 : 0)},
                            {"reduction", ir::Attribute::of_string(red)}},
                           ctx.fresh(g, loss.name + "/linear_cross_entropy"));
    if (!m.bias.empty()) f.inputs.push_back(m.bias);
    if (loss.has_attr("ignore_index")) f.attrs["ignore_index"] = loss.attrs.at("ignore_index");
    added.push_back(std::move(f));
    g.nodes.erase(g.nodes.begin() + li);
    g.nodes.insert(g.nodes.begin() + li, added.begin(), added.end());
    li += (int)added.size() - 1;
    fused++;
  }
  if (fused) {
    import_domain(g, "onyx");
    sort_topologically(g);
  }
  return fused;
}

ONYX_REGISTER_FUSION(fuse_cross_entropy, "cross_entropy_fusion", 600);

}  // namespace onyx::passes
