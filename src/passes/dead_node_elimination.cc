// dead_node_elimination.cc — removes nodes whose outputs reach no graph output, then graph inputs
// and initializers no node reads. Used by the optimization pipeline and by inference export.
#include <set>

#include "passes/pass.h"

namespace onyx::passes {

int eliminate_dead_nodes(ir::Graph& g) {
  std::set<std::string> live;
  for (auto& o : g.outputs) live.insert(o.name);
  std::vector<bool> keep(g.nodes.size(), false);
  std::vector<int> order = ir::topological_order(g);
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const ir::Node& n = g.nodes[*it];
    bool needed = false;
    for (auto& o : n.outputs) needed |= !o.empty() && live.count(o);
    if (!needed) continue;
    keep[*it] = true;
    for (auto& i : n.inputs)
      if (!i.empty()) live.insert(i);
  }
  std::vector<ir::Node> nodes;
  for (size_t i = 0; i < g.nodes.size(); i++)
    if (keep[i]) nodes.push_back(std::move(g.nodes[i]));
  int removed = (int)(g.nodes.size() - nodes.size());
  g.nodes = std::move(nodes);
  std::vector<ir::ValueInfo> inputs;
  for (auto& v : g.inputs)
    if (live.count(v.name)) inputs.push_back(v);
  g.inputs = inputs;
  std::vector<std::string> order_kept;
  for (auto& name : g.initializer_order)
    if (live.count(name))
      order_kept.push_back(name);
    else
      g.initializers.erase(name);
  g.initializer_order = order_kept;
  return removed;
}

}  // namespace onyx::passes
