// decomposed_graphs.h — builds LayerNorm, GELU and Linear the way PyTorch's opset-14 export writes
// them (small ops: ReduceMean/Sub/Pow/.../Add; Div/Erf/Add/Mul/Mul; Transpose/MatMul/Add), in each
// variant layer_norm_fusion.cc, gelu_fusion.cc and linear_fusion.cc claim to match, plus the
// helpers their tests share (run a graph, compare outputs, run one pass, feeds for the real
// exports in <build>/bench-exports). Hand-written test scaffolding.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "../real_exports.h"
#include "ir/graph.h"
#include "onyx/tensor.h"
#include "passes/pass.h"
#include "runtime/session.h"

namespace onyx::fusion_test {

inline ir::Attribute ints_attr(std::vector<int64_t> v) {
  ir::Attribute a;
  a.kind = ir::Attribute::Kind::Ints;
  a.ints = std::move(v);
  return a;
}
inline ir::Attribute int_attr(int64_t v) {
  ir::Attribute a;
  a.kind = ir::Attribute::Kind::Int;
  a.i = v;
  return a;
}

inline Tensor random_tensor(Shape s, uint32_t seed, float lo = -1, float hi = 1) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(shape_numel(s));
  for (auto& x : v) x = d(g);
  return Tensor::from_vector(DType::Float32, s, v);
}

// A graph under construction: one float32 input x, initializers, nodes named op_<n>.
struct Builder {
  ir::Graph g;
  int n = 0;
  uint32_t seed = 100;
  Builder(int64_t opset = 14) { g.opsets[""] = opset; }
  std::string add(const std::string& op, std::vector<std::string> in,
                  std::map<std::string, ir::Attribute> attrs = {}) {
    ir::Node nd;
    nd.name = op + "_" + std::to_string(n++);
    nd.op_type = op;
    nd.inputs = std::move(in);
    nd.outputs = {nd.name + "_out"};
    nd.attrs = std::move(attrs);
    g.nodes.push_back(nd);
    return nd.outputs[0];
  }
  std::string scalar(float v) {  // a 0-d constant, as the exporter's Constant nodes fold to
    std::string name = "c" + std::to_string(n++);
    g.add_initializer(name, Tensor::scalar_f32(v));
    return name;
  }
  std::string weight(const std::string& name, Shape s, float lo = -1, float hi = 1) {
    g.add_initializer(name, random_tensor(s, seed++, lo, hi));
    return name;
  }
  std::string i64(std::vector<int64_t> v) {
    std::string name = "i" + std::to_string(n++);
    g.add_initializer(name, Tensor::from_vector<int64_t>(DType::Int64, {(int64_t)v.size()}, v));
    return name;
  }
  void input(const std::string& name, Shape s) {
    ir::ValueInfo vi;
    vi.name = name;
    vi.dtype = DType::Float32;
    vi.shape = s;
    vi.has_shape = true;
    g.inputs.push_back(vi);
  }
  void output(const std::string& name) {
    ir::ValueInfo vi;
    vi.name = name;
    vi.dtype = DType::Float32;
    g.outputs.push_back(vi);
  }
  // Trainable weights: every float initializer of rank >= 1 (the scalar constants are not).
  std::set<std::string> variables() const {
    std::set<std::string> v;
    for (auto& [k, t] : g.initializers)
      if (t.dtype() == DType::Float32 && t.rank() >= 1) v.insert(k);
    return v;
  }
};

// ---- LayerNorm: ReduceMean, Sub, Pow 2, ReduceMean, Add eps, Sqrt, Div, Mul gamma, Add beta
// -------
struct LayerNormSpec {
  bool square_as_mul = false;  // Mul(d, d) instead of Pow(d, 2)
  bool swapped = false;        // Add(eps, v), Mul(gamma, y), Add(beta, y)
  bool gamma = true, beta = true;
  bool positive_axes = false;  // axes = [rank-1] instead of [-1]
  bool axes_input = false;     // opset 18: axes as an input
  float eps = 1e-5f;
  int64_t opset = 14;  // the graph's default-domain opset (when not axes_input)
};

inline std::string layer_norm(Builder& b, const std::string& x, int64_t rank, int64_t C,
                              const LayerNormSpec& s, const std::string& prefix = "ln") {
  int64_t axis = s.positive_axes ? rank - 1 : -1;
  auto mean = [&](const std::string& v) {
    if (s.axes_input) return b.add("ReduceMean", {v, b.i64({axis})});
    return b.add("ReduceMean", {v}, {{"axes", ints_attr({axis})}});
  };
  auto bin = [&](const char* op, const std::string& a, const std::string& c) {
    return s.swapped ? b.add(op, {c, a}) : b.add(op, {a, c});
  };
  std::string m = mean(x);
  std::string d = b.add("Sub", {x, m});
  std::string q = s.square_as_mul ? b.add("Mul", {d, d}) : b.add("Pow", {d, b.scalar(2.f)});
  std::string v = mean(q);
  std::string sd = b.add("Sqrt", {bin("Add", v, b.scalar(s.eps))});
  std::string y = b.add("Div", {d, sd});
  if (s.gamma) y = bin("Mul", y, b.weight(prefix + ".weight", {C}, 0.5f, 1.5f));
  if (s.beta) y = bin("Add", y, b.weight(prefix + ".bias", {C}));
  return y;
}

