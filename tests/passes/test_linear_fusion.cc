// tests/passes/test_linear_fusion.cc — passes/linear_fusion.cc: exported nn.Linear
// (Transpose/MatMul/Add, tests/passes/decomposed_graphs.h) becomes one onyx.MatMulT(X, W, b) —
// op counts before and after, equal outputs through runtime::Session within 1e-5 — MatMuls the
// pass must leave alone stay. Then one small graph with all three decomposed patterns
// (LayerNorm → Linear → GELU → Linear) through passes::optimize_forward: 1 LayerNormalization,
// 1 Gelu, 2 MatMulT, equal outputs and equal parameter gradients against the unfused graph. Then
// the real opset-14 exports in <build>/bench-exports: 24 (bert-mini), 25 (gpt2-tiny, with the tied
// LM head) and 36 (vit-tiny) fused linears, and the same output with and without fusions.
#include <gtest/gtest.h>

#include <filesystem>

#include "../real_exports.h"
#include "autodiff/gradient.h"
#include "decomposed_graphs.h"
#include "ir/onnx_io.h"

using namespace onyx;
using namespace onyx::fusion_test;

namespace {

struct Variant {
  const char* name;
  LinearSpec spec;
  Shape x;
};

std::vector<Variant> variants() {
  std::vector<Variant> v;
  LinearSpec s;
  v.push_back({"exported_bias_first", s, {2, 5, 12}});
  s.bias_first = false;
  v.push_back({"bias_second", s, {2, 5, 12}});
  s.bias = false;
  v.push_back({"transposed_no_bias", s, {2, 5, 12}});
  s = LinearSpec();
  s.transposed = false;
  v.push_back({"plain_weight_with_bias", s, {2, 5, 12}});
  s = LinearSpec();
  v.push_back({"x_2d", s, {7, 12}});
  v.push_back({"x_4d", s, {2, 3, 4, 12}});
  return v;
}

}  // namespace

TEST(LinearFusion, FusesEachVariantWithEqualNumerics) {
  for (auto& v : variants()) {
    SCOPED_TRACE(v.name);
    Builder b;
    b.input("x", v.x);
    b.output(linear(b, "x", 12, 9, v.spec, "fc"));
    ir::Graph g = b.g, f = b.g;
    EXPECT_EQ(count_ops(g, "MatMul"), 1);
    ASSERT_EQ(run_pass(f, passes::fuse_linear, b.variables()), 1);
    ASSERT_EQ(f.nodes.size(), 1u) << "no Transpose, MatMul or Add left";
    const ir::Node& n = f.nodes[0];
    EXPECT_EQ(n.op_type, "MatMulT");
    EXPECT_EQ(n.domain, "onyx");
    EXPECT_EQ(n.attr_int("transB", 0), v.spec.transposed ? 1 : 0);
    EXPECT_EQ(n.inputs.size(), v.spec.bias ? 3u : 2u);
    EXPECT_EQ(n.inputs[1], "fc.weight");
    std::map<std::string, Tensor> feeds{{"x", random_tensor(v.x, 13)}};
    std::string out = g.outputs[0].name;
    expect_close(run(f, feeds, out), run(g, feeds, out), 1e-5, v.name);
  }
}

TEST(LinearFusion, LeavesOtherMatMulsAlone) {
  {  // plain MatMul(x, W) without a bias: nothing to gain
    Builder b;
    b.input("x", {2, 5, 12});
    LinearSpec s;
    s.transposed = s.bias = false;
    b.output(linear(b, "x", 12, 9, s, "fc"));
    EXPECT_EQ(run_pass(b.g, passes::fuse_linear, b.variables()), 0);
  }
  {  // batched right operand (attention scores): not a weight
    Builder b;
    b.input("q", {2, 3, 5, 4});
    b.input("k", {2, 3, 4, 5});
    std::string y = b.add("MatMul", {"q", "k"});
    b.output(b.add("Add", {b.weight("bias", {5}), y}));
    EXPECT_EQ(run_pass(b.g, passes::fuse_linear, b.variables()), 0);
  }
  {  // the MatMul output is read twice: the transpose fuses, the bias Add stays
    Builder b;
    b.input("x", {2, 5, 12});
    LinearSpec s;
    std::string y = linear(b, "x", 12, 9, s, "fc");
    b.output(y);
    std::string mm = b.g.nodes[1].outputs[0];  // Transpose, MatMul, Add
    b.output(mm);
    ir::Graph f = b.g;
    EXPECT_EQ(run_pass(f, passes::fuse_linear, b.variables()), 1);
    EXPECT_EQ(count_ops(f, "MatMulT", "onyx"), 1);
    EXPECT_EQ(count_ops(f, "Add"), 1);
    std::map<std::string, Tensor> feeds{{"x", random_tensor({2, 5, 12}, 13)}};
    expect_close(run(f, feeds, y), run(b.g, feeds, y), 1e-5, "bias output");
    expect_close(run(f, feeds, mm), run(b.g, feeds, mm), 1e-5, "matmul output");
  }
  {  // a (1, N) bias is not 1-D: stays an Add
    Builder b;
    b.input("x", {2, 5, 12});
    LinearSpec s;
    s.bias = false;
    std::string y = linear(b, "x", 12, 9, s, "fc");
    b.output(b.add("Add", {y, b.weight("b2", {1, 9})}));
    ir::Graph f = b.g;
    EXPECT_EQ(run_pass(f, passes::fuse_linear, b.variables()), 1);
    EXPECT_EQ(count_ops(f, "Add"), 1);
    EXPECT_EQ(f.nodes[0].inputs.size() + f.nodes[1].inputs.size(), 4u);
  }
}

