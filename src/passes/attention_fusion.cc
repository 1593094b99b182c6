// attention_fusion.cc — fuses exported multi-head attention into one onyx.Attention node
// (kernels/attention/attention.cc; backward rule in autodiff/gradients/attention.cc). Hand-written:
// the pattern is what PyTorch's opset-14 export of BERT / GPT-2 / ViT self-attention looks like
// after folding, and no library does this rewrite on our IR.
//
// Matched, from each Softmax back and forth (every intermediate value used once):
//   heads(X, H) = Transpose(Reshape(X, (B,T,H,D)), [0,2,1,3])        (B,H,T,D)
//               | onyx.Rotary(heads(X, H), cos, sin)  rotary_fusion's q/k rotation, cos/sin
//                 (b, 1, T, D) with b in {1, B} (or fewer leading dims of 1): one table per token
//               | Reshape(Expand(Unsqueeze(heads(X, Hk), 2), (B,Hk,G,T,D)), (B,Hk·G,T,D))
//                 Transformers' repeat_kv: grouped-query attention, G query heads per key/value
//                 head (the 5-D Expand output itself where the key side reads it)
//   q  = heads(Q, H)                                           optional scalar Mul/Div on q
//   kT = Transpose(Reshape(K, (B,Tk,H,D)), [0,2,3,1]) | Transpose(heads(K, H), [0,1,3,2])
//      | Reshape(Transpose(Reshape(heads(K, H), (B·H,Tk,D)), [0,2,1]), (B,H,D,Tk)) (the dynamo
//        exporter's SDPA through a 3-D layout)                 optional scalar Mul/Div on kT
//   v  = heads(V, H)  (Dv for D)
//   s  = MatMul(q, kT)  then, in this order from the MatMul: scalar Div/Mul (the scale), at most
//   one
//        Add(s, mask) (an additive mask broadcastable to (B,H,Tq,Tk)) and at most one
//        Where(cond, fill, s) with a fill <= -1e4 (or the Where(keep, s, fill) form): a constant
//        causal cond (true exactly above the diagonal) becomes {causal 1}; any other boolean cond
//        broadcastable to (B,H,Tq,Tk) becomes part of the additive mask, Where(cond, fill, 0)
//        (or Where(keep, 0, fill)) plus the Add's mask. A scale after the Add (or after that
//        Where) would scale the mask, so that chain is left alone
//   p  = Softmax(s, axis = last)
//   p  = Where(IsNaN(p), 0, p)                 optional (the dynamo exporter's SDPA: a row the
//        mask hides entirely is 0, not NaN) → {zero_masked_rows 1}
//   p' = Dropout(p, ratio r, training_mode)   optional (attention dropout, e.g. BERT's
//        attention_probs_dropout_prob): opset >= 12, mask output unused, ratio and training_mode
//        constant scalars (absent ratio: 0.5; absent or false training_mode: inert)
//   o  = Reshape(Transpose(MatMul(p', v), [0,2,1,3]), (B,Tq,H·Dv))
// → o = onyx.Attention(Q, K, V[, mask]) {num_heads H, num_kv_heads Hk, scale, causal}, reading
// Q/K/V as (B,T,C) directly (a Reshape is added when the projection produced another shape of the
// same data). A rotated side gets its onyx.Rotary back in the (B,T,H,D) layout, on X viewed as
// (B,T,H,D) with the tables viewed as (b,T,1,D): the same elementwise arithmetic, without the
// head transposes. K and V of grouped-query attention stay at Hk heads (no repeat).
// {causal 1} is also set when the mask itself hides every key after the query: a cond proven
// causal (a constant lower triangle And-ed in, or an upper triangle Or-ed in, through Unsqueeze /
// Expand / Not), or a constant additive mask <= -1e4 above the diagonal. The kernel then skips
// those keys (their probabilities were exactly 0) and still adds the mask.
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

// A fill or additive-mask value at or below this hides its key (exp underflows to 0).
constexpr double kMaskedFill = -1e4;

