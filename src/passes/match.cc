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

std::string dropout_rng_key(const ir::Node& n) { return runtime::dropout_rng::rng_key_of(n); }

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
