// constant_folding.cc — folds every node whose outputs the planner can compute before any data
// arrives: nodes over non-variable initializers and Constant nodes, and Shape/Size of values whose
// shape is static for this signature (so PyTorch's Shape→Gather→Unsqueeze→Concat→Reshape chains
// become constant Reshape targets the fusion passes can read). The folded values become
// initializers; the nodes go. Random ops (Dropout, Random*) and trainable weights never fold.
#include "passes/pass.h"
#include "runtime/session.h"

namespace onyx::passes {

int fold_constants(ir::Graph& g, PassContext& ctx) {
  auto tmp = std::make_shared<ir::Graph>(g);
  runtime::Session s(tmp, ctx.variables);
  std::map<std::string, TensorMeta> sig;
  for (auto& v : g.inputs) {
    auto it = ctx.signature.find(v.name);
    ONYX_CHECK(it != ctx.signature.end(), "input '", v.name, "' is missing from the signature");
    sig[v.name] = it->second;
  }
  const runtime::Plan& plan = s.plan_for(sig);
  std::vector<bool> dead(g.nodes.size(), false);
  int folded = 0;
  for (size_t i = 0; i < g.nodes.size(); i++) {
    const ir::Node& n = g.nodes[i];
    bool all = !n.outputs.empty();
    for (auto& o : n.outputs)
      if (!o.empty() && !plan.constants.count(o)) all = false;
    if (!all) continue;
    for (auto& o : n.outputs)
      if (!o.empty()) g.add_initializer(o, plan.constants.at(o));
    dead[i] = true;
    folded++;
  }
  remove_nodes(g, dead);
  return folded;
}

}  // namespace onyx::passes
