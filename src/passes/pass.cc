// pass.cc — PassContext, GraphIndex and the rewrite helpers of pass.h.
#include "passes/pass.h"

#include "runtime/session.h"

namespace onyx::passes {

void PassContext::refresh(const ir::Graph& g) {
  // The planner infers every static meta with the kernels' own infer functions.
  auto tmp = std::make_shared<ir::Graph>(g);
  runtime::Session s(tmp, variables);
  std::map<std::string, TensorMeta> sig;
  for (auto& v : g.inputs) {
    auto it = signature.find(v.name);
    ONYX_CHECK(it != signature.end(), "input '", v.name, "' is missing from the signature");
    sig[v.name] = it->second;
  }
  const runtime::Plan& plan = s.plan_for(sig);
  metas.clear();
  for (auto& [k, m] : plan.metas) metas[k] = m;
}

const TensorMeta& PassContext::meta(const std::string& v) const {
  auto it = metas.find(v);
  ONYX_CHECK(it != metas.end(), "pass: value '", v, "' has no static shape");
  return it->second;
}

const Tensor* PassContext::constant(const ir::Graph& g, const std::string& name) const {
  if (name.empty() || variables.count(name)) return nullptr;
  auto it = g.initializers.find(name);
  return it == g.initializers.end() ? nullptr : &it->second;
}

std::optional<double> PassContext::scalar(const ir::Graph& g, const std::string& name) const {
  const Tensor* t = constant(g, name);
  if (!t || t->numel() != 1) return std::nullopt;
  return t->get_as_double(0);
}

std::string PassContext::fresh(const ir::Graph& g, const std::string& base) {
  for (;;) {
    std::string n = cat(base, "_onyx", counter++);
    if (!metas.count(n) && !g.initializers.count(n)) return n;
  }
}

GraphIndex::GraphIndex(const ir::Graph& g) {
  for (int i = 0; i < (int)g.nodes.size(); i++) {
    for (auto& o : g.nodes[i].outputs)
      if (!o.empty()) producer_[o] = i;
    for (auto& in : g.nodes[i].inputs)
      if (!in.empty()) consumers_[in].push_back(i);
  }
  for (auto& o : g.outputs) outputs_.insert(o.name);
}

int GraphIndex::producer(const std::string& v) const {
  auto it = producer_.find(v);
  return it == producer_.end() ? -1 : it->second;
}

const std::vector<int>& GraphIndex::consumers(const std::string& v) const {
  auto it = consumers_.find(v);
  return it == consumers_.end() ? none_ : it->second;
}

int GraphIndex::uses(const std::string& v) const {
  return (int)consumers(v).size() + (outputs_.count(v) ? 1 : 0);
}

int GraphIndex::sole_consumer(const std::string& v) const {
  const std::vector<int>& c = consumers(v);
  if (c.size() != 1 || outputs_.count(v)) return -1;
  return c[0];
}

bool GraphIndex::outputs_unused(const ir::Node& n, size_t from) const {
  for (size_t o = from; o < n.outputs.size(); o++)
    if (!unused(n.outputs[o])) return false;
  return true;
}

const ir::Node* GraphIndex::producer_node(const ir::Graph& g, const std::string& v) const {
  int p = producer(v);
  return p < 0 ? nullptr : &g.nodes[p];
}

void replace_uses(ir::Graph& g, const std::string& from, const std::string& to) {
  for (auto& n : g.nodes)
    for (auto& in : n.inputs)
      if (in == from) in = to;
}

void remove_nodes(ir::Graph& g, const std::vector<bool>& dead) {
  std::vector<ir::Node> kept;
  kept.reserve(g.nodes.size());
  for (size_t i = 0; i < g.nodes.size(); i++)
    if (i >= dead.size() || !dead[i]) kept.push_back(std::move(g.nodes[i]));
  g.nodes = std::move(kept);
}

void sort_topologically(ir::Graph& g) {
  std::vector<int> order = ir::topological_order(g);
  std::vector<ir::Node> nodes;
  nodes.reserve(g.nodes.size());
  for (int i : order) nodes.push_back(std::move(g.nodes[i]));
  g.nodes = std::move(nodes);
}

int PassReport::applied(const std::string& pass) const {
  int n = 0;
  for (auto& s : stats)
    if (s.pass == pass) n += s.applied;
  return n;
}

}  // namespace onyx::passes
