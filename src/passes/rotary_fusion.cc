// rotary_fusion.cc — fuses rotary position embeddings, x * cos + rotate_half(x) * sin, into one
// onyx.Rotary (kernels/llama/llama_ops.cc, with onyx.RotaryGrad; rule in
// autodiff/gradients/llama_ops.cc). Hand-written: it is Transformers' apply_rotary_pos_emb as
// onyx's Llama builder (models/llama.cc: Split) and both torch.onnx exporters (two Slices) write
// it, applied to q and to k of every layer; no library rewrites our IR.
//
// Matched, at every Add (either operand order; every intermediate used only inside the pattern):
//   x1, x2 = the halves of x along its last axis (D even, h = D / 2):
//            Split(x, [h, h], axis=last) outputs 0 and 1 | Slice(x, 0, h, last) and
//            Slice(x, h, >= D, last) (step 1; starts/ends/axes as inputs, or attributes < 10)
//   r = Concat(Neg(x2), x1, axis=last)
//   y = Add(Mul(x, cos) | Mul(cos, x),  Mul(r, sin) | Mul(sin, r))
//   cos, sin of one float shape broadcasting to x's, last dim D; y has x's shape
// → y = onyx.Rotary(x, cos, sin).
#include "passes/match.h"

namespace onyx::passes {
namespace {

struct RotaryMatcher : FusionMatcher {
  using FusionMatcher::FusionMatcher;

  bool is_last_axis(int64_t axis, size_t rank) const {
    return axis == -1 || axis == (int64_t)rank - 1;
  }

  // The values of a constant int tensor input (or an ints attribute below opset 10).
  bool ints_of(const ir::Node& n, int input, const char* attr, std::vector<int64_t>* out) const {
    if (n.inputs.size() > 1) {
      if (!n.has_input(input)) return false;
      const Tensor* t = ctx.constant(g, n.inputs[input]);
      if (!t) return false;
      *out = t->to_int64_vector();
      return true;
    }
    if (!n.has_attr(attr)) return false;
    *out = n.attr_ints(attr);
    return true;
  }

  // s is Slice(x, start, end) over x's last axis with step 1; returns x ("" otherwise).
  std::string slice_of(const ir::Node& s, int64_t* start, int64_t* end) const {
    if (!is_op(s, "Slice") || s.inputs.empty() || !ctx.has_meta(s.inputs[0])) return "";
    size_t rank = ctx.meta(s.inputs[0]).shape.size();
    std::vector<int64_t> st, en, ax{(int64_t)rank - 1}, steps{1};
    if (!ints_of(s, 1, "starts", &st) || !ints_of(s, 2, "ends", &en)) return "";
    if ((s.inputs.size() > 3 && s.has_input(3)) || (s.inputs.size() <= 1 && s.has_attr("axes")))
      if (!ints_of(s, 3, "axes", &ax)) return "";
    if (s.inputs.size() > 4 && s.has_input(4) && !ints_of(s, 4, "steps", &steps)) return "";
    if (st.size() != 1 || en.size() != 1 || ax.size() != 1 || steps.size() != 1) return "";
    if (!is_last_axis(ax[0], rank) || steps[0] != 1) return "";
    *start = st[0];
    *end = en[0];
    return s.inputs[0];
  }

  // x whose halves along the last axis are x1 (first) and x2 (second); "" when they are not.
  std::string halves_of(const std::string& x1, const std::string& x2) const {
    const ir::Node* p1 = idx.producer_node(g, x1);
    const ir::Node* p2 = idx.producer_node(g, x2);
    if (!p1 || !p2 || !idx.single_use(x1) || !idx.single_use(x2)) return "";
    if (p1 == p2) {  // one Split
      const ir::Node& sp = *p1;
      if (!is_op(sp, "Split") || sp.outputs.size() != 2 || sp.outputs[0] != x1 ||
          sp.outputs[1] != x2 || !ctx.has_meta(sp.inputs[0]))
        return "";
      const Shape& xs = ctx.meta(sp.inputs[0]).shape;
      if (xs.empty() || !is_last_axis(sp.attr_int("axis", 0), xs.size())) return "";
      const int64_t D = xs.back();
      std::vector<int64_t> split;
      if (sp.has_input(1)) {
        const Tensor* t = ctx.constant(g, sp.inputs[1]);
        if (!t) return "";
        split = t->to_int64_vector();
      } else if (sp.has_attr("split")) {
        split = sp.attr_ints("split");
      } else {
        split = {D / 2, D - D / 2};  // equal split
      }
      if (D % 2 != 0 || split != std::vector<int64_t>{D / 2, D / 2}) return "";
      return sp.inputs[0];
    }
    int64_t s1, e1, s2, e2;
    std::string x = slice_of(*p1, &s1, &e1);
    if (x.empty() || slice_of(*p2, &s2, &e2) != x) return "";
    const int64_t D = ctx.meta(x).shape.back(), h = D / 2;
    if (D % 2 != 0 || s1 != 0 || e1 != h || s2 != h || e2 < D) return "";
    return x;
  }

