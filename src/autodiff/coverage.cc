// coverage.cc — the op coverage report of a model before training (coverage.h): forward kernels,
// and gradient rules for the ops on the parameters' path to the loss, from the graph alone.
#include "autodiff/coverage.h"

#include <algorithm>
#include <functional>
#include <map>
#include <set>

#include "runtime/kernel.h"
#include "runtime/session.h"

namespace onyx::autodiff {
namespace {

bool onnx_domain(const ir::Node& n) { return n.domain.empty() || n.domain == "ai.onnx"; }

// Inputs of which the op reads only the meta (runtime/session.cc, meta_only_input): the planner
// folds the node when its other inputs are constants, so its output carries no gradient (the
// dynamo exporter's CastLike(constant, scores) masking fills).
bool meta_only_input(const ir::Node& n, size_t i) {
  if (!onnx_domain(n)) return false;
  return n.op_type == "Shape" || n.op_type == "Size" || (n.op_type == "CastLike" && i == 1);
}

DType attr_dtype(const ir::Node& n, const char* key, DType def) {
  return n.has_attr(key) ? (DType)n.attr_int(key, 0) : def;
}

// Output `i`'s dtype from the op and its inputs' dtypes (`in`); Undefined when not known (an op
// without a kernel, an unknown input). Most ops produce input 0's dtype; the exceptions are the
// ops whose output dtype is an attribute or fixed (indices, bool masks, shapes).
DType output_dtype(const ir::Node& n, size_t i, const std::function<DType(size_t)>& in) {
  if (!runtime::KernelRegistry::instance().find(n.domain, n.op_type)) return DType::Undefined;
  if (onnx_domain(n)) {
    static const std::set<std::string> int64_ops = {"Shape", "Size", "ArgMax", "ArgMin", "NonZero"};
    static const std::set<std::string> bool_ops = {
        "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Not",
        "And",   "Or",   "Xor",         "IsNaN",   "IsInf"};
    const std::string& op = n.op_type;
    if (int64_ops.count(op)) return DType::Int64;
    if (bool_ops.count(op)) return DType::Bool;
    if (op == "Cast") return attr_dtype(n, "to", DType::Undefined);
    if (op == "CastLike") return in(1);
    if (op == "Constant") {
      if (const Tensor* t = n.attr_tensor("value")) return t->dtype();
      if (n.has_attr("value_float") || n.has_attr("value_floats")) return DType::Float32;
      if (n.has_attr("value_int") || n.has_attr("value_ints")) return DType::Int64;
      return DType::Undefined;
    }
    if (op == "ConstantOfShape") {
      const Tensor* t = n.attr_tensor("value");
      return t ? t->dtype() : DType::Float32;
    }
    if (op == "RandomNormal" || op == "RandomUniform")
      return attr_dtype(n, "dtype", DType::Float32);
    if (op == "EyeLike" || op == "RandomNormalLike" || op == "RandomUniformLike" ||
        op == "Bernoulli")
      return attr_dtype(n, "dtype", in(0));
    if (op == "Multinomial") return attr_dtype(n, "dtype", DType::Int32);
    if (op == "Dropout" && i == 1) return DType::Bool;                     // the mask
    if ((op == "TopK" || op == "MaxPool") && i == 1) return DType::Int64;  // indices
    if (op == "Unique" && i >= 1) return DType::Int64;
    if (op == "OneHot") return in(2);
    if (op == "Where") return in(1);
    if (op == "LayerNormalization" && i >= 1) return attr_dtype(n, "stash_type", DType::Float32);
  } else if (n.domain == "onyx" && n.op_type == "LayerNormalization" && i >= 1) {
    return attr_dtype(n, "stash_type", DType::Float32);  // layer_norm_fusion's, as the standard op
  }
  return n.inputs.empty() ? DType::Undefined : in(0);
}

// Which values may carry a gradient, from the graph alone: values whose dtype is float or not
// known, and that the planner would not fold to a constant (initializers other than the
// parameters, Constant nodes, and what is computed only from those and from metas).
std::function<bool(const std::string&)> carries_gradient_static(
    const ir::Graph& g, const std::vector<int>& order, const std::vector<std::string>& params,
    std::shared_ptr<std::map<std::string, DType>> dtypes,
    std::shared_ptr<std::set<std::string>> constants) {
  std::set<std::string> param_set(params.begin(), params.end());
  for (auto& [name, t] : g.initializers) {
    (*dtypes)[name] = t.dtype();
    if (!param_set.count(name)) constants->insert(name);
  }
  for (auto& v : g.inputs) (*dtypes)[v.name] = v.dtype;
  std::map<std::string, DType> declared;
  for (auto* list : {&g.value_infos, &g.outputs})
    for (auto& v : *list)
      if (v.dtype != DType::Undefined) declared[v.name] = v.dtype;
  for (int idx : order) {
    const ir::Node& n = g.nodes[idx];
    auto in = [&](size_t i) {
      if (i >= n.inputs.size() || n.inputs[i].empty()) return DType::Undefined;
      auto it = dtypes->find(n.inputs[i]);
      return it == dtypes->end() ? DType::Undefined : it->second;
    };
    bool folds = !runtime::never_fold(n);
    for (size_t i = 0; i < n.inputs.size() && folds; i++)
      folds = n.inputs[i].empty() || constants->count(n.inputs[i]) || meta_only_input(n, i);
    for (size_t i = 0; i < n.outputs.size(); i++) {
      const std::string& o = n.outputs[i];
      if (o.empty()) continue;
      auto d = declared.find(o);
      (*dtypes)[o] = d != declared.end() ? d->second : output_dtype(n, i, in);
      if (folds) constants->insert(o);
    }
  }
  return [dtypes, constants](const std::string& v) {
    if (constants->count(v)) return false;
    auto it = dtypes->find(v);
    return it == dtypes->end() || it->second == DType::Undefined || is_float(it->second);
  };
}

// One entry of the summary: "'Floor' (opset 17; node 'quantize' (Floor), ...)".
std::string describe_nodes(const OpCoverage& c, const std::vector<const ir::Node*>& nodes) {
  std::string s = cat("'", c.key(), "' (opset ", c.opset, "; ");
  const size_t shown = 4;
  for (size_t i = 0; i < nodes.size() && i < shown; i++)
    s += (i ? ", " : "") + nodes[i]->describe();
  if (nodes.size() > shown) s += cat(" and ", nodes.size() - shown, " more");
  return s + ")";
}

// The report over `g` (forward + loss when `loss` is set; nothing needs a gradient without one).
void fill_ops(CoverageReport& r, const ir::Graph& g, const std::vector<bool>& on_path) {
  auto& kernels = runtime::KernelRegistry::instance();
  auto& rules = GradRegistry::instance();
  std::map<std::pair<std::string, std::string>, OpCoverage> by_op;
  for (size_t i = 0; i < g.nodes.size(); i++) {
    const ir::Node& n = g.nodes[i];
    std::string domain = n.domain == "ai.onnx" ? "" : n.domain;
    OpCoverage& c = by_op[{domain, n.op_type}];
    if (c.count == 0) {
      c.domain = domain;
      c.op_type = n.op_type;
      c.opset = g.opset(domain);
      c.forward = kernels.find(n.domain, n.op_type) != nullptr;
      c.gradient = rules.find(n.domain, n.op_type) != nullptr;
    }
    c.count++;
    c.nodes.push_back(&n);
    if (i < on_path.size() && on_path[i]) c.on_path.push_back(&n);
  }
  for (auto& [k, c] : by_op) r.ops.push_back(std::move(c));
}

}  // namespace

bool CoverageReport::ok() const {
  for (auto& c : ops)
    if (c.missing_forward() || c.missing_gradient()) return false;
  return true;
}

std::string CoverageReport::summary() const {
  std::vector<std::string> parts;
  for (auto& c : ops)
    if (c.missing_forward()) parts.push_back("forward kernel for " + describe_nodes(c, c.nodes));
  for (auto& c : ops)
    if (c.missing_gradient()) parts.push_back("gradient for " + describe_nodes(c, c.on_path));
  if (parts.empty()) return cat(ops.size(), " op types: all supported");
  std::string s = "missing: ";
  for (size_t i = 0; i < parts.size(); i++) s += (i ? ", " : "") + parts[i];
  return s;
}

CoverageReport check_coverage(const ir::Graph& forward, const GradientOptions& opts) {
  CoverageReport r;
  r.forward_nodes = (int)forward.nodes.size();
  r.parameters = trainable_parameters(forward, opts);
  // Labels the graph does not declare get the dtype the loss expects; only their name matters.
  std::map<std::string, TensorMeta> signature;
  if (opts.loss.kind != LossSpec::Kind::GraphOutput && !opts.loss.labels.empty() &&
      !forward.find_input(opts.loss.labels))
    signature[opts.loss.labels] =
        TensorMeta{opts.loss.kind == LossSpec::Kind::MSE ? DType::Float32 : DType::Int64, {}};
  LossGraph lg = build_loss_graph(forward, opts, signature);
  r.graph = lg.graph;
  r.loss = lg.loss;
  const ir::Graph& g = *r.graph;
  std::vector<int> order = ir::topological_order(g);
  auto carries = carries_gradient_static(g, order, r.parameters,
                                         std::make_shared<std::map<std::string, DType>>(),
                                         std::make_shared<std::set<std::string>>());
  GradientPaths paths = gradient_paths(g, r.parameters, r.loss, carries);
  fill_ops(r, g, paths.on_path);
  return r;
}

void require_coverage(const ir::Graph& forward, const GradientOptions& opts, bool gradients) {
  if (!gradients) {
    CoverageReport r;
    r.forward_nodes = (int)forward.nodes.size();
    fill_ops(r, forward, {});
    if (!r.ok()) throw Error(cat("the model cannot run: ", r.summary()));
    return;
  }
  CoverageReport r = check_coverage(forward, opts);
  if (!r.ok()) throw Error(cat("the model cannot be trained: ", r.summary()));
}

}  // namespace onyx::autodiff
