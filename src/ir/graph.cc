// graph.cc — attribute accessors, topological order, small graph utilities.
#include "ir/graph.h"

#include <queue>
#include <set>
#include <unordered_map>

namespace onyx::ir {

std::string Node::describe() const {
  return cat("node '", name, "' (", domain.empty() ? "" : domain + ".", op_type, ")");
}

int64_t Node::attr_int(const std::string& k, int64_t def) const {
  auto it = attrs.find(k);
  return it == attrs.end() ? def : it->second.i;
}
float Node::attr_float(const std::string& k, float def) const {
  auto it = attrs.find(k);
  return it == attrs.end() ? def : it->second.f;
}
std::string Node::attr_string(const std::string& k, const std::string& def) const {
  auto it = attrs.find(k);
  return it == attrs.end() ? def : it->second.s;
}
std::vector<int64_t> Node::attr_ints(const std::string& k, std::vector<int64_t> def) const {
  auto it = attrs.find(k);
  return it == attrs.end() ? def : it->second.ints;
}
std::vector<float> Node::attr_floats(const std::string& k, std::vector<float> def) const {
  auto it = attrs.find(k);
  return it == attrs.end() ? def : it->second.floats;
}
const onyx::Tensor* Node::attr_tensor(const std::string& k) const {
  auto it = attrs.find(k);
  return it == attrs.end() ? nullptr : &it->second.t;
}
int64_t Node::attr_int_required(const std::string& k) const {
  auto it = attrs.find(k);
  ONYX_CHECK(it != attrs.end(), describe(), ": required attribute '", k, "' is missing");
  return it->second.i;
}
std::vector<int64_t> Node::attr_ints_required(const std::string& k) const {
  auto it = attrs.find(k);
  ONYX_CHECK(it != attrs.end(), describe(), ": required attribute '", k, "' is missing");
  return it->second.ints;
}

int64_t Graph::opset(const std::string& domain) const {
  auto it = opsets.find(domain);
  if (it == opsets.end() && domain == "ai.onnx") it = opsets.find("");
  return it == opsets.end() ? 0 : it->second;
}

const ValueInfo* Graph::find_input(const std::string& n) const {
  for (auto& v : inputs)
    if (v.name == n) return &v;
  return nullptr;
}

void Graph::add_initializer(const std::string& n, onyx::Tensor t) {
  if (!initializers.count(n)) initializer_order.push_back(n);
  initializers[n] = std::move(t);
}

int64_t Graph::parameter_count() const {
  int64_t n = 0;
  for (auto& [k, t] : initializers)
    if (is_float(t.dtype())) n += t.numel();
  return n;
}

std::vector<int> topological_order(const Graph& g) {
  std::unordered_map<std::string, int> producer;
  for (int i = 0; i < (int)g.nodes.size(); i++)
    for (auto& o : g.nodes[i].outputs)
      if (!o.empty()) {
        ONYX_CHECK(!producer.count(o), "value '", o, "' is produced twice: by ",
                   g.nodes[producer[o]].describe(), " and by ", g.nodes[i].describe());
        producer[o] = i;
      }
  std::set<std::string> available;
  for (auto& v : g.inputs) available.insert(v.name);
  for (auto& [k, t] : g.initializers) available.insert(k);
  std::vector<int> indeg(g.nodes.size(), 0);
  std::vector<std::vector<int>> users(g.nodes.size());
  for (int i = 0; i < (int)g.nodes.size(); i++) {
    std::set<int> deps;
    for (auto& in : g.nodes[i].inputs) {
      if (in.empty() || available.count(in)) continue;
      auto it = producer.find(in);
      ONYX_CHECK(it != producer.end(), g.nodes[i].describe(), ": input '", in,
                 "' is not a graph input, an initializer, or any node's output");
      deps.insert(it->second);
    }
    indeg[i] = (int)deps.size();
    for (int d : deps) users[d].push_back(i);
  }
  // Kahn's algorithm, keeping file order among ready nodes (min-heap on index).
  std::priority_queue<int, std::vector<int>, std::greater<int>> ready;
  for (int i = 0; i < (int)g.nodes.size(); i++)
    if (indeg[i] == 0) ready.push(i);
  std::vector<int> order;
  while (!ready.empty()) {
    int i = ready.top();
    ready.pop();
    order.push_back(i);
    for (int u : users[i])
      if (--indeg[u] == 0) ready.push(u);
  }
  ONYX_CHECK(order.size() == g.nodes.size(), "graph '", g.name, "' has a cycle (",
             g.nodes.size() - order.size(), " nodes unreachable in topological order)");
  return order;
}

}  // namespace onyx::ir
