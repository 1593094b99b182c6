// no_op_elimination.cc — removes nodes that do not change their input and collapses chains of
// layout ops, for one input signature (shapes are static):
//   Identity                                      → its input
//   Dropout that cannot drop (ratio 0, or training_mode absent/false), mask unused → its input
//   Cast to the input's own dtype                 → its input
//   Concat of a single input (the TorchScript exporter's torch.cat of a one-element cache list)
//                                                 → its input
//   Reshape/Flatten/Squeeze/Unsqueeze to the input's own shape → its input
//   Expand/Tile to the input's own shape, Slice keeping the whole input (positive steps, output
//   shape = input shape; the dynamo exporter writes x[:, :-1] as a full Slice of axis 0 first)
//                                                 → its input
//   reshape-like(reshape-like(x))                 → Reshape(x, final shape)
//   Transpose(Transpose(x, p), q)                 → Transpose(x, p∘q), or x when that is the
//   identity Reshape(Transpose(Reshape(x)))  merging then splitting leading dims around the
//   transpose
//                                                 → Transpose(x, q)
// A node whose output is a graph output is kept (the output keeps its name).
#include "passes/match.h"
#include "runtime/kernel.h"

namespace onyx::passes {
namespace {

bool reshape_like(const ir::Node& n) { return runtime::op_traits(n).reshape_like; }

// Dropout that is the identity whatever the run: ratio 0, or training_mode absent or false.
bool inert_dropout(const ir::Graph& g, const ir::Node& n, const PassContext& ctx, int64_t opset) {
  if (opset < 12) return n.attr_float("ratio", 0.5f) == 0.0f;
  if (n.has_input(1)) {
    auto r = ctx.scalar(g, n.inputs[1]);
    if (r && *r == 0.0) return true;
  }
  if (!n.has_input(2)) return true;  // training_mode defaults to false
  auto t = ctx.scalar(g, n.inputs[2]);
  return t && *t == 0.0;
}

// Reshape(Transpose(Reshape(src, U), p), Y) where the inner Reshape merges src's leading dims
// 0..m into one (U = [S0·…·Sm, S(m+1), …]), p keeps that merged axis first and the outer Reshape
// splits it back (Y = [S0, …, Sm, U permuted by p]): the same as Transpose(src, q). The dynamo
// exporter writes a 4-D key transpose this way (through a 3-D bmm layout). Rewrites `n` in place
// into that Transpose; the two inner nodes are left to dead-node elimination.
bool merged_transpose(ir::Graph& g, PassContext& ctx,
                      const std::unordered_map<std::string, int>& producer,
                      std::unordered_map<std::string, int>& reads, const std::vector<bool>& dead,
                      ir::Node& n) {
  auto pt = producer.find(n.inputs[0]);
  if (pt == producer.end() || dead[pt->second]) return false;
  const ir::Node& t = g.nodes[pt->second];
  if (!is_op(t, "Transpose") || reads[n.inputs[0]] != 1) return false;
  auto pr = producer.find(t.inputs[0]);
  if (pr == producer.end() || dead[pr->second]) return false;
  const ir::Node& r = g.nodes[pr->second];
  if (!is_op(r, "Reshape") || reads[t.inputs[0]] != 1) return false;
  const std::string& src = r.inputs[0];
  if (!ctx.has_meta(src) || !ctx.has_meta(t.inputs[0])) return false;
  const Shape S = ctx.meta(src).shape, U = ctx.meta(t.inputs[0]).shape,
              Y = ctx.meta(n.outputs[0]).shape;
  int64_t r1 = (int64_t)U.size();
  std::vector<int64_t> perm = t.attr_ints("perm");
  if (r1 < 2 || (int64_t)perm.size() != r1 || perm[0] != 0) return false;
  // m: the last src dim merged into U[0]
  int64_t prod = 1, m = -1;
  for (int64_t i = 0; i < (int64_t)S.size(); i++) {
    prod *= S[i];
    if (prod == U[0]) {
      m = i;
      break;
    }
    if (prod > U[0] || prod == 0) return false;
  }
  if (m < 0 || (int64_t)S.size() - (m + 1) != r1 - 1) return false;
  for (int64_t j = 1; j < r1; j++)
    if (U[j] != S[m + j]) return false;
  Shape want(S.begin(), S.begin() + m + 1);
  std::vector<int64_t> q;
  for (int64_t i = 0; i <= m; i++) q.push_back(i);
  for (int64_t j = 1; j < r1; j++) {
    want.push_back(U[perm[j]]);
    q.push_back(m + perm[j]);
  }
  if (want != Y) return false;
  reads[n.inputs[0]]--;
  reads[src]++;
  n.op_type = "Transpose";
  n.inputs = {src};
  n.attrs.clear();
  n.attrs["perm"] = ir::Attribute::of_ints(q);
  return true;
}

}  // namespace

int eliminate_no_ops(ir::Graph& g, PassContext& ctx) {
  int removed = 0;
  std::set<std::string> outputs;
  for (auto& o : g.outputs) outputs.insert(o.name);
  std::vector<int> order = ir::topological_order(g);
  std::vector<bool> dead(g.nodes.size(), false);
  std::unordered_map<std::string, int> producer;
  for (int i = 0; i < (int)g.nodes.size(); i++)
    for (auto& o : g.nodes[i].outputs)
      if (!o.empty()) producer[o] = i;
  std::unordered_map<std::string, int> reads;
  for (auto& n : g.nodes)
    for (auto& in : n.inputs)
      if (!in.empty()) reads[in]++;

  // Forwards every read of `from` to `to` (the node producing `from` becomes dead).
  auto bypass = [&](int idx, const std::string& from, const std::string& to) {
    replace_uses(g, from, to);
    reads[to] += reads[from];
    reads[from] = 0;
    dead[idx] = true;
    removed++;
  };

  for (int idx : order) {
    ir::Node& n = g.nodes[idx];
    if (!is_default_domain(n.domain) || n.outputs.empty() || n.inputs.empty() ||
        n.inputs[0].empty())
      continue;
    const std::string x = n.inputs[0];
    const std::string y = n.outputs[0];
    if (y.empty() || outputs.count(y)) continue;
    const std::string& op = n.op_type;
    bool same_meta = ctx.has_meta(x) && ctx.has_meta(y) && ctx.meta(x) == ctx.meta(y);

    if (op == "Identity") {
      bypass(idx, y, x);
    } else if (op == "Dropout") {
      bool mask_used = n.outputs.size() > 1 && !n.outputs[1].empty() &&
                       (reads[n.outputs[1]] > 0 || outputs.count(n.outputs[1]));
      if (!mask_used && inert_dropout(g, n, ctx, g.opset(""))) bypass(idx, y, x);
    } else if (op == "Cast" && same_meta) {
      bypass(idx, y, x);
    } else if (op == "Concat" && n.inputs.size() == 1 && same_meta) {
      bypass(idx, y, x);
    } else if (reshape_like(n) && same_meta) {
      bypass(idx, y, x);
    } else if ((op == "Expand" || op == "Tile") && same_meta) {
      bypass(idx, y, x);
    } else if (is_op(g, n, "", "Slice", 10) && same_meta) {
      bool forward = true;  // a negative step would reverse the axis: same shape, other order
      if (n.has_input(4)) {
        const Tensor* st = ctx.constant(g, n.inputs[4]);
        if (!st) continue;
        for (int64_t v : st->to_int64_vector()) forward &= v > 0;
      }
      if (forward) bypass(idx, y, x);
    } else if (op == "Reshape" && ctx.has_meta(y) &&
               merged_transpose(g, ctx, producer, reads, dead, n)) {
      removed++;
    } else if (reshape_like(n) && ctx.has_meta(y)) {
      auto p = producer.find(x);
      if (p == producer.end() || dead[p->second] || !reshape_like(g.nodes[p->second])) continue;
      const std::string src = g.nodes[p->second].inputs[0];
      Shape target = ctx.meta(y).shape;
      std::string shape_name = add_i64_constant(g, ctx, y + "_shape", target);
      reads[x]--;
      reads[src]++;
      n.op_type = "Reshape";
      n.inputs = {src, shape_name};
      n.attrs.clear();
      removed++;
    } else if (op == "Transpose" && ctx.has_meta(x)) {
      auto p = producer.find(x);
      if (p == producer.end() || dead[p->second]) continue;
      const ir::Node& inner = g.nodes[p->second];
      if (!is_op(inner, "Transpose")) continue;
      int64_t rank = (int64_t)ctx.meta(x).shape.size();
      std::vector<int64_t> p1 = transpose_perm(inner, rank), p2 = transpose_perm(n, rank), q(rank);
      if ((int64_t)p1.size() != rank || (int64_t)p2.size() != rank) continue;  // malformed perm
      bool identity = true;
      for (int64_t i = 0; i < rank; i++) {
        q[i] = p1[p2[i]];
        identity &= q[i] == i;
      }
      const std::string src = inner.inputs[0];
      if (identity) {
        bypass(idx, y, src);
      } else {
        reads[x]--;
        reads[src]++;
        n.inputs[0] = src;
        n.attrs["perm"] = ir::Attribute::of_ints(q);
        removed++;
      }
    }
  }
  remove_nodes(g, dead);
  return removed;
}

}  // namespace onyx::passes
