// passes/match.h — the toolkit the rewriting passes share: op tests (domain "" and "ai.onnx"
// alike, optionally an opset range of the graph), operand tests on a PassContext, and node /
// constant builders. Producer, consumer and use lookups are GraphIndex's (pass.h): sole_consumer,
// single_use, unused, outputs_unused, producer_node.
//
// Only what at least two passes need lives here; a pattern's own guards stay in its pass.
#pragma once
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "ir/graph.h"
#include "passes/pass.h"

namespace onyx::passes {

// ---- the matchers' common state ---------------------------------------------------------------
// What a pattern-matching fusion holds while it walks a graph: the graph, the pass context, the
// producer/consumer index and the nodes a fused pattern already took (`claimed`; a rewrite marks
// them). Each fusion's matcher derives from it.
struct FusionMatcher {
  ir::Graph& g;
  PassContext& ctx;
  GraphIndex idx;
  std::vector<bool> claimed;

  FusionMatcher(ir::Graph& g_, PassContext& c)
      : g(g_), ctx(c), idx(g_), claimed(g_.nodes.size(), false) {}
  bool free(int i) const { return i >= 0 && !claimed[i]; }
};

// ---- op tests ---------------------------------------------------------------------------------
// The standard ONNX domain, however a node or model spells it ("" or "ai.onnx").
inline bool is_default_domain(std::string_view domain) {
  return domain.empty() || domain == "ai.onnx";
}
inline bool same_domain(std::string_view a, std::string_view b) {
  return a == b || (is_default_domain(a) && is_default_domain(b));
}
// A standard ONNX op of type `op_type`.
inline bool is_op(const ir::Node& n, std::string_view op_type) {
  return n.op_type == op_type && is_default_domain(n.domain);
}
// An op of `domain` ("" / "ai.onnx" for the standard ones, "onyx", ...) and type `op_type`.
inline bool is_op(const ir::Node& n, std::string_view domain, std::string_view op_type) {
  return n.op_type == op_type && same_domain(n.domain, domain);
}
// ... in a graph importing `domain` at an opset in [min_opset, max_opset] (ir::Graph::opset: 0
// when the domain is not imported).
inline bool is_op(const ir::Graph& g, const ir::Node& n, std::string_view domain,
                  std::string_view op_type, int64_t min_opset,
                  int64_t max_opset = std::numeric_limits<int64_t>::max()) {
  if (!is_op(n, domain, op_type)) return false;
  int64_t v = g.opset(std::string(domain));
  return v >= min_opset && v <= max_opset;
}

// A Transpose's permutation: its perm attribute, else the reversal of `rank` axes (the default).
std::vector<int64_t> transpose_perm(const ir::Node& n, size_t rank);
// A standard Transpose with one input permuting by `perm` (an absent perm is the reversal).
bool is_transpose(const ir::Node& n, const std::vector<int64_t>& perm);

// A ReduceMean with keepdims = 1 over exactly the last axis of its input (axes as attribute, or
// as a constant input from opset 18), whose input has a static meta (LayerNorm, RMSNorm).
bool reduces_last_axis(const ir::Graph& g, const PassContext& ctx, const ir::Node& n);

// ---- operands ---------------------------------------------------------------------------------
// The other input of a two-input node one of whose inputs is `v`; "" when n has not two inputs
// or `v` is neither (Add(v, v) gives v).
std::string other_input(const ir::Node& n, const std::string& v);
// Has a static meta of dtype float32.
inline bool is_f32(const PassContext& ctx, const std::string& v) {
  return !v.empty() && ctx.has_meta(v) && ctx.meta(v).dtype == DType::Float32;
}
// `v` is a one-element constant within `rel_tol` (relative) of `want`.
bool is_scalar_near(const PassContext& ctx, const ir::Graph& g, const std::string& v, double want,
                    double rel_tol);
// The Dropout identity of a Dropout node (or of a node carrying a fused dropout), as the kernels
// draw it (kernels/cpu/dropout_rng.h rng_key_of): its rng_key attribute, else its first output's
// name. A fused op or recomputed clone carrying this key draws the same mask.
std::string dropout_rng_key(const ir::Node& n);

// ---- builders ---------------------------------------------------------------------------------
ir::Node make_node(const std::string& op_type, const std::string& domain,
                   std::vector<std::string> inputs, std::vector<std::string> outputs,
                   std::map<std::string, ir::Attribute> attrs = {}, const std::string& name = "");
// A new 1-D int64 initializer (a Reshape target, Gather indices) under a fresh name from `base`
// (PassContext::fresh); returns the name.
std::string add_i64_constant(ir::Graph& g, PassContext& ctx, const std::string& base,
                             const std::vector<int64_t>& values);
// Declares `domain` in the graph's opsets (at `version`) unless it already is: passes call it
// when they emit ops of a domain the model does not import (onyx).
void import_domain(ir::Graph& g, const std::string& domain, int64_t version = 1);

}  // namespace onyx::passes
