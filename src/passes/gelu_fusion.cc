// gelu_fusion.cc — fuses the exported forms of GELU into one Gelu node (domain "onyx" below opset
// 20, the standard op from 20; attribute approximate = "none" | "tanh"; kernel in
// kernels/elementwise/unary.cc, backward the GeluGrad rule of
// autodiff/gradients/elementwise.cc). Hand-written: the patterns are what torch.onnx emits for
// nn.GELU / F.gelu (erf form, BERT, ViT) and GPT-2's NewGELU (tanh form) below opset 20, and no
// library does this rewrite on our IR.
//
// Matched, from each Erf / Tanh (every intermediate value used only inside the pattern):
//   erf form:  e = Erf(Div(x, √2) | Mul(x, 1/√2) | Mul(1/√2, x))
//   tanh form: e = Tanh(Mul(u, √(2/π)) | Mul(√(2/π), u)),
//              u = Add(x, Mul(c, 0.044715)) (any operand order), c = Pow(x, 3) | Mul(x, Mul(x, x))
//              | Mul(Mul(x, x), x)
//   then  h = Add(e, 1) | Add(1, e)  and  y = 0.5 · x · h  in any association and operand order:
//         Mul(Mul(x, h), 0.5)   Mul(Mul(h, 0.5), x)   Mul(Mul(x, 0.5), h)   (and mirrored)
// → y = Gelu(x) {approximate}. Constants are checked numerically (relative 1e-4), so both float32
// roundings of the exported constants and hand-written forms match.
#include <cmath>

#include "passes/match.h"

namespace onyx::passes {
namespace {

struct GeluMatcher : FusionMatcher {
  using FusionMatcher::FusionMatcher;

  int producer(const std::string& v) const { return idx.producer(v); }
  int sole_consumer(const std::string& v) const { return idx.sole_consumer(v); }
  // Node i is free, of type op, has two inputs, and its output is read only by `reader` (or, when
  // reader < 0, by anyone: the pattern's last node).
  bool inner(int i, const char* op, int reader) const {
    if (!free(i) || !is_op(g.nodes[i], op) || g.nodes[i].inputs.size() != 2) return false;
    return reader < 0 || sole_consumer(g.nodes[i].outputs[0]) == reader;
  }
  bool is_const(const std::string& v, double want) const {
    return is_scalar_near(ctx, g, v, want, 1e-4);
  }
  // For a two-input node with one input the constant `want`: the other input, else "".
  std::string other_than_const(const ir::Node& n, double want) const {
    if (is_const(n.inputs[1], want)) return n.inputs[0];
    if (is_const(n.inputs[0], want)) return n.inputs[1];
    return "";
  }

  // erf form: Erf's input is x/√2. Returns x or "".
  std::string erf_arg(int ei, std::vector<int>& nodes) const {
    const std::string& z = g.nodes[ei].inputs[0];
    int zi = producer(z);
    if (zi < 0 || sole_consumer(z) != ei) return "";
    const ir::Node& n = g.nodes[zi];
    std::string x;
    if (inner(zi, "Div", ei) && is_const(n.inputs[1], std::sqrt(2.0)))
      x = n.inputs[0];
    else if (inner(zi, "Mul", ei))
      x = other_than_const(n, std::sqrt(0.5));
    if (!x.empty()) nodes.push_back(zi);
    return x;
  }

  // Is c = x³ (Pow(x, 3) or a Mul chain of three x), read only by `reader`?
  bool is_cube(const std::string& c, const std::string& x, int reader,
               std::vector<int>& nodes) const {
    int ci = producer(c);
    if (ci < 0 || sole_consumer(c) != reader) return false;
    const ir::Node& n = g.nodes[ci];
    if (inner(ci, "Pow", reader) && n.inputs[0] == x && is_const(n.inputs[1], 3.0)) {
      nodes.push_back(ci);
      return true;
    }
    if (!inner(ci, "Mul", reader)) return false;
    for (int k = 0; k < 2; k++) {  // Mul(x, sq) / Mul(sq, x) with sq = Mul(x, x)
      if (n.inputs[k] != x) continue;
      const std::string& sq = n.inputs[1 - k];
      int si = producer(sq);
      if (si >= 0 && inner(si, "Mul", ci) && g.nodes[si].inputs[0] == x &&
          g.nodes[si].inputs[1] == x) {
        nodes.push_back(ci);
        nodes.push_back(si);
        return true;
      }
    }
    return false;
  }