// ---- GELU --------------------------------------------------------------------------------------
enum class GeluForm { Erf, Tanh };
enum class HalfAt {
  Last,
  WithOnePlus,
  WithX
};  // Mul(Mul(x,h),.5) / Mul(Mul(h,.5),x) / Mul(Mul(x,.5),h)
struct GeluSpec {
  GeluForm form = GeluForm::Erf;
  bool erf_mul = false;      // Mul(x, 1/√2) instead of Div(x, √2)
  bool cube_as_mul = false;  // x·(x·x) instead of Pow(x, 3)
  HalfAt half = HalfAt::Last;
  bool swapped = false;  // every commutative op with its operands the other way round
};

inline std::string gelu(Builder& b, const std::string& x, const GeluSpec& s) {
  auto bin = [&](const char* op, const std::string& a, const std::string& c) {
    return s.swapped ? b.add(op, {c, a}) : b.add(op, {a, c});
  };
  std::string e;
  if (s.form == GeluForm::Erf) {
    std::string z =
        s.erf_mul ? bin("Mul", x, b.scalar(0.70710677f)) : b.add("Div", {x, b.scalar(1.4142135f)});
    e = b.add("Erf", {z});
  } else {
    std::string cube =
        s.cube_as_mul ? bin("Mul", x, b.add("Mul", {x, x})) : b.add("Pow", {x, b.scalar(3.f)});
    std::string u = bin("Add", x, bin("Mul", cube, b.scalar(0.044715f)));
    e = b.add("Tanh", {bin("Mul", u, b.scalar(0.7978845834732056f))});
  }
  std::string h = bin("Add", e, b.scalar(1.f));
  switch (s.half) {
    case HalfAt::Last:
      return bin("Mul", bin("Mul", x, h), b.scalar(0.5f));
    case HalfAt::WithOnePlus:
      return bin("Mul", bin("Mul", h, b.scalar(0.5f)), x);
    case HalfAt::WithX:
      return bin("Mul", bin("Mul", x, b.scalar(0.5f)), h);
  }
  return "";
}

// ---- Linear: MatMul(x, Transpose(W)) + b -------------------------------------------------------
struct LinearSpec {
  bool transposed = true;  // W stored (N,K) and Transposed, as nn.Linear exports
  bool bias = true;
  bool bias_first = true;  // Add(b, y) as the exporter writes it
};

inline std::string linear(Builder& b, const std::string& x, int64_t K, int64_t N,
                          const LinearSpec& s, const std::string& prefix) {
  std::string w = s.transposed ? b.weight(prefix + ".weight", {N, K}, -0.5f, 0.5f)
                               : b.weight(prefix + ".weight", {K, N}, -0.5f, 0.5f);
  if (s.transposed) w = b.add("Transpose", {w}, {{"perm", ints_attr({1, 0})}});
  std::string y = b.add("MatMul", {x, w});
  if (!s.bias) return y;
  std::string bias = b.weight(prefix + ".bias", {N});
  return s.bias_first ? b.add("Add", {bias, y}) : b.add("Add", {y, bias});
}

// ---- running and comparing ---------------------------------------------------------------------
inline int count_ops(const ir::Graph& g, const std::string& op, const std::string& domain = "") {
  int n = 0;
  for (auto& nd : g.nodes)
    if (nd.op_type == op && nd.domain == domain) n++;
  return n;
}

inline std::map<std::string, TensorMeta> signature_of(const ir::Graph& g) {
  std::map<std::string, TensorMeta> sig;
  for (auto& in : g.inputs) sig[in.name] = {in.dtype, in.shape};
  return sig;
}

// Runs one fusion pass alone (as the pipeline does: metas refreshed first, dead nodes removed
// after); returns how many rewrites it made.
inline int run_pass(ir::Graph& g, int (*pass)(ir::Graph&, passes::PassContext&),
                    const std::set<std::string>& vars) {
  passes::PassContext ctx;
  ctx.signature = signature_of(g);
  ctx.variables = vars;
  ctx.refresh(g);
  int n = pass(g, ctx);
  passes::eliminate_dead_nodes(g);
  return n;
}

inline Tensor run(const ir::Graph& g, const std::map<std::string, Tensor>& feeds,
                  const std::string& out) {
  runtime::Session s(std::make_shared<ir::Graph>(g));
  return s.run(feeds).at(out);
}

// |a - b| <= rtol · (1e-2 + |b|) elementwise.
inline void expect_close(const Tensor& a, const Tensor& b, double rtol, const std::string& what) {
  ASSERT_EQ(a.shape(), b.shape()) << what;
  for (int64_t i = 0; i < a.numel(); i++) {
    double x = a.get_as_double(i), y = b.get_as_double(i);
    ASSERT_NEAR(x, y, rtol * (1e-2 + std::fabs(y))) << what << " element " << i;
  }
}

using onyx::test_exports::export_feeds;  // real_exports.h

}  // namespace onyx::fusion_test
