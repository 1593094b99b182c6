// pipeline.cc — the order passes run in, before and after autodiff, and their report.
//
// Before autodiff (forward + loss, specialized to one signature): fold constants and shape
// subgraphs, remove no-ops, merge common subexpressions, then the fusions, each followed by dead-
// node elimination. Fusing before autodiff means the backward is built from the fused ops' own
// gradient rules (LayerNormGrad, GeluGrad, ...), so the backward is fused too. After autodiff the
// whole training graph gets no-op elimination, CSE and dead-node elimination again, then (bf16)
// mixed_precision and gradient_into_buffer (parameter gradients written by their producers, no
// AccumulateGrad copy).
//
// Debugging a pattern: ONYX_PASS_DUMP=<fusion name> prints the forward graph as that fusion sees
// it (one node per line, with the static shapes) to stderr; ONYX_PASS_DUMP=mixed_precision and
// =gradient_into_buffer print the training graph before those two (the second: after the first).
#include <algorithm>
#include <cstdlib>
#include <iostream>

#include "passes/pass.h"

namespace onyx::passes {
namespace {

void run_pass(const char* name, ir::Graph& g, PassContext& ctx, PassReport* report,
              const std::function<int(ir::Graph&, PassContext&)>& fn) {
  ctx.refresh(g);
  int n = 0;
  try {
    n = fn(g, ctx);
  } catch (const Error& e) {
    throw Error(cat("pass ", name, ": ", e.what()));
  }
  if (report) report->stats.push_back({name, n});
}

// Dead-node elimination drops unused initializers; trainable weights must stay (each gets a
// gradient output, zeros when it no longer reaches the loss).
void eliminate_dead(ir::Graph& g, const std::set<std::string>& variables) {
  std::map<std::string, Tensor> keep;
  for (auto& v : variables) {
    auto it = g.initializers.find(v);
    if (it != g.initializers.end()) keep[v] = it->second;
  }
  eliminate_dead_nodes(g);
  for (auto& [name, t] : keep)
    if (!g.initializers.count(name)) g.add_initializer(name, t);
}

void cleanup(ir::Graph& g, PassContext& ctx, PassReport* report) {
  run_pass("eliminate_no_ops", g, ctx, report, eliminate_no_ops);
  run_pass("eliminate_common_subexpressions", g, ctx, report, eliminate_common_subexpressions);
  int before = (int)g.nodes.size();
  eliminate_dead(g, ctx.variables);
  if (report) report->stats.push_back({"eliminate_dead_nodes", before - (int)g.nodes.size()});
}

// ONYX_PASS_DUMP: the graph before fusion `name`, one node per line with its values' metas.
void dump_before(const char* name, const ir::Graph& g, PassContext& ctx) {
  static const char* want = std::getenv("ONYX_PASS_DUMP");
  if (!want || std::string(want) != name) return;
  ctx.refresh(g);
  auto val = [&](const std::string& v) {
    if (v.empty()) return std::string("-");
    if (!ctx.has_meta(v)) return v;
    const TensorMeta& m = ctx.meta(v);
    return cat(v, ":", dtype_name(m.dtype), shape_str(m.shape));
  };
  std::cerr << "---- graph before " << name << " (" << g.nodes.size() << " nodes)\n";
  for (const ir::Node& n : g.nodes) {
    std::cerr << (n.domain.empty() ? "" : n.domain + ".") << n.op_type << " " << n.name << ":";
    for (auto& i : n.inputs) std::cerr << " " << val(i);
    std::cerr << " ->";
    for (auto& o : n.outputs) std::cerr << " " << val(o);
    std::cerr << "\n";
  }
}

}  // namespace

static std::vector<Pass>& fusion_registry() {
  static std::vector<Pass> passes;
  return passes;
}

FusionRegistration::FusionRegistration(Pass p) {
  auto& v = fusion_registry();
  for (auto& q : v)
    ONYX_CHECK(std::string(q.name) != p.name, "fusion pass '", p.name, "' registered twice");
  // Stable by order, so equal orders keep registration order (deterministic per build).
  auto at = std::upper_bound(v.begin(), v.end(), p.order,
                             [](int o, const Pass& q) { return o < q.order; });
  v.insert(at, std::move(p));
}

const std::vector<Pass>& fusion_passes() { return fusion_registry(); }

const Pass& fusion_pass(const std::string& name) {
  std::string names;
  for (auto& p : fusion_registry()) {
    if (name == p.name) return p;
    names += cat(names.empty() ? "" : ", ", p.name);
  }
  throw Error(cat("no fusion pass '", name, "' (registered: ", names, ")"));
}

ir::Graph optimize_forward(const ir::Graph& src, const std::map<std::string, TensorMeta>& signature,
                           const std::set<std::string>& variables, const OptimizeOptions& opts,
                           PassReport* report) {
  ir::Graph g = src;
  PassContext ctx;
  ctx.signature = signature;
  ctx.variables = variables;
  if (report) report->nodes_before = (int)g.nodes.size();
  run_pass("fold_constants", g, ctx, report, fold_constants);
  cleanup(g, ctx, report);
  if (opts.fusions) {
    for (auto& p : fusion_passes()) {
      if (!opts.token_pruning && std::string(p.name) == "token_pruning") continue;
      dump_before(p.name, g, ctx);
      if (!p.until_fixpoint) {
        run_pass(p.name, g, ctx, report, p.run);
        eliminate_dead(g, variables);
        continue;
      }
      PassReport round;
      for (int i = 0; i < 100; i++) {
        round.stats.clear();
        run_pass(p.name, g, ctx, &round, p.run);
        if (report) report->stats.push_back(round.stats.back());
        if (round.stats.back().applied == 0) break;
        run_pass("eliminate_common_subexpressions", g, ctx, nullptr,
                 eliminate_common_subexpressions);
        eliminate_dead(g, variables);
      }
    }
    cleanup(g, ctx, report);
  }
  sort_topologically(g);
  if (report) report->nodes_after = (int)g.nodes.size();
  return g;
}

void optimize_training(ir::Graph& g, const std::map<std::string, TensorMeta>& signature,
                       const std::set<std::string>& variables, const OptimizeOptions& opts,
                       PassReport* report) {
  PassContext ctx;
  ctx.signature = signature;
  ctx.variables = variables;
  run_pass("fold_constants", g, ctx, report, fold_constants);
  cleanup(g, ctx, report);
  if (opts.fusions && opts.bf16) {
    dump_before("mixed_precision", g, ctx);
    MixedPrecisionStats mp;
    run_pass("mixed_precision", g, ctx, report, [&](ir::Graph& gg, PassContext& c) {
      return convert_to_mixed_precision(gg, c, opts.bf16_outputs, opts.bf16_weights, &mp);
    });
    if (report) report->mixed_precision = mp;
  }
  dump_before("gradient_into_buffer", g, ctx);  // (the graph after mixed_precision)
  if (opts.fusions && opts.gradient_into_buffer)
    run_pass("gradient_into_buffer", g, ctx, report, write_gradients_into_buffer);
  sort_topologically(g);
}

}  // namespace onyx::passes
