// common_subexpression.cc — merges nodes that compute the same thing: same domain, op, attributes
// and inputs. Small constants with equal dtype, shape and bytes are merged first, so the many
// scalar Constant nodes an exporter emits (1.0, sqrt(2), axes [-1], ...) stop making equal
// expressions look different. Random ops and onyx.AccumulateGrad (writes into a bound buffer)
// never merge; a node whose output is a graph output is kept.
#include <cstring>
#include <unordered_map>

#include "passes/pass.h"
#include "runtime/session.h"

namespace onyx::passes {
namespace {

bool never_merge(const ir::Node& n) { return runtime::never_fold(n) || n.outputs.empty(); }

std::string tensor_key(const Tensor& t) {
  std::string k = cat((int)t.dtype(), shape_str(t.shape()), ":");
  k.append(static_cast<const char*>(t.raw()), t.nbytes());
  return k;
}

std::string attr_key(const ir::Attribute& a) {
  using K = ir::Attribute::Kind;
  std::string k = cat((int)a.kind, "=");
  switch (a.kind) {
    case K::Float:
      k += cat(a.f);
      break;
    case K::Int:
      k += cat(a.i);
      break;
    case K::String:
      k += a.s;
      break;
    case K::Tensor:
      k += tensor_key(a.t);
      break;
    case K::Floats:
      for (float f : a.floats) k += cat(f, ",");
      break;
    case K::Ints:
      for (int64_t i : a.ints) k += cat(i, ",");
      break;
    case K::Strings:
      for (auto& s : a.strings) k += s + "\x1f";
      break;
    case K::Tensors:
      for (auto& t : a.tensors) k += tensor_key(t) + "\x1f";
      break;
    default:
      return "";  // subgraphs: not compared
  }
  return k;
}

}  // namespace

int eliminate_common_subexpressions(ir::Graph& g, PassContext& ctx) {
  int merged = 0;
  // 1. Equal small constants.
  std::unordered_map<std::string, std::string> by_content;
  std::unordered_map<std::string, std::string> rename;
  for (auto& name : g.initializer_order) {
    const Tensor* t = ctx.constant(g, name);
    if (!t || t->numel() > 64) continue;
    auto [it, fresh] = by_content.emplace(tensor_key(*t), name);
    if (!fresh) rename[name] = it->second;
  }
  std::set<std::string> outputs;
  for (auto& o : g.outputs) outputs.insert(o.name);
  // 2. Equal nodes, in topological order so inputs are already canonical.
  std::unordered_map<std::string, int> seen;  // key -> the first such node
  std::vector<int> order = ir::topological_order(g);
  std::vector<bool> dead(g.nodes.size(), false);
  for (int idx : order) {
    ir::Node& n = g.nodes[idx];
    for (auto& in : n.inputs) {
      auto r = rename.find(in);
      if (r != rename.end()) in = r->second;
    }
    if (never_merge(n)) continue;
    bool is_output = false, has_subgraph = false;
    for (auto& o : n.outputs) is_output |= outputs.count(o) != 0;
    std::string key = n.domain + "|" + n.op_type + "|";
    for (auto& in : n.inputs) key += in + "\x1e";
    key += "|";
    for (auto& [an, a] : n.attrs) {
      std::string ak = attr_key(a);
      if (ak.empty()) has_subgraph = true;
      key += an + ":" + ak + "\x1e";
    }
    key += cat("|", n.outputs.size());
    if (has_subgraph) continue;
    auto it = seen.find(key);
    if (it == seen.end() || is_output) {
      if (it == seen.end()) seen[key] = idx;
      continue;
    }
    const ir::Node& first = g.nodes[it->second];
    bool same_arity = true;
    for (size_t i = 0; i < n.outputs.size(); i++)
      if (!n.outputs[i].empty() && first.outputs[i].empty()) same_arity = false;
    if (!same_arity) continue;
    for (size_t i = 0; i < n.outputs.size(); i++)
      if (!n.outputs[i].empty()) rename[n.outputs[i]] = first.outputs[i];
    dead[idx] = true;
    merged++;
  }
  for (auto& n : g.nodes)
    for (auto& in : n.inputs) {
      auto r = rename.find(in);
      if (r != rename.end()) in = r->second;
    }
  remove_nodes(g, dead);
  return merged;
}

}  // namespace onyx::passes
