// attention_fusion.cc — fuses exported multi-head attention into one onyx.Attention node
// (kernels/cpu/attention.cc; backward rule in autodiff/gradients/attention.cc). Hand-written: the
// pattern is what PyTorch's opset-14 export of BERT / GPT-2 / ViT self-attention looks like after
// folding, and no library does this rewrite on our IR.
//
// Matched, from each Softmax back and forth (every intermediate value used once):
//   q  = Transpose(Reshape(Q, (B,Tq,H,D)),  [0,2,1,3])       optional scalar Mul/Div on q
//   kT = Transpose(Reshape(K, (B,Tk,H,D)),  [0,2,3,1])       or [0,1,3,2] of a [0,2,1,3] one;
//                                                            optional scalar Mul/Div on kT
//   v  = Transpose(Reshape(V, (B,Tk,H,Dv)), [0,2,1,3])
//   s  = MatMul(q, kT)  then, in this order from the MatMul: scalar Div/Mul (the scale), at most
//   one
//        Add(s, mask) (an additive mask broadcastable to (B,H,Tq,Tk)) and at most one
//        Where(cond, fill, s) with a constant causal cond (true exactly above the diagonal) and a
//        fill <= -1e4 (or the Where(keep, s, fill) form with the lower triangle); a scale after
//        the Add would scale the mask, so that chain is left alone
//   p  = Softmax(s, axis = last)
//   p  = Where(IsNaN(p), 0, p)                 optional (the dynamo exporter's SDPA: a row the
//        mask hides entirely is 0, not NaN) → {zero_masked_rows 1}
//   p' = Dropout(p, ratio r, training_mode)   optional (attention dropout, e.g. BERT's
//        attention_probs_dropout_prob): opset >= 12, mask output unused, ratio and training_mode
//        constant scalars (absent ratio: 0.5; absent or false training_mode: inert)
//   o  = Reshape(Transpose(MatMul(p', v), [0,2,1,3]), (B,Tq,H·Dv))
// → o = onyx.Attention(Q, K, V[, mask]) {num_heads H, scale, causal}, reading Q/K/V as (B,T,C)
// directly (a Reshape is added when the projection produced another shape of the same data).
// An active Dropout becomes {dropout_ratio r, seed, rng_key}: the Dropout's own seed attribute and
// identity (its rng_key attribute, else its output name), so the kernel draws the very mask the
// Dropout would have drawn for a run seed (DESIGN decision 10) and AttentionGrad redraws it.
//
// The Q/K/V side starts at the Reshape, so it matches both the exported MatMul+Add projections and
// linear_fusion's onyx.MatMulT(x, W, bias) (B,T,C) outputs.
#include <cmath>

#include "passes/match.h"

namespace onyx::passes {
namespace {

struct Matcher {
  ir::Graph& g;
  PassContext& ctx;
  GraphIndex idx;

  Matcher(ir::Graph& g_, PassContext& c) : g(g_), ctx(c), idx(g_) {}

  const ir::Node* producer(const std::string& v) const { return idx.producer_node(g, v); }
  bool single_use(const std::string& v) const { return idx.single_use(v); }
  bool f32(const std::string& v) const { return is_f32(ctx, v); }

  // x = Mul(a, c) / Mul(c, a) / Div(a, c) with c a one-element constant: returns a, multiplies
  // `scale` by the factor. nullopt when x is not such a node.
  std::optional<std::string> peel_scalar(const std::string& x, double& scale) const {
    const ir::Node* n = producer(x);
    if (!n || n->inputs.size() != 2) return std::nullopt;
    if (is_op(*n, "Mul")) {
      for (int i = 0; i < 2; i++) {
        auto c = ctx.scalar(g, n->inputs[i]);
        if (c && ctx.meta(n->inputs[i]).dtype == DType::Float32 &&
            ctx.meta(n->inputs[1 - i]).shape == ctx.meta(x).shape) {
          scale *= *c;
          return n->inputs[1 - i];
        }
      }
    } else if (is_op(*n, "Div")) {
      auto c = ctx.scalar(g, n->inputs[1]);
      if (c && *c != 0 && ctx.meta(n->inputs[1]).dtype == DType::Float32 &&
          ctx.meta(n->inputs[0]).shape == ctx.meta(x).shape) {
        scale /= *c;
        return n->inputs[0];
      }
    }
    return std::nullopt;
  }
  // Strips single-use scalar Mul/Div nodes above x.
  std::string peel_scalars(std::string x, double& scale) const {
    while (single_use(x)) {
      auto a = peel_scalar(x, scale);
      if (!a) break;
      x = *a;
    }
    return x;
  }

