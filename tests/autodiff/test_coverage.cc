// test_coverage.cc — gradient_paths (the analysis build_training_graph differentiates by) and
// check_coverage (what `onyx check` and the Trainer's constructor report) on small graphs:
//   s = x * w;  a = s + Cast(Shape(s)) + Floor(CastLike(c, s));  loss = ReduceSum(a)
// with side branches that do not need gradients (Floor of an input, ArgMax, a dead Relu).
#include <gtest/gtest.h>

#include "autodiff/coverage.h"
#include "autodiff/gradient.h"
#include "passes/match.h"
#include "runtime/kernel.h"

using namespace onyx;
using autodiff::attr_i;

namespace {

ir::Node node(const std::string& name, const std::string& op, std::vector<std::string> in,
              std::vector<std::string> out, std::map<std::string, ir::Attribute> attrs = {}) {
  return passes::make_node(op, "", std::move(in), std::move(out), std::move(attrs), name);
}

// Nodes by name: mul, shape, cast, castlike, floor_c, floor_x, argmax, relu_dead, add1, add2,
// add3, total (+ `extra` spliced in between s and add1, reading "s" and writing "s2").
ir::Graph make_graph(const std::vector<ir::Node>& extra = {},
                     const std::string& no_rule = "Floor") {
  ir::Graph g;
  g.opsets[""] = 17;
  ir::ValueInfo x;
  x.name = "x";
  x.dtype = DType::Float32;
  x.shape = {2, 3};
  x.has_shape = true;
  g.inputs.push_back(x);
  g.add_initializer("w", Tensor::zeros(DType::Float32, {2, 3}));
  g.add_initializer("c", Tensor::zeros(DType::Int64, {2, 3}));  // not a parameter
  g.nodes.push_back(node("mul", "Mul", {"x", "w"}, {"s"}));
  std::string s = "s";
  for (auto& n : extra) {
    g.nodes.push_back(n);
    s = "s2";
  }
  g.nodes.push_back(node("shape", "Shape", {s}, {"sh"}));
  g.nodes.push_back(
      node("cast", "Cast", {"sh"}, {"shf"}, {{"to", attr_i((int64_t)DType::Float32)}}));
  g.nodes.push_back(node("castlike", "CastLike", {"c", s}, {"cl"}));
  g.nodes.push_back(node("floor_c", no_rule, {"cl"}, {"fc"}));
  g.nodes.push_back(node("floor_x", no_rule, {"x"}, {"fx"}));
  g.nodes.push_back(node("argmax", "ArgMax", {s}, {"am"}, {{"keepdims", attr_i(0)}}));
  g.nodes.push_back(node("relu_dead", "Relu", {s}, {"dead"}));
  g.nodes.push_back(node("add1", "Add", {s, "shf"}, {"a1"}));
  g.nodes.push_back(node("add2", "Add", {"a1", "fc"}, {"a2"}));
  g.nodes.push_back(node("add3", "Add", {"a2", "fx"}, {"a3"}));
  g.nodes.push_back(node("total", "ReduceSum", {"a3"}, {"loss"}, {{"keepdims", attr_i(0)}}));
  ir::ValueInfo lo;
  lo.name = "loss";
  lo.dtype = DType::Float32;
  g.outputs.push_back(lo);
  ir::ValueInfo am;
  am.name = "am";
  am.dtype = DType::Int64;
  g.outputs.push_back(am);
  return g;
}

// Unary float ops: the first with a kernel but no gradient rule, and the first without a kernel
// (rules and kernels get added; the names in the expectations follow the registries).
std::string op_without_rule() {
  for (const char* op : {"Floor", "Ceil", "Round", "Sign", "Softsign", "HardSigmoid", "HardSwish"})
    if (runtime::KernelRegistry::instance().find("", op) &&
        !autodiff::GradRegistry::instance().find("", op))
      return op;
  return "";
}
std::string op_without_kernel() {
  for (const char* op : {"Hardmax", "LpNormalization", "Det"})
    if (!runtime::KernelRegistry::instance().find("", op)) return op;
  return "";
}

std::set<std::string> on_path_names(const ir::Graph& g, const autodiff::GradientPaths& p) {
  std::set<std::string> s;
  for (size_t i = 0; i < g.nodes.size(); i++)
    if (p.on_path[i]) s.insert(g.nodes[i].name);
  return s;
}

const autodiff::OpCoverage& op(const autodiff::CoverageReport& r, const std::string& type) {
  for (auto& c : r.ops)
    if (c.op_type == type) return c;
  throw Error("no op " + type);
}

TEST(GradientPaths, OnlyFloatValuesFromParametersThatReachTheLoss) {
  ir::Graph g = make_graph();
  // The builder's predicate with known dtypes: what is not float, or is constant, carries nothing.
  std::set<std::string> non_float = {"sh", "am"}, constant = {"shf", "cl", "fc"};
  auto carries = [&](const std::string& v) { return !non_float.count(v) && !constant.count(v); };
  autodiff::GradientPaths p = autodiff::gradient_paths(g, {"w"}, "loss", carries);
  EXPECT_EQ(on_path_names(g, p), (std::set<std::string>{"mul", "add1", "add2", "add3", "total"}));
  EXPECT_TRUE(p.requires_grad.count("w"));
  EXPECT_TRUE(p.requires_grad.count("dead"));  // depends on w, but never reaches the loss
  EXPECT_FALSE(p.requires_grad.count("am"));
  EXPECT_FALSE(p.requires_grad.count("fx"));
  EXPECT_EQ(p.order.size(), g.nodes.size());
  // No parameter: nothing is on the path.
  autodiff::GradientPaths none = autodiff::gradient_paths(g, {}, "loss", carries);
  EXPECT_TRUE(on_path_names(g, none).empty());
}

TEST(Coverage, SupportedGraphAndWhatNeedsGradients) {
  const std::string floor = op_without_rule();
  if (floor.empty()) GTEST_SKIP() << "every candidate op has a gradient rule now";
  ir::Graph g = make_graph({}, floor);
  autodiff::GradientOptions go;
  go.loss.output = "loss";
  autodiff::CoverageReport r = autodiff::check_coverage(g, go);
  EXPECT_TRUE(r.ok()) << r.summary();
  EXPECT_EQ(r.loss, "loss");
  EXPECT_EQ(r.parameters, (std::vector<std::string>{"w"}));
  // Floor (no rule) appears twice, neither on the path: Floor(x) reads an input, Floor(cl) a
  // constant (CastLike reads only the meta of s). Shape gives int64, ArgMax int64.
  EXPECT_EQ(op(r, floor).count, 2);
  EXPECT_TRUE(op(r, floor).on_path.empty());
  EXPECT_FALSE(op(r, floor).gradient);
  EXPECT_TRUE(op(r, "Shape").on_path.empty());
  EXPECT_TRUE(op(r, "ArgMax").on_path.empty());
  EXPECT_TRUE(op(r, "Relu").on_path.empty());
  EXPECT_EQ(op(r, "Add").on_path.size(), 3u);
  EXPECT_EQ(op(r, "Mul").on_path.size(), 1u);
  EXPECT_EQ(r.summary(), cat(r.ops.size(), " op types: all supported"));
  EXPECT_NO_THROW(autodiff::require_coverage(g, go));
}

TEST(Coverage, EveryMissingKernelAndRuleNamedAtOnce) {
  // s2 = Hardmax(Floor(s)): Floor has a kernel but no rule, Hardmax has neither (or the next
  // candidates, once they have).
  const std::string floor = op_without_rule(), hardmax = op_without_kernel();
  if (floor.empty() || hardmax.empty()) GTEST_SKIP() << "no candidate op left";
  ir::Graph g = make_graph(
      {node("quantize", floor, {"s"}, {"q"}), node("my_hardmax", hardmax, {"q"}, {"s2"})}, floor);
  autodiff::GradientOptions go;
  go.loss.output = "loss";
  autodiff::CoverageReport r = autodiff::check_coverage(g, go);
  EXPECT_FALSE(r.ok());
  EXPECT_FALSE(op(r, hardmax).forward);
  EXPECT_EQ(op(r, floor).on_path.size(), 1u);  // not the floor_c / floor_x nodes
  EXPECT_EQ(op(r, floor).on_path[0]->name, "quantize");
  const std::string missing_kernel =
      cat("forward kernel for '", hardmax, "' (opset 17; node 'my_hardmax' (", hardmax, "))");
  std::string s = r.summary();
  // Kernels first, then rules, each list in op order.
  std::string rule_floor =
      cat("gradient for '", floor, "' (opset 17; node 'quantize' (", floor, "))");
  std::string rule_hardmax =
      cat("gradient for '", hardmax, "' (opset 17; node 'my_hardmax' (", hardmax, "))");
  EXPECT_EQ(s, cat("missing: ", missing_kernel, ", ",
                   floor < hardmax ? rule_floor + ", " + rule_hardmax
                                   : rule_hardmax + ", " + rule_floor));
  try {
    autodiff::require_coverage(g, go);
    FAIL() << "require_coverage did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "the model cannot be trained: " + s);
  }
  // Evaluation only: the kernel is missing, the rules do not matter.
  try {
    autodiff::require_coverage(g, go, /*gradients=*/false);
    FAIL() << "require_coverage did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "the model cannot run: missing: " + missing_kernel);
  }
  // w frozen: nothing needs a gradient, only the kernel is missing.
  go.frozen = {"w"};
  r = autodiff::check_coverage(g, go);
  EXPECT_TRUE(r.parameters.empty());
  EXPECT_TRUE(op(r, floor).on_path.empty());
  EXPECT_EQ(r.summary(), "missing: " + missing_kernel);
}

TEST(Coverage, AppendedLossIsChecked) {
  // Cross entropy on "loss" with labels the graph does not declare: the loss's nodes are part of
  // the report (SoftmaxCrossEntropyLoss on the path, with its rule).
  const std::string floor = op_without_rule();
  if (floor.empty()) GTEST_SKIP() << "every candidate op has a gradient rule now";
  ir::Graph g = make_graph({}, floor);
  autodiff::GradientOptions go;
  go.loss.kind = autodiff::LossSpec::Kind::CrossEntropy;
  go.loss.output = "loss";  // a float output; its shape does not matter without a signature
  go.loss.labels = "labels";
  autodiff::CoverageReport r = autodiff::check_coverage(g, go);
  EXPECT_TRUE(r.ok()) << r.summary();
  EXPECT_GT((int)r.graph->nodes.size(), r.forward_nodes);
  EXPECT_EQ(op(r, "SoftmaxCrossEntropyLoss").on_path.size(), 1u);
  EXPECT_NE(r.loss, "loss");
  go.loss.output = "nope";
  EXPECT_THROW(autodiff::check_coverage(g, go), Error);
}

}  // namespace