struct Matcher : FusionMatcher {
  using FusionMatcher::FusionMatcher;

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

  // One of Q, K, V as the fused op reads it: X viewed as (B,T,Hk,D), each of its Hk heads
  // serving G query heads, optionally rotated.
  struct HeadSide {
    std::string X;
    Shape bthd;                        // (B,T,Hk,D)
    int64_t G = 1;                     // repeat_kv's group size
    const ir::Node* rotary = nullptr;  // onyx.Rotary(heads, cos, sin) to redo in (B,T,Hk,D)
    int64_t heads() const { return bthd[2] * G; }
  };

  // x = Transpose(Reshape(X, (B,T,H,D)), perm).
  bool plain_side(const std::string& x, const std::vector<int64_t>& perm, HeadSide& s) const {
    const ir::Node* t = producer(x);
    if (!t || !is_transpose(*t, perm)) return false;
    const ir::Node* r = producer(t->inputs[0]);
    if (!r || !is_op(*r, "Reshape") || !ctx.has_meta(r->outputs[0])) return false;
    s.bthd = ctx.meta(r->outputs[0]).shape;
    if (s.bthd.size() != 4 || !f32(r->inputs[0])) return false;
    s.X = r->inputs[0];
    return true;
  }

  // cos/sin of a Rotary over (B,H,T,D) heads that serve every head alike: (b,1,T,D) with b in
  // {1,B}, or (1,T,D) / (T,D); returns their (b,T,1,D) / (T,1,D) view for (B,T,H,D) heads.
  std::optional<Shape> table_view(const std::string& t, int64_t B, int64_t T, int64_t D) const {
    if (!f32(t)) return std::nullopt;
    const Shape& c = ctx.meta(t).shape;
    if (c.size() < 2 || c.size() > 4 || c.back() != D ||
        (c[c.size() - 2] != T && c[c.size() - 2] != 1))
      return std::nullopt;
    for (size_t i = 0; i + 2 < c.size(); i++)
      if (c[i] != 1 && !(c.size() == 4 && i == 0 && c[i] == B)) return std::nullopt;
    if (c.size() == 4) return Shape{c[0], c[2], 1, D};
    return Shape{c[c.size() - 2], 1, D};
  }

  // heads(X, H) of the header, as a (B,H,T,D) value (no repeat), optionally rotated.
  bool rotated_or_plain(const std::string& x, HeadSide& s) const {
    const ir::Node* n = producer(x);
    if (n && is_op(*n, "onyx", "Rotary") && n->inputs.size() == 3) {
      if (!plain_side(n->inputs[0], {0, 2, 1, 3}, s)) return false;
      for (int i = 1; i <= 2; i++)
        if (!table_view(n->inputs[i], s.bthd[0], s.bthd[1], s.bthd[3])) return false;
      s.rotary = n;
      return true;
    }
    return plain_side(x, {0, 2, 1, 3}, s);
  }

  // x = Expand(Unsqueeze(h, 2), (B,Hk,G,T,D)), h = rotated_or_plain with Hk heads.
  bool repeated5(const std::string& x, HeadSide& s) const {
    const ir::Node* e = producer(x);
    if (!e || !is_op(*e, "Expand") || !ctx.has_meta(x)) return false;
    const Shape& es = ctx.meta(x).shape;
    const ir::Node* u = producer(e->inputs[0]);
    if (es.size() != 5 || !u || !is_op(*u, "Unsqueeze") || !ctx.has_meta(u->outputs[0]))
      return false;
    const Shape& us = ctx.meta(u->outputs[0]).shape;
    if (us != Shape({es[0], es[1], 1, es[3], es[4]}) || !rotated_or_plain(u->inputs[0], s))
      return false;
    if (ctx.meta(u->inputs[0]).shape != Shape({es[0], es[1], es[3], es[4]})) return false;
    s.G = es[2];
    return true;
  }