  // One head side: x = Transpose(Reshape(X, (B,T,H,D)), perm); returns X and (B,T,H,D).
  bool head_side(const std::string& x, const std::vector<int64_t>& perm, std::string& X,
                 Shape& bthd) const {
    const ir::Node* t = producer(x);
    if (!t || !is_transpose(*t, perm)) return false;
    const ir::Node* r = producer(t->inputs[0]);
    if (!r || !is_op(*r, "Reshape") || !ctx.has_meta(r->outputs[0])) return false;
    bthd = ctx.meta(r->outputs[0]).shape;
    if (bthd.size() != 4 || !f32(r->inputs[0])) return false;
    X = r->inputs[0];
    return true;
  }

  // K side: [0,2,3,1] directly, or [0,1,3,2] of a [0,2,1,3] head transpose.
  bool key_side(const std::string& x, std::string& K, Shape& bthd) const {
    if (head_side(x, {0, 2, 3, 1}, K, bthd)) return true;
    const ir::Node* t = producer(x);
    if (!t || !is_transpose(*t, {0, 1, 3, 2})) return false;
    return head_side(t->inputs[0], {0, 2, 1, 3}, K, bthd);
  }

  // cond's masked positions (true where the score is replaced by the fill) are exactly j > i over
  // the last two dims (Tq, Tk), for every leading index.
  bool is_causal(const std::string& cond, bool masked_when_true, int64_t T) const {
    const Tensor* c = ctx.constant(g, cond);
    if (!c || c->dtype() != DType::Bool || c->rank() < 2 || c->dim(-1) != T || c->dim(-2) != T)
      return false;
    const uint8_t* m = static_cast<const uint8_t*>(c->raw());
    int64_t mats = c->numel() / (T * T);
    for (int64_t k = 0; k < mats; k++)
      for (int64_t i = 0; i < T; i++)
        for (int64_t j = 0; j < T; j++) {
          bool masked = (m[(k * T + i) * T + j] != 0) == masked_when_true;
          if (masked != (j > i)) return false;
        }
    return true;
  }

  // Does v depend on a trainable weight? The fused op's mask input gets no gradient, so a learned
  // additive bias (relative positions, ALiBi slopes as weights) must stay unfused.
  bool depends_on_variable(const std::string& v) const {
    std::vector<std::string> todo{v};
    std::set<std::string> seen;
    while (!todo.empty()) {
      std::string x = todo.back();
      todo.pop_back();
      if (x.empty() || !seen.insert(x).second) continue;
      if (ctx.variables.count(x)) return true;
      if (const ir::Node* n = producer(x))
        for (auto& i : n->inputs) todo.push_back(i);
    }
    return false;
  }

  // Attention dropout on the probabilities: Dropout(p, ratio, training_mode) whose mask nobody
  // reads and whose ratio / training_mode are constants. Sets the ratio (0 when the Dropout is
  // inert), the node's seed attribute and its rng identity (as the Dropout kernel picks it).
  bool dropout_of(const ir::Node& dn, double& ratio, int64_t& seed, std::string& key) const {
    if (dn.outputs.empty() || dn.inputs.empty() || !f32(dn.outputs[0])) return false;
    if (!idx.outputs_unused(dn)) return false;
    if (g.opset("") < 12) {  // opsets < 12 run Dropout as the identity at inference and training
      ratio = 0;
      return true;
    }
    double r = 0.5;
    bool training = false;
    if (dn.inputs.size() > 1 && !dn.inputs[1].empty()) {
      auto v = ctx.scalar(g, dn.inputs[1]);
      if (!v) return false;
      r = *v;
    }
    if (dn.inputs.size() > 2 && !dn.inputs[2].empty()) {
      auto v = ctx.scalar(g, dn.inputs[2]);
      if (!v) return false;
      training = *v != 0;
    }
    // the attribute is a float: only ratios a float holds exactly keep the Dropout's threshold
    if (!(r >= 0 && r < 1) || (double)(float)r != r) return false;
    ratio = training ? r : 0;
    seed = dn.attr_int("seed", 0);
    key = dropout_rng_key(dn);
    return true;
  }

  // p's two readers are IsNaN(p) and Where(IsNaN(p), 0, p) (the dynamo exporter's SDPA: rows the
  // mask hides entirely become 0, not NaN): out = that Where's output.
  bool nan_guard(const std::string& p, std::string& out) const {
    const auto& cs = idx.consumers(p);
    if (cs.size() != 2) return false;
    const ir::Node* isnan = nullptr;
    const ir::Node* where = nullptr;
    for (int c : cs) {
      const ir::Node& n = g.nodes[c];
      if (is_op(n, "IsNaN") && n.inputs.size() == 1)
        isnan = &n;
      else if (is_op(n, "Where") && n.inputs.size() == 3)
        where = &n;
    }
    if (!isnan || !where || !single_use(isnan->outputs[0])) return false;
    if (where->inputs[0] != isnan->outputs[0] || where->inputs[2] != p) return false;
    auto zero = ctx.scalar(g, where->inputs[1]);
    if (!zero || *zero != 0.0 || !f32(where->outputs[0])) return false;
    out = where->outputs[0];
    return true;
  }