  // r = Concat(Neg(x2), x1) over the last axis: returns x.
  std::string rotated(const std::string& r) const {
    const ir::Node* cat = idx.producer_node(g, r);
    if (!cat || !is_op(*cat, "Concat") || cat->inputs.size() != 2 || !ctx.has_meta(r)) return "";
    if (!is_last_axis(cat->attr_int("axis", 0), ctx.meta(r).shape.size())) return "";
    const ir::Node* neg = idx.producer_node(g, cat->inputs[0]);
    if (!neg || !is_op(*neg, "Neg") || neg->inputs.size() != 1 || !idx.single_use(cat->inputs[0]))
      return "";
    return halves_of(cat->inputs[1], neg->inputs[0]);
  }

  // The tables broadcast to x's shape as onyx.Rotary takes them.
  bool tables_fit(const std::string& x, const std::string& cos, const std::string& sin) const {
    if (!ctx.has_meta(x) || !ctx.has_meta(cos) || !ctx.has_meta(sin)) return false;
    const TensorMeta &xm = ctx.meta(x), &cm = ctx.meta(cos), &sm = ctx.meta(sin);
    if (!is_float(xm.dtype) || cm.dtype != xm.dtype || sm.dtype != xm.dtype) return false;
    if (cm.shape != sm.shape || cm.shape.empty() || cm.shape.size() > xm.shape.size()) return false;
    if (cm.shape.back() != xm.shape.back()) return false;
    size_t off = xm.shape.size() - cm.shape.size();
    for (size_t k = 0; k < cm.shape.size(); k++)
      if (cm.shape[k] != 1 && cm.shape[k] != xm.shape[off + k]) return false;
    return true;
  }

  // Tries Add node `ai` with p = x * cos and q = r * sin; returns the fused node's inputs.
  bool try_order(const ir::Node& add, int pi, std::vector<std::string>* in) const {
    const std::string p = add.inputs[pi], q = add.inputs[1 - pi];
    const ir::Node* pm = idx.producer_node(g, p);
    const ir::Node* qm = idx.producer_node(g, q);
    if (!pm || !qm || !is_op(*pm, "Mul") || !is_op(*qm, "Mul") || pm->inputs.size() != 2 ||
        qm->inputs.size() != 2 || !idx.single_use(p) || !idx.single_use(q))
      return false;
    for (int side = 0; side < 2; side++) {
      const std::string r = qm->inputs[side], sin = qm->inputs[1 - side];
      if (!idx.single_use(r)) continue;
      std::string x = rotated(r);
      if (x.empty()) continue;
      std::string cos = other_input(*pm, x);
      if (cos.empty() || cos == x) continue;
      if (!tables_fit(x, cos, sin) || ctx.meta(add.outputs[0]).shape != ctx.meta(x).shape) continue;
      *in = {x, cos, sin};
      return true;
    }
    return false;
  }
};

}  // namespace

int fuse_rotary(ir::Graph& g, PassContext& ctx) {
  RotaryMatcher m(g, ctx);
  int fused = 0;
  for (ir::Node& add : g.nodes) {
    if (!is_op(add, "Add") || add.inputs.size() != 2 || add.outputs.size() != 1 ||
        !ctx.has_meta(add.outputs[0]))
      continue;
    std::vector<std::string> in;
    if (!m.try_order(add, 0, &in) && !m.try_order(add, 1, &in)) continue;
    // In the Add's place (after x's and the tables' producers); the pattern's other nodes are
    // left for dead-node elimination.
    add = make_node(
        "Rotary", "onyx", std::move(in), {add.outputs[0]}, {},
        ctx.fresh(g, add.name.empty() ? add.outputs[0] + "/rotary" : add.name + "/rotary"));
    fused++;
  }
  if (fused) import_domain(g, "onyx");
  return fused;
}

// After swiglu_fusion, before linear_fusion and attention_fusion (the fused op feeds the scores).
ONYX_REGISTER_FUSION(fuse_rotary, "rotary_fusion", 270);

}  // namespace onyx::passes
