// token_pruning.cc — computes only the tokens a model reads out.
//
// A classifier on the [CLS] token (BERT's pooler, ViT's head) reads `hidden[:, 0]`: exported as
// Gather(hidden, 0, axis=1). Everything after the last attention that mixes tokens is per token,
// so the last layer's output projection, feed-forward, norms and residual adds — and the queries
// of its attention — are needed for that one token only, not for all T. This pass moves such a
// token selection up through per-token ops, one op per application (the pipeline repeats it until
// nothing changes):
//
//   Gather(op(a, b, ...), idx, axis=1)  →  op(Gather(a, idx', 1), Gather(b, idx', 1), ...)
//
// where idx' is the same tokens as a 1-D index (the token axis is kept, size k, so every op still
// sees rank-3 values; a scalar index gets a final Reshape dropping the axis). It applies when the
// selected value has no other reader and its producer is per token along axis 1:
//   unary elementwise ops and Dropout (its mask unused: the selected tokens get masks drawn alike,
//   not the same bits) and onyx.DropoutAdd (its y and residual treated as Add's operands), binary
//   elementwise ops whose other operands do not vary along the token axis (biases, scalars) or are
//   rank-3 token tensors (selected too), LayerNormalization over the last axis, MatMul /
//   onyx.MatMulT of a token tensor by a 2-D weight, and onyx.Attention without causal masking whose
//   mask does not vary by query (only the queries are selected; keys and values keep every token).
//   The result is the same math on fewer rows; the backward follows from the Gather's own gradient
//   (a scatter into the unselected tensor).
#include "passes/match.h"
#include "runtime/kernel.h"