  // tanh form: Tanh's input is √(2/π)·(x + 0.044715·x³). Returns x or "".
  std::string tanh_arg(int ti, std::vector<int>& nodes) const {
    const std::string& t = g.nodes[ti].inputs[0];
    int mi = producer(t);
    if (mi < 0 || !inner(mi, "Mul", ti)) return "";
    std::string u = other_than_const(g.nodes[mi], std::sqrt(2.0 / M_PI));
    int ui = producer(u);
    if (ui < 0 || !inner(ui, "Add", mi)) return "";
    const ir::Node& add = g.nodes[ui];
    for (int k = 0; k < 2; k++) {  // Add(x, p) / Add(p, x)
      const std::string& x = add.inputs[k];
      const std::string& p = add.inputs[1 - k];
      int pi = producer(p);
      if (pi < 0 || !inner(pi, "Mul", ui)) continue;
      std::string c = other_than_const(g.nodes[pi], 0.044715);
      std::vector<int> cube;
      if (c.empty() || !is_cube(c, x, pi, cube)) continue;
      nodes.insert(nodes.end(), {mi, ui, pi});
      nodes.insert(nodes.end(), cube.begin(), cube.end());
      return x;
    }
    return "";
  }

  // y = 0.5 · x · h from h = 1 + e (node hi): returns the last Mul's index, or -1.
  int half_x_times(int hi, const std::string& x, std::vector<int>& nodes) const {
    const std::string& h = g.nodes[hi].outputs[0];
    int m1 = sole_consumer(h);
    if (m1 < 0 || !inner(m1, "Mul", -1)) return -1;
    const ir::Node& a = g.nodes[m1];
    const std::string o1 = other_input(a, h);
    if (o1 == x || is_const(o1, 0.5)) {
      // Mul(Mul(x, h), 0.5) or Mul(Mul(h, 0.5), x): one more Mul by the remaining factor.
      int m2 = sole_consumer(a.outputs[0]);
      if (m2 < 0 || !inner(m2, "Mul", -1)) return -1;
      const ir::Node& b = g.nodes[m2];
      const std::string o2 = other_input(b, a.outputs[0]);
      bool ok = o1 == x ? is_const(o2, 0.5) : o2 == x;
      if (!ok) return -1;
      nodes.insert(nodes.end(), {m1, m2});
      return m2;
    }
    // Mul(Mul(x, 0.5), h): o1 = x/2, read only here.
    int pi = producer(o1);
    if (pi < 0 || !inner(pi, "Mul", m1)) return -1;
    if (other_than_const(g.nodes[pi], 0.5) != x) return -1;
    nodes.insert(nodes.end(), {pi, m1});
    return m1;
  }

  bool try_fuse(int ei) {
    const ir::Node& e = g.nodes[ei];
    if (e.inputs.size() != 1 || e.outputs.empty()) return false;
    bool tanh_form = is_op(e, "Tanh");
    std::vector<int> nodes{ei};
    std::string x = tanh_form ? tanh_arg(ei, nodes) : erf_arg(ei, nodes);
    if (x.empty() || !ctx.has_meta(x) || !is_float(ctx.meta(x).dtype)) return false;
    // h = Add(e, 1) / Add(1, e)
    int hi = sole_consumer(e.outputs[0]);
    if (hi < 0 || !inner(hi, "Add", -1) || other_than_const(g.nodes[hi], 1.0) != e.outputs[0])
      return false;
    nodes.push_back(hi);
    int last = half_x_times(hi, x, nodes);
    if (last < 0) return false;
    for (int n : nodes)
      if (claimed[n]) return false;
    // The output must have x's shape (a broadcasting constant would change it).
    const std::string y = g.nodes[last].outputs[0];
    if (!ctx.has_meta(y) || !(ctx.meta(y) == ctx.meta(x))) return false;

    // The standard Gelu exists from opset 20; below it the same op in the onyx domain.
    const bool standard = g.opset("") >= 20;
    if (!standard) import_domain(g, "onyx");
    ir::Node gelu =
        make_node("Gelu", standard ? "" : "onyx", {x}, {y},
                  {{"approximate", ir::Attribute::of_string(tanh_form ? "tanh" : "none")}},
                  g.nodes[ei].name + "_Gelu");
    for (int n : nodes) claimed[n] = true;
    g.nodes[last] = std::move(gelu);  // the rest is left for dead-node elimination
    return true;
  }
};

}  // namespace

int fuse_gelu(ir::Graph& g, PassContext& ctx) {
  GeluMatcher m(g, ctx);
  int fused = 0;
  for (int i = 0; i < (int)g.nodes.size(); i++) {
    const ir::Node& n = g.nodes[i];
    if (!m.claimed[i] && (is_op(n, "Erf") || is_op(n, "Tanh")) && m.try_fuse(i)) fused++;
  }
  if (fused) sort_topologically(g);
  return fused;
}

ONYX_REGISTER_FUSION(fuse_gelu, "gelu_fusion", 200);

}  // namespace onyx::passes