// ---- all three patterns together, forward and backward --------------------------------------

namespace {

// x (2,6,16) → LayerNorm → Linear 16→32 → GELU (erf) → Linear 32→16 → + x → ReduceSum → loss
ir::Graph block() {
  Builder b;
  b.input("x", {2, 6, 16});
  std::string h = layer_norm(b, "x", 3, 16, LayerNormSpec(), "ln");
  h = linear(b, h, 16, 32, LinearSpec(), "fc1");
  h = gelu(b, h, GeluSpec());
  h = linear(b, h, 32, 16, LinearSpec(), "fc2");
  h = b.add("Add", {"x", h});
  std::string w = b.weight("probe", {2, 6, 16});  // fixed random weights of the output (a constant)
  b.output(b.add("ReduceSum", {b.add("Mul", {h, w})}, {{"keepdims", int_attr(0)}}));
  return b.g;
}

std::set<std::string> block_params() {
  return {"ln.weight", "ln.bias", "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"};
}

}  // namespace

TEST(LinearFusion, AllThreePatternsFuseInTheForwardPipeline) {
  ir::Graph g = block();
  std::map<std::string, Tensor> feeds{{"x", random_tensor({2, 6, 16}, 21, -2, 2)}};
  auto sig = signature_of(g);
  auto vars = block_params();
  passes::PassReport report;
  ir::Graph fused = passes::optimize_forward(g, sig, vars, {}, &report);
  passes::OptimizeOptions plain;
  plain.fusions = false;
  ir::Graph unfused = passes::optimize_forward(g, sig, vars, plain, nullptr);

  EXPECT_EQ(report.applied("layer_norm_fusion"), 1);
  EXPECT_EQ(report.applied("gelu_fusion"), 1);
  EXPECT_EQ(report.applied("linear_fusion"), 2);
  EXPECT_EQ(count_ops(unfused, "MatMul"), 2);
  EXPECT_EQ(count_ops(unfused, "Transpose"), 2);
  EXPECT_EQ(count_ops(unfused, "ReduceMean"), 2);
  EXPECT_EQ(count_ops(unfused, "Erf"), 1);
  EXPECT_EQ(count_ops(fused, "LayerNormalization", "onyx"), 1);  // an opset-14 graph
  EXPECT_EQ(count_ops(fused, "Gelu", "onyx"), 1);
  EXPECT_EQ(count_ops(fused, "MatMulT", "onyx"), 2);
  // What is left: LayerNorm, 2 MatMulT, Gelu, the residual Add, Mul, ReduceSum.
  EXPECT_EQ(fused.nodes.size(), 7u);
  std::string out = g.outputs[0].name;
  expect_close(run(fused, feeds, out), run(unfused, feeds, out), 1e-5, "loss");

  // The backward built from the fused ops' rules gives the same parameter gradients.
  autodiff::GradientOptions opts;
  opts.trainable = {vars.begin(), vars.end()};
  std::map<std::string, std::map<std::string, Tensor>> grads;
  for (auto* fw : {&fused, &unfused}) {
    auto tg = autodiff::build_training_graph(*fw, sig, opts);
    runtime::Session s(tg.graph, vars);
    auto res = s.run(feeds);
    for (auto& [p, gname] : tg.gradients)
      grads[fw == &fused ? "fused" : "unfused"][p] = res.at(gname).clone();
  }
  for (auto& p : vars) {
    SCOPED_TRACE(p);
    expect_close(grads["fused"].at(p), grads["unfused"].at(p), 1e-4, p);
  }
}

TEST(LinearFusion, FiresOnRealExports) {
  struct Export {
    const char* model;
    int linears;
  };
  for (Export e : {Export{"bert-mini", 24}, Export{"gpt2-tiny", 25}, Export{"vit-tiny", 36}}) {
    SCOPED_TRACE(e.model);
    std::string path = onyx::test_exports::real_export(e.model);
    if (path.empty()) GTEST_SKIP() << onyx::test_exports::real_export_missing(e.model);
    ir::Graph g = ir::load_onnx(path);
    auto feeds = export_feeds(g, 2);
    auto [fused, report, sig, vars] = onyx::test_exports::optimize_export(g, feeds);
    EXPECT_EQ(report.applied("linear_fusion"), e.linears);
    // Every weight Transpose is gone (the attention ones go to attention_fusion).
    for (auto& n : fused.nodes) {
      if (n.op_type == "Transpose" && n.domain.empty()) {
        EXPECT_FALSE(vars.count(n.inputs[0])) << n.describe() << " still transposes a weight";
      }
    }
    passes::OptimizeOptions plain;
    plain.fusions = false;
    ir::Graph unfused = passes::optimize_forward(g, sig, vars, plain, nullptr);
    std::string out = g.outputs[0].name;
    expect_close(run(fused, feeds, out), run(unfused, feeds, out), 1e-5, e.model);
  }
}
