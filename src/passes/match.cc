// match.cc — see match.h.
#include "passes/match.h"

#include <cmath>

#include "kernels/cpu/dropout_rng.h"

namespace onyx::passes {

std::vector<int64_t> transpose_perm(const ir::Node& n, size_t rank) {
  if (n.has_attr("perm")) return n.attr_ints("perm");
  std::vector<int64_t> p;
  for (int64_t i = (int64_t)rank - 1; i >= 0; i--) p.push_back(i);
  return p;
}

bool is_transpose(const ir::Node& n, const std::vector<int64_t>& perm) {
  return is_op(n, "Transpose") && n.inputs.size() == 1 && transpose_perm(n, perm.size()) == perm;
}

bool reduces_last_axis(const ir::Graph& g, const PassContext& ctx, const ir::Node& n) {
  if (!is_op(n, "ReduceMean") || n.inputs.empty() || !ctx.has_meta(n.inputs[0])) return false;
  if (n.attr_int("keepdims", 1) == 0) return false;
  std::vector<int64_t> axes;
  if (n.has_input(1)) {  // opset 18: axes is an input
    const Tensor* t = ctx.constant(g, n.inputs[1]);
    if (!t) return false;
    for (int64_t i = 0; i < t->numel(); i++) axes.push_back((int64_t)t->get_as_double(i));
  } else {
    axes = n.attr_ints("axes");
  }
  int64_t rank = (int64_t)ctx.meta(n.inputs[0]).shape.size();
  if (axes.size() != 1 || rank < 1) return false;
  int64_t a = axes[0] < 0 ? axes[0] + rank : axes[0];
  return a == rank - 1;
}

std::string other_input(const ir::Node& n, const std::string& v) {
  if (n.inputs.size() != 2) return "";
  if (n.inputs[0] == v) return n.inputs[1];
  if (n.inputs[1] == v) return n.inputs[0];
  return "";
}

bool is_scalar_near(const PassContext& ctx, const ir::Graph& g, const std::string& v, double want,
                    double rel_tol) {
  auto s = ctx.scalar(g, v);
  return s && std::fabs(*s - want) <= rel_tol * std::fabs(want);
}

std::string dropout_rng_key(const ir::Node& n) { return kernels::dropout_rng::rng_key_of(n); }

ir::Node make_node(const std::string& op_type, const std::string& domain,
                   std::vector<std::string> inputs, std::vector<std::string> outputs,
                   std::map<std::string, ir::Attribute> attrs, const std::string& name) {
  ir::Node n;
  n.name = name;
  n.op_type = op_type;
  n.domain = domain;
  n.inputs = std::move(inputs);
  n.outputs = std::move(outputs);
  n.attrs = std::move(attrs);
  return n;
}

std::string add_i64_constant(ir::Graph& g, PassContext& ctx, const std::string& base,
                             const std::vector<int64_t>& values) {
  std::string name = ctx.fresh(g, base);
  g.add_initializer(name,
                    Tensor::from_vector<int64_t>(DType::Int64, {(int64_t)values.size()}, values));
  return name;
}

void import_domain(ir::Graph& g, const std::string& domain, int64_t version) {
  if (!g.opsets.count(domain)) g.opsets[domain] = version;
}

}  // namespace onyx::passes