  // Tries the pattern around Softmax node `si`; on success rewrites and returns true.
  bool try_fuse(int si) {
    const ir::Node& sm = g.nodes[si];
    const std::string p = sm.outputs[0], s_in = sm.inputs[0];
    if (!f32(p)) return false;
    const Shape& ps = ctx.meta(p).shape;
    if (ps.size() != 4) return false;
    int64_t axis = sm.attr_int("axis", -1);
    if (axis != -1 && axis != 3) return false;
    const int64_t B = ps[0], H = ps[1], Tq = ps[2], Tk = ps[3];

    // ---- forward: p -> [NaN guard] -> [Dropout] -> MatMul(p, v) -> Transpose -> Reshape
    std::string pd = p;  // what the P·V MatMul reads
    bool zero_masked_rows = false;
    if (!single_use(p)) {
      if (!nan_guard(p, pd)) return false;
      zero_masked_rows = true;
    }
    int pc = idx.sole_consumer(pd);
    if (pc < 0) return false;
    double dropout_ratio = 0;
    int64_t dropout_seed = 0;
    std::string dropout_key;
    if (const ir::Node& dn = g.nodes[pc]; is_op(dn, "Dropout")) {
      if (!dropout_of(dn, dropout_ratio, dropout_seed, dropout_key)) return false;
      pd = dn.outputs[0];
      pc = idx.sole_consumer(pd);
      if (pc < 0) return false;
    }
    const ir::Node& pv = g.nodes[pc];
    if (!is_op(pv, "MatMul") || pv.inputs[0] != pd) return false;
    std::string V;
    Shape v_bthd;
    if (!head_side(pv.inputs[1], {0, 2, 1, 3}, V, v_bthd)) return false;
    const std::string o = pv.outputs[0];
    int ot_i = idx.sole_consumer(o);
    if (ot_i < 0) return false;
    const ir::Node& ot = g.nodes[ot_i];
    if (!is_transpose(ot, {0, 2, 1, 3})) return false;
    int out_i = idx.sole_consumer(ot.outputs[0]);
    if (out_i < 0) return false;
    const ir::Node& out_r = g.nodes[out_i];
    if (!is_op(out_r, "Reshape") || out_r.inputs[0] != ot.outputs[0]) return false;
    const std::string out = out_r.outputs[0];
    const int64_t Dv = v_bthd[3];
    if (!ctx.has_meta(out) || shape_numel(ctx.meta(out).shape) != B * Tq * H * Dv) return false;

    // ---- backward from the softmax input: mask / causal / scale, down to MatMul(q, kT)
    double scale = 1.0;
    std::string mask;
    bool causal = false, seen_scale = false;  // walking back: a scale seen before the mask
    std::string x = s_in;
    const ir::Node* qk = nullptr;
    for (int guard = 0; guard < 16; guard++) {
      if (!single_use(x) || !f32(x) || ctx.meta(x).shape != ps) return false;
      const ir::Node* n = producer(x);
      if (!n) return false;
      if (is_op(*n, "MatMul")) {
        qk = n;
        break;
      }
      if (auto a = peel_scalar(x, scale)) {
        seen_scale = true;
        x = *a;
        continue;
      }
      if (is_op(*n, "Add") && n->inputs.size() == 2 && mask.empty()) {
        if (seen_scale) return false;  // the scale would apply to the mask too
        // the score side is the operand with the full (B,H,Tq,Tk) shape produced in the chain
        int si2 = -1;
        for (int i = 0; i < 2; i++) {
          const std::string& a = n->inputs[i];
          if (f32(a) && ctx.meta(a).shape == ps && producer(a) && single_use(a)) {
            const ir::Node* pa = producer(a);
            if (is_op(*pa, "MatMul") || is_op(*pa, "Mul") || is_op(*pa, "Div") ||
                is_op(*pa, "Where") || is_op(*pa, "Add")) {
              si2 = i;
              break;
            }
          }
        }
        if (si2 < 0) return false;
        const std::string& m = n->inputs[1 - si2];
        if (!f32(m) || ctx.meta(m).shape.size() > 4) return false;
        // broadcastable to (B,H,Tq,Tk) without growing the scores
        const Shape& msh = ctx.meta(m).shape;
        for (size_t i = 0; i < msh.size(); i++) {
          int64_t full = ps[4 - msh.size() + i];
          if (msh[i] != full && msh[i] != 1) return false;
        }
        if (depends_on_variable(m)) return false;
        mask = m;
        x = n->inputs[si2];
        continue;
      }
      if (is_op(*n, "Where") && n->inputs.size() == 3 && !causal && Tq == Tk) {
        int side = -1;  // which of X (1) / Y (2) carries the scores
        for (int i = 1; i <= 2; i++) {
          auto fill = ctx.scalar(g, n->inputs[3 - i]);
          if (fill && *fill <= -1e4 && f32(n->inputs[i]) && ctx.meta(n->inputs[i]).shape == ps) {
            side = i;
            break;
          }
        }
        if (side < 0) return false;
        // Where(cond, fill, s): masked where cond; Where(cond, s, fill): masked where !cond.
        if (!is_causal(n->inputs[0], side == 2, Tq)) return false;
        causal = true;
        x = n->inputs[side];
        continue;
      }
      return false;
    }
    if (!qk || qk->inputs.size() != 2) return false;

    std::string Q, K;
    Shape q_bthd, k_bthd;
    if (!head_side(peel_scalars(qk->inputs[0], scale), {0, 2, 1, 3}, Q, q_bthd)) return false;
    if (!key_side(peel_scalars(qk->inputs[1], scale), K, k_bthd)) return false;
    if (!(scale > 0) || !std::isfinite(scale)) return false;
    const int64_t D = q_bthd[3];
    if (q_bthd != Shape({B, Tq, H, D}) || k_bthd != Shape({B, Tk, H, D}) ||
        v_bthd != Shape({B, Tk, H, Dv}))
      return false;

    // ---- rewrite: Q/K/V as (B,T,C) (adding a Reshape when needed), then the fused node
    std::vector<ir::Node> extra;
    auto as_btc = [&](const std::string& X, int64_t T, int64_t C) {
      Shape want{B, T, C};
      if (ctx.meta(X).shape == want) return X;
      std::string shp = add_i64_constant(g, ctx, X + "/btc_shape", want);
      std::string name = ctx.fresh(g, X + "/btc");
      ctx.metas[name] = {DType::Float32, want};
      extra.push_back(make_node("Reshape", "", {X, shp}, {name}, {}, name));
      return name;
    };
    std::string q = as_btc(Q, Tq, H * D), k = as_btc(K, Tk, H * D), v = as_btc(V, Tk, H * Dv);

    using A = ir::Attribute;
    ir::Node att = make_node("Attention", "onyx", {q, k, v}, {},
                             {{"num_heads", A::of_int(H)},
                              {"scale", A::of_float((float)scale)},
                              {"causal", A::of_int(causal ? 1 : 0)}},
                             ctx.fresh(g, sm.name + "/attention"));
    if (!mask.empty()) att.inputs.push_back(mask);
    if (zero_masked_rows) att.attrs["zero_masked_rows"] = A::of_int(1);
    if (dropout_ratio > 0) {
      att.attrs["dropout_ratio"] = A::of_float((float)dropout_ratio);
      att.attrs["seed"] = A::of_int(dropout_seed);
      att.attrs["rng_key"] = A::of_string(dropout_key);
    }
    Shape btc{B, Tq, H * Dv};
    if (ctx.meta(out).shape == btc) {
      att.outputs = {out};
    } else {  // the graph wanted another view of the same data: reshape the fused output
      std::string y = ctx.fresh(g, out + "/attention");
      att.outputs = {y};
      std::string shp = add_i64_constant(g, ctx, out + "/shape", ctx.meta(out).shape);
      std::string name = ctx.fresh(g, out + "/reshape");
      extra.push_back(make_node("Reshape", "", {y, shp}, {out}, {}, name));
    }
    // The fused node takes the final Reshape's place (after every input's producer); the rest of
    // the old chain is left for dead-node elimination.
    g.nodes[out_i] = att;
    for (auto& e : extra) g.nodes.push_back(e);
    return true;
  }
};

}  // namespace

int fuse_attention(ir::Graph& g, PassContext& ctx) {
  std::vector<int> softmaxes;
  for (int i = 0; i < (int)g.nodes.size(); i++)
    if (is_op(g.nodes[i], "Softmax")) softmaxes.push_back(i);
  if (softmaxes.empty()) return 0;
  int fused = 0;
  Matcher m(g, ctx);
  for (int si : softmaxes) {
    // Earlier rewrites replace only final Reshape nodes (not part of another match's chain, which
    // ends at its own Reshape) and append nodes, so the index stays valid for the others.
    if (m.try_fuse(si)) fused++;
  }
  if (fused) {
    import_domain(g, "onyx");
    sort_topologically(g);
  }
  return fused;
}

ONYX_REGISTER_FUSION(fuse_attention, "attention_fusion", 400);

}  // namespace onyx::passes