namespace onyx::passes {
namespace {

using PerToken = runtime::OpTraits::PerToken;

// What to do with one input of a per-token op whose output is [B,T,...] (rank 3).
enum class Operand { Select, Keep, Bail };

Operand classify(const PassContext& ctx, const std::string& v, int64_t T) {
  if (v.empty() || !ctx.has_meta(v)) return Operand::Bail;
  const Shape& s = ctx.meta(v).shape;
  if (s.size() <= 1) return Operand::Keep;                              // bias, scalar
  if (s.size() == 2) return s[0] == 1 ? Operand::Keep : Operand::Bail;  // aligned to (T, C)
  if (s.size() == 3) return s[1] == 1 ? Operand::Keep : s[1] == T ? Operand::Select : Operand::Bail;
  return Operand::Bail;
}

}  // namespace

int prune_tokens(ir::Graph& g, PassContext& ctx) {
  GraphIndex index(g);
  int applied = 0;
  std::vector<bool> dead(g.nodes.size(), false);
  std::vector<ir::Node> added;
  const size_t n_nodes = g.nodes.size();
  for (size_t gi = 0; gi < n_nodes; gi++) {
    const ir::Node gather = g.nodes[gi];  // copy: g.nodes may grow below
    if (!is_op(gather, "Gather") || gather.inputs.size() != 2) continue;
    const std::string& x = gather.inputs[0];
    const std::string& y = gather.outputs[0];
    if (!ctx.has_meta(x) || !ctx.has_meta(y) || ctx.meta(x).shape.size() != 3) continue;
    const Shape xs = ctx.meta(x).shape;
    int64_t axis = gather.attr_int("axis", 0);
    if (axis < 0) axis += 3;
    if (axis != 1 || index.sole_consumer(x) < 0) continue;
    const Tensor* idx = ctx.constant(g, gather.inputs[1]);
    if (!idx || idx->rank() > 1 || idx->numel() == 0) continue;
    const int64_t T = xs[1];
    std::vector<int64_t> tokens = idx->to_int64_vector();
    bool ok = true;
    for (auto& t : tokens) {
      if (t < 0) t += T;
      ok &= t >= 0 && t < T;
    }
    if (!ok || (int64_t)tokens.size() >= T) continue;
    int p = index.producer(x);
    if (p < 0) continue;
    const ir::Node& op = g.nodes[p];
    if (dead[p]) continue;

    // Which inputs are selected, which are kept as they are.
    std::vector<int> select;
    bool fits = false;
    const PerToken per_token = runtime::op_traits(op).per_token;
    if (per_token == PerToken::Unary && op.inputs.size() == 1) {
      fits = classify(ctx, op.inputs[0], T) == Operand::Select;
      select = {0};
    } else if (per_token == PerToken::Binary && op.inputs.size() == 2) {
      fits = true;
      bool any = false;
      for (int i = 0; i < 2; i++) {
        Operand c = classify(ctx, op.inputs[i], T);
        if (c == Operand::Bail) fits = false;
        if (c == Operand::Select) {
          select.push_back(i);
          any = true;
        }
      }
      fits = fits && any;
    } else if (is_op(op, "Dropout")) {
      // Dropout(x)[:, tokens] and Dropout(x[:, tokens]) draw their masks differently but alike
      fits = index.outputs_unused(op) && classify(ctx, op.inputs[0], T) == Operand::Select;
      for (size_t i = 1; i < op.inputs.size(); i++)
        fits = fits && classify(ctx, op.inputs[i], T) == Operand::Keep;
      select = {0};
    } else if (is_op(op, "onyx", "DropoutAdd") && op.inputs.size() >= 2) {
      // dropout_add_fusion's Dropout(y) + residual: y and residual like Add's operands, the
      // ratio / training_mode scalars kept; masks drawn alike, as for Dropout
      fits = index.outputs_unused(op);
      for (size_t i = 0; i < op.inputs.size(); i++) {
        if (i >= 2 && op.inputs[i].empty()) continue;
        Operand c = classify(ctx, op.inputs[i], T);
        if (c == Operand::Bail || (i >= 2 && c != Operand::Keep)) fits = false;
        if (i < 2 && c == Operand::Select) select.push_back((int)i);
      }
      fits = fits && !select.empty();
    } else if (is_op(op, "LayerNormalization") || is_op(op, "onyx", "LayerNormalization")) {
      int64_t a = op.attr_int("axis", -1);
      fits = (a == -1 || a == 2) && index.outputs_unused(op) &&
             classify(ctx, op.inputs[0], T) == Operand::Select;
      select = {0};
    } else if (is_op(op, "MatMul") ||
               (is_op(op, "onyx", "MatMulT") && op.attr_int("transA", 0) == 0)) {
      fits = op.inputs.size() >= 2 && ctx.has_meta(op.inputs[1]) &&
             ctx.meta(op.inputs[1]).shape.size() == 2 &&
             classify(ctx, op.inputs[0], T) == Operand::Select;
      select = {0};
    } else if (is_op(op, "onyx", "Attention") && op.attr_int("causal", 0) == 0) {
      bool lse_unused = index.outputs_unused(op);
      bool mask_ok = true;
      if (op.inputs.size() > 3 && !op.inputs[3].empty()) {
        const Shape& ms = ctx.meta(op.inputs[3]).shape;  // broadcast to (B, H, Tq, Tk)
        mask_ok = ms.size() < 2 || ms[ms.size() - 2] == 1;
      }
      fits = lse_unused && mask_ok && classify(ctx, op.inputs[0], T) == Operand::Select;
      select = {0};
    }
    if (!fits) continue;

    // The rewrite: selected inputs, the op on k tokens, then the gather's own output shape.
    std::string idx1 = add_i64_constant(g, ctx, x + "_tokens", tokens);
    ir::Node pruned = op;
    pruned.name = op.name.empty() ? ctx.fresh(g, "token_pruned") : op.name + "/tokens";
    for (int i : select) {
      std::string name = ctx.fresh(g, op.inputs[i] + "/select_tokens");
      std::string selected = ctx.fresh(g, op.inputs[i] + "_selected");
      added.push_back(make_node("Gather", "", {op.inputs[i], idx1}, {selected},
                                {{"axis", ir::Attribute::of_int(1)}}, name));
      pruned.inputs[i] = selected;
    }
    for (size_t o = 1; o < pruned.outputs.size(); o++) pruned.outputs[o].clear();
    const bool scalar = idx->rank() == 0;
    pruned.outputs[0] = scalar ? ctx.fresh(g, x + "_pruned") : y;
    if (scalar) {  // (B, 1, C) → the gather's (B, C)
      std::string shape = add_i64_constant(g, ctx, y + "_shape", ctx.meta(y).shape);
      std::string name = ctx.fresh(g, y + "/reshape");
      ir::Node r = make_node("Reshape", "", {pruned.outputs[0], shape}, {y}, {}, name);
      added.push_back(std::move(pruned));
      added.push_back(std::move(r));
    } else {
      added.push_back(std::move(pruned));
    }
    dead[gi] = true;
    dead[p] = true;
    applied++;
  }
  if (applied == 0) return 0;
  remove_nodes(g, dead);
  for (auto& n : added) g.nodes.push_back(std::move(n));
  sort_topologically(g);
  return applied;
}

// Last of the fusions: it moves token selections through the fused ops, one op per run, repeated
// (with CSE merging equal selections) until nothing moves.
ONYX_REGISTER_FUSION_TO_FIXPOINT(prune_tokens, "token_pruning", 1000);

}  // namespace onyx::passes
