// recompute.cc — gradient checkpointing on the training graph (`gradient_checkpointing: true`).
//
// Per transformer layer, as Hugging Face's gradient_checkpointing does: the values a layer
// receives from outside (the residual stream entering it, the attention mask, its weights) are
// kept for backward; every activation computed inside the layer that the backward reads is
// recomputed from them just before the layer's backward starts, by clones of the layer's forward
// nodes. The originals then die during the forward, so at any time at most one layer's
// activations are alive in backward. Layers are recognized from node names as exporters write
// them ("/bert/layers.3/attn/...", "h.2", "blocks.0", "layer.5"); nodes outside any layer
// (embeddings, final norm, head, loss) keep their activations.
//
// Clones carry the attribute onyx_recompute=1 (so common-subexpression elimination does not merge
// them back into the originals) and Dropout clones carry rng_key = the original's output name, so
// the recomputed mask equals the forward's.
#include <regex>

#include "passes/match.h"

namespace onyx::passes {
namespace {

// Layer index from a node name, -1 when the node is in no numbered layer.
int layer_of(const std::string& name) {
  static const std::regex re(R"((?:^|[/.])(?:layers?|h|blocks?)[._](\d+)(?:[/.]|$))");
  std::smatch m;
  if (!std::regex_search(name, m, re)) return -1;
  return std::stoi(m[1].str());
}

}  // namespace

int recompute_layers(ir::Graph& g, int n_forward, RecomputeStats* stats) {
  ONYX_CHECK(n_forward >= 0 && n_forward <= (int)g.nodes.size(), "recompute: bad forward count");
  std::map<int, std::vector<int>> layers;  // layer -> forward node indices (graph order)
  std::unordered_map<std::string, int> producer;
  for (int i = 0; i < n_forward; i++) {
    for (auto& o : g.nodes[i].outputs)
      if (!o.empty()) producer[o] = i;
    int l = layer_of(g.nodes[i].name);
    if (l >= 0) layers[l].push_back(i);
  }
  std::vector<int> layer_idx(n_forward, -1);
  for (auto& [l, nodes] : layers)
    for (int i : nodes) layer_idx[i] = l;

  // Inserted clones, keyed by the index of the backward node they must precede.
  std::map<int, std::vector<ir::Node>> inserts;
  int cloned = 0;
  for (auto& [l, nodes] : layers) {
    // Values of this layer that the backward reads.
    std::set<std::string> needed;
    int first_consumer = (int)g.nodes.size();
    for (int j = n_forward; j < (int)g.nodes.size(); j++)
      for (auto& in : g.nodes[j].inputs) {
        auto p = producer.find(in);
        if (in.empty() || p == producer.end() || layer_idx[p->second] != l) continue;
        needed.insert(in);
        first_consumer = std::min(first_consumer, j);
      }
    if (needed.empty()) continue;
    // Ancestors of the needed values inside the layer.
    std::set<int> closure;
    std::vector<std::string> stack(needed.begin(), needed.end());
    while (!stack.empty()) {
      std::string v = stack.back();
      stack.pop_back();
      auto p = producer.find(v);
      if (p == producer.end() || layer_idx[p->second] != l || closure.count(p->second)) continue;
      closure.insert(p->second);
      for (auto& in : g.nodes[p->second].inputs)
        if (!in.empty()) stack.push_back(in);
    }
    std::map<std::string, std::string> rename;
    for (int i : closure)
      for (auto& o : g.nodes[i].outputs)
        if (!o.empty()) rename[o] = o + "_recompute";
    std::vector<ir::Node>& out = inserts[first_consumer];
    for (int i : closure) {  // std::set iterates in graph order, which is topological
      ir::Node c = g.nodes[i];
      // the clone draws the original's mask: the original's identity, before renaming
      if (is_op(c, "Dropout") && !c.outputs.empty())
        c.attrs["rng_key"] = ir::Attribute::of_string(dropout_rng_key(c));
      c.attrs["onyx_recompute"] = ir::Attribute::of_int(1);
      c.name += "/recompute";
      for (auto& in : c.inputs) {
        auto r = rename.find(in);
        if (r != rename.end()) in = r->second;
      }
      for (auto& o : c.outputs)
        if (!o.empty()) o = rename.at(o);
      out.push_back(std::move(c));
      cloned++;
    }
    for (int j = n_forward; j < (int)g.nodes.size(); j++)
      for (auto& in : g.nodes[j].inputs) {
        auto r = rename.find(in);
        if (r != rename.end() && needed.count(in)) in = r->second;
      }
    if (stats) stats->layers++;
  }
  if (cloned == 0) return 0;
  std::vector<ir::Node> nodes;
  nodes.reserve(g.nodes.size() + cloned);
  for (int j = 0; j < (int)g.nodes.size(); j++) {
    auto it = inserts.find(j);
    if (it != inserts.end())
      for (auto& c : it->second) nodes.push_back(std::move(c));
    nodes.push_back(std::move(g.nodes[j]));
  }
  g.nodes = std::move(nodes);
  if (stats) stats->nodes_cloned += cloned;
  return cloned;
}

}  // namespace onyx::passes