  // heads(X, H): a (B,H,T,D) value.
  bool head_side(const std::string& x, HeadSide& s) const {
    if (rotated_or_plain(x, s)) return true;
    const ir::Node* r = producer(x);
    if (!r || !is_op(*r, "Reshape") || !ctx.has_meta(x)) return false;
    const Shape& rs = ctx.meta(x).shape;
    if (!repeated5(r->inputs[0], s)) return false;
    const Shape& b = s.bthd;
    return rs == Shape({b[0], s.heads(), b[1], b[3]});
  }

  // The key side kT (B,H,D,Tk) of the header.
  bool key_side(const std::string& x, HeadSide& s) const {
    if (plain_side(x, {0, 2, 3, 1}, s)) return true;
    const ir::Node* t = producer(x);
    if (t && is_transpose(*t, {0, 1, 3, 2})) return head_side(t->inputs[0], s);
    // Reshape(Transpose(Reshape(h, (B·H,Tk,D)), [0,2,1]), (B,H,D,Tk)), h 4-D heads or the 5-D
    // repeat_kv Expand
    if (!t || !is_op(*t, "Reshape") || !ctx.has_meta(x)) return false;
    const ir::Node* tr = producer(t->inputs[0]);
    if (!tr || !is_transpose(*tr, {0, 2, 1})) return false;
    const ir::Node* r3 = producer(tr->inputs[0]);
    if (!r3 || !is_op(*r3, "Reshape") || !ctx.has_meta(r3->outputs[0])) return false;
    if (!head_side(r3->inputs[0], s) && !repeated5(r3->inputs[0], s)) return false;
    const Shape& b = s.bthd;
    const int64_t H = s.heads();
    return ctx.meta(r3->outputs[0]).shape == Shape({b[0] * H, b[1], b[3]}) &&
           ctx.meta(x).shape == Shape({b[0], H, b[3], b[1]});
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

  // Every key after the query is hidden by the boolean `cond` (masked where true when
  // masked_when_true, else kept where true), for every leading index: cond is, through Unsqueeze /
  // Expand / Not, a constant with that property that keeps the diagonal (so no row is hidden
  // whole by it: the kernel's causal limit then drops only keys whose probability was 0), or an
  // And (kept form) / Or (masked form) with such an operand. Its last two dims are (T, T).
  bool implies_causal(const std::string& cond, bool masked_when_true, int64_t T,
                      int depth = 0) const {
    if (depth > 8 || !ctx.has_meta(cond)) return false;
    const Shape& cs = ctx.meta(cond).shape;
    if (ctx.meta(cond).dtype != DType::Bool || cs.size() < 2 || cs[cs.size() - 1] != T ||
        cs[cs.size() - 2] != T)
      return false;
    if (const Tensor* c = ctx.constant(g, cond)) {
      const uint8_t* m = static_cast<const uint8_t*>(c->raw());
      for (int64_t k = 0; k < c->numel() / (T * T); k++)
        for (int64_t i = 0; i < T; i++)
          for (int64_t j = i; j < T; j++)
            if ((m[(k * T + i) * T + j] != 0) != (j == i ? !masked_when_true : masked_when_true))
              return false;
      return true;
    }
    const ir::Node* n = producer(cond);
    if (!n || n->inputs.empty()) return false;
    if (is_op(*n, "Unsqueeze") || is_op(*n, "Expand") || is_op(*n, "Identity"))
      return implies_causal(n->inputs[0], masked_when_true, T, depth + 1);
    if (is_op(*n, "Not")) return implies_causal(n->inputs[0], !masked_when_true, T, depth + 1);
    if (is_op(*n, masked_when_true ? "Or" : "And") && n->inputs.size() == 2)
      return implies_causal(n->inputs[0], masked_when_true, T, depth + 1) ||
             implies_causal(n->inputs[1], masked_when_true, T, depth + 1);
    return false;
  }

  // A constant additive mask (broadcastable to (.., T, T)) at most -1e4 at every key after its
  // query, and above it on the diagonal.
  bool additive_causal(const std::string& mask, int64_t T) const {
    const Tensor* c = ctx.constant(g, mask);
    if (!c || c->dtype() != DType::Float32 || c->rank() < 2 || c->dim(-1) != T || c->dim(-2) != T)
      return false;
    const float* m = c->data<float>();
    for (int64_t k = 0; k < c->numel() / (T * T); k++)
      for (int64_t i = 0; i < T; i++)
        for (int64_t j = i; j < T; j++)
          if ((m[(k * T + i) * T + j] <= kMaskedFill) != (j > i)) return false;
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

  // What try_fuse finds around one Softmax: the shapes, the output side (dropout, V, the final
  // Reshape) and the score side (scale, masks, causal, Q and K).
  struct Found {
    Shape ps;  // the probabilities (B, H, Tq, Tk)
    int64_t B = 0, H = 0, Tq = 0, Tk = 0, Dv = 0, Hk = 0;
    std::string out;  // the final Reshape's output, which the fused node writes
    int out_i = -1;   // that Reshape
    bool zero_masked_rows = false;
    double dropout_ratio = 0;
    int64_t dropout_seed = 0;
    std::string dropout_key;
    HeadSide qs, ks, vs;
    double scale = 1.0;
    std::string mask, cond, cond_fill;  // additive mask; a boolean Where's cond and its fill
    bool causal = false, cond_masks = false;
  };

  // Tries the pattern around Softmax node `si`; on success rewrites and returns true.
  bool try_fuse(int si) {
    Found f;
    if (!match_output_side(si, f) || !match_score_side(g.nodes[si].inputs[0], f)) return false;
    rewrite(g.nodes[si], f);
    return true;
  }

  // The Softmax's output side: p (through a NaN guard and a Dropout) times V, then the Transpose
  // and Reshape back to (B, Tq, H·Dv).
  bool match_output_side(int si, Found& f) {
    const ir::Node& sm = g.nodes[si];
    const std::string p = sm.outputs[0];
    if (!f32(p)) return false;
    const Shape& ps = f.ps = ctx.meta(p).shape;
    if (ps.size() != 4) return false;
    int64_t axis = sm.attr_int("axis", -1);
    if (axis != -1 && axis != 3) return false;
    const int64_t B = f.B = ps[0], H = f.H = ps[1], Tq = f.Tq = ps[2];
    f.Tk = ps[3];

    // ---- forward: p -> [NaN guard] -> [Dropout] -> MatMul(p, v) -> Transpose -> Reshape
    std::string pd = p;  // what the P·V MatMul reads
    if (!single_use(p)) {
      if (!nan_guard(p, pd)) return false;
      f.zero_masked_rows = true;
    }
    int pc = idx.sole_consumer(pd);
    if (pc < 0) return false;
    if (const ir::Node& dn = g.nodes[pc]; is_op(dn, "Dropout")) {
      if (!dropout_of(dn, f.dropout_ratio, f.dropout_seed, f.dropout_key)) return false;
      pd = dn.outputs[0];
      pc = idx.sole_consumer(pd);
      if (pc < 0) return false;
    }
    const ir::Node& pv = g.nodes[pc];
    if (!is_op(pv, "MatMul") || pv.inputs[0] != pd) return false;
    HeadSide& vs = f.vs;
    if (!head_side(pv.inputs[1], vs)) return false;
    const std::string o = pv.outputs[0];
    int ot_i = idx.sole_consumer(o);
    if (ot_i < 0) return false;
    const ir::Node& ot = g.nodes[ot_i];
    if (!is_transpose(ot, {0, 2, 1, 3})) return false;
    const int out_i = f.out_i = idx.sole_consumer(ot.outputs[0]);
    if (out_i < 0) return false;
    const ir::Node& out_r = g.nodes[out_i];
    if (!is_op(out_r, "Reshape") || out_r.inputs[0] != ot.outputs[0]) return false;
    const std::string& out = f.out = out_r.outputs[0];
    const int64_t Dv = f.Dv = vs.bthd[3];
    if (vs.heads() != H) return false;
    if (!ctx.has_meta(out) || shape_numel(ctx.meta(out).shape) != B * Tq * H * Dv) return false;
    return true;
  }

  // The Softmax's input side, walked back from s_in: scale, additive mask, causal or boolean Where,
  // down to MatMul(q, kᵀ), whose sides must be heads of the shapes the output side implies.
  bool match_score_side(const std::string& s_in, Found& f) {
    const Shape& ps = f.ps;
    const int64_t B = f.B, H = f.H, Tq = f.Tq, Tk = f.Tk, Dv = f.Dv;
    // ---- backward from the softmax input: mask / causal / scale, down to MatMul(q, kT)
    double& scale = f.scale;
    std::string& mask = f.mask;
    bool& causal = f.causal;
    bool seen_scale = false;  // walking back: a scale seen before the mask
    // A non-constant Where's boolean cond, folded into the additive mask: Where(cond, fill, 0)
    // (masked where true) or Where(cond, 0, fill) (kept where true).
    std::string &cond = f.cond, &cond_fill = f.cond_fill;
    bool& cond_masks = f.cond_masks;
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
      if (is_op(*n, "Where") && n->inputs.size() == 3 && !causal && cond.empty()) {
        int side = -1;  // which of X (1) / Y (2) carries the scores
        for (int i = 1; i <= 2; i++) {
          auto fill = ctx.scalar(g, n->inputs[3 - i]);
          if (fill && *fill <= kMaskedFill && f32(n->inputs[3 - i]) && f32(n->inputs[i]) &&
              ctx.meta(n->inputs[i]).shape == ps) {
            side = i;
            break;
          }
        }
        if (side < 0) return false;
        // Where(cond, fill, s): masked where cond; Where(cond, s, fill): masked where !cond.
        const std::string& c = n->inputs[0];
        if (Tq == Tk && is_causal(c, side == 2, Tq)) {
          causal = true;
        } else {
          // any other boolean cond broadcasting to the scores joins the additive mask; the fill
          // is not scaled in the graph, so no scale may follow it
          if (seen_scale || !ctx.has_meta(c) || ctx.meta(c).dtype != DType::Bool) return false;
          const Shape& cs = ctx.meta(c).shape;
          if (cs.size() > 4) return false;
          for (size_t i = 0; i < cs.size(); i++)
            if (cs[i] != ps[4 - cs.size() + i] && cs[i] != 1) return false;
          cond = c;
          cond_fill = n->inputs[3 - side];
          cond_masks = side == 2;
        }
        x = n->inputs[side];
        continue;
      }
      return false;
    }
    if (!qk || qk->inputs.size() != 2) return false;

    HeadSide &qs = f.qs, &ks = f.ks;
    if (!head_side(peel_scalars(qk->inputs[0], scale), qs)) return false;
    if (!key_side(peel_scalars(qk->inputs[1], scale), ks)) return false;
    if (!(scale > 0) || !std::isfinite(scale)) return false;
    const int64_t D = qs.bthd[3], Hk = f.Hk = ks.bthd[2];
    // K and V share their heads' grouping; Q is not repeated
    if (qs.bthd != Shape({B, Tq, H, D}) || qs.G != 1 || ks.bthd != Shape({B, Tk, Hk, D}) ||
        ks.heads() != H || f.vs.bthd != Shape({B, Tk, Hk, Dv}) || f.vs.G != ks.G)
      return false;
    if (Tq == Tk && !causal) {
      causal = (!cond.empty() && implies_causal(cond, cond_masks, Tq)) ||
               (!mask.empty() && additive_causal(mask, Tq));
    }
    return true;
  }

  // The fused onyx.Attention in place of the final Reshape (Q/K/V as (B,T,C), a Reshape added
  // where needed; rotated sides get their Rotary again on heads; the mask made additive).
  void rewrite(const ir::Node& sm, const Found& f) {
    const int64_t B = f.B, H = f.H, Tq = f.Tq, Dv = f.Dv, Hk = f.Hk;
    const HeadSide &qs = f.qs, &ks = f.ks, &vs = f.vs;
    const std::string &cond = f.cond, &cond_fill = f.cond_fill, &out = f.out;
    const bool causal = f.causal, cond_masks = f.cond_masks;
    const double scale = f.scale;
    std::string mask = f.mask;
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
    auto as_shape = [&](const std::string& X, const Shape& want, const std::string& tag) {
      if (ctx.meta(X).shape == want) return X;
      std::string shp = add_i64_constant(g, ctx, X + "/" + tag + "_shape", want);
      std::string name = ctx.fresh(g, X + "/" + tag);
      ctx.metas[name] = {ctx.meta(X).dtype, want};
      extra.push_back(make_node("Reshape", "", {X, shp}, {name}, {}, name));
      return name;
    };
    // A side as (B,T,Hk·D): rotated sides get their Rotary again on (B,T,Hk,D) heads.
    auto side_btc = [&](const HeadSide& hs) {
      const Shape& b = hs.bthd;
      if (!hs.rotary) return as_btc(hs.X, b[1], b[2] * b[3]);
      std::string x4 = as_shape(hs.X, b, "bthd");
      std::vector<std::string> in{x4};
      for (int i = 1; i <= 2; i++)
        in.push_back(as_shape(hs.rotary->inputs[i],
                              *table_view(hs.rotary->inputs[i], B, b[1], b[3]), "bt1d"));
      ir::Node r = *hs.rotary;
      r.inputs = in;
      r.name = ctx.fresh(g, hs.rotary->name + "/bthd");
      std::string y = ctx.fresh(g, hs.rotary->outputs[0] + "/bthd");
      r.outputs = {y};
      ctx.metas[y] = {DType::Float32, b};
      extra.push_back(r);
      return as_btc(y, b[1], b[2] * b[3]);
    };
    std::string q = side_btc(qs), k = side_btc(ks), v = side_btc(vs);
    // the mask: the Where's cond as an additive mask, plus the Add's
    if (!cond.empty()) {
      std::string zero = ctx.fresh(g, cond + "/zero");
      g.add_initializer(zero, Tensor::scalar_f32(0.0f));
      const Shape& cs = ctx.meta(cond).shape;
      std::string add = ctx.fresh(g, cond + "/additive");
      ctx.metas[add] = {DType::Float32, cs};
      extra.push_back(make_node(
          "Where", "", {cond, cond_masks ? cond_fill : zero, cond_masks ? zero : cond_fill}, {add},
          {}, add));
      if (mask.empty()) {
        mask = add;
      } else {  // (rank-4 right-aligned) broadcast of the two shapes
        Shape a = cs, m = ctx.meta(mask).shape, out(4, 1);
        for (size_t i = 0; i < a.size(); i++) out[4 - a.size() + i] = a[i];
        for (size_t i = 0; i < m.size(); i++)
          out[4 - m.size() + i] = std::max(out[4 - m.size() + i], m[i]);
        std::string sum = ctx.fresh(g, cond + "/mask");
        ctx.metas[sum] = {DType::Float32, out};
        extra.push_back(make_node("Add", "", {add, mask}, {sum}, {}, sum));
        mask = sum;
      }
    }

    using A = ir::Attribute;
    ir::Node att = make_node("Attention", "onyx", {q, k, v}, {},
                             {{"num_heads", A::of_int(H)},
                              {"scale", A::of_float((float)scale)},
                              {"causal", A::of_int(causal ? 1 : 0)}},
                             ctx.fresh(g, sm.name + "/attention"));
    if (Hk != H) att.attrs["num_kv_heads"] = A::of_int(Hk);
    if (!mask.empty()) att.inputs.push_back(mask);
    if (f.zero_masked_rows) att.attrs["zero_masked_rows"] = A::of_int(1);
    if (f.dropout_ratio > 0) {
      att.attrs["dropout_ratio"] = A::of_float((float)f.dropout_ratio);
      att.attrs["seed"] = A::of_int(f.dropout_seed);
      att.attrs["rng_key"] = A::of_string(f.dropout_key);
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
    g.nodes[f.out_i] = att;
    for (auto& e : extra) g.nodes.push_back(e);
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
