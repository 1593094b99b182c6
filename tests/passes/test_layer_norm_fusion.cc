// tests/passes/test_layer_norm_fusion.cc — passes/layer_norm_fusion.cc: PyTorch's decomposed
// LayerNorm (tests/passes/decomposed_graphs.h builds each variant the pass claims) becomes one
// LayerNormalization — op counts before and after, equal outputs through runtime::Session within
// 1e-5 — chains the pass must leave alone stay, and the real opset-14 exports in
// <build>/bench-exports (bert-mini, gpt2-tiny, vit-tiny) get 9, 9 and 13 fused LayerNorms in
// passes::optimize_forward.
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
  LayerNormSpec spec;
};

std::vector<Variant> variants() {
  std::vector<Variant> v;
  LayerNormSpec s;
  v.push_back({"exported", s});
  s.square_as_mul = true;
  v.push_back({"square_as_mul", s});
  s = LayerNormSpec();
  s.swapped = true;
  v.push_back({"swapped_operands", s});
  s = LayerNormSpec();
  s.beta = false;
  v.push_back({"no_beta", s});
  s.gamma = false;
  v.push_back({"no_gamma_no_beta", s});
  s = LayerNormSpec();
  s.positive_axes = true, s.eps = 1e-12f;
  v.push_back({"positive_axes_bert_eps", s});
  s = LayerNormSpec();
  s.axes_input = true;
  v.push_back({"opset18_axes_input", s});
  s = LayerNormSpec();
  s.opset = 17;
  v.push_back({"opset17_standard_op", s});
  return v;
}

// x (2,5,C) → LayerNorm → y
ir::Graph make(const LayerNormSpec& s, int64_t C = 24) {
  Builder b(s.axes_input ? 18 : s.opset);
  b.input("x", {2, 5, C});
  b.output(layer_norm(b, "x", 3, C, s));
  return b.g;
}

}  // namespace

TEST(LayerNormFusion, FusesEachVariantWithEqualNumerics) {
  for (auto& v : variants()) {
    SCOPED_TRACE(v.name);
    ir::Graph g = make(v.spec);
    auto vars = [&] {
      std::set<std::string> s;
      for (auto& [k, t] : g.initializers)
        if (t.rank() >= 1 && t.dtype() == DType::Float32) s.insert(k);
      return s;
    }();
    ir::Graph f = g;
    EXPECT_EQ(count_ops(g, "ReduceMean"), 2);
    EXPECT_EQ(count_ops(g, "Sqrt"), 1);
    ASSERT_EQ(run_pass(f, passes::fuse_layer_norm, vars), 1);
    EXPECT_EQ(f.nodes.size(), 1u) << "everything but the LayerNormalization is dead";
    // The standard op from opset 17; below it onyx.LayerNormalization (the model's imports stay
    // valid), with the onyx domain imported.
    const std::string domain = f.opset("") >= 17 ? "" : "onyx";
    EXPECT_EQ(count_ops(f, "LayerNormalization", domain), 1);
    if (!domain.empty()) {
      EXPECT_EQ(f.opset("onyx"), 1);
    }
    EXPECT_EQ(count_ops(f, "ReduceMean"), 0);
    const ir::Node& ln = f.nodes[0];
    EXPECT_FLOAT_EQ(ln.attr_float("epsilon", 0), v.spec.eps);
    EXPECT_EQ(ln.attr_int("axis", 0), -1);
    EXPECT_EQ(ln.inputs.size(), v.spec.beta ? 3u : 2u);
    std::map<std::string, Tensor> feeds{{"x", random_tensor({2, 5, 24}, 9, -3, 3)}};
    std::string out = g.outputs[0].name;
    EXPECT_EQ(f.outputs[0].name, out);
    expect_close(run(f, feeds, out), run(g, feeds, out), 1e-5, v.name);
  }
}

TEST(LayerNormFusion, LeavesOtherChainsAlone) {
  {  // normalizing over axis 1, not the last
    Builder b;
    b.input("x", {2, 6, 4});
    std::string m = b.add("ReduceMean", {"x"}, {{"axes", ints_attr({1})}});
    std::string d = b.add("Sub", {"x", m});
    std::string v =
        b.add("ReduceMean", {b.add("Pow", {d, b.scalar(2)})}, {{"axes", ints_attr({1})}});
    b.output(b.add("Div", {d, b.add("Sqrt", {b.add("Add", {v, b.scalar(1e-5f)})})}));
    EXPECT_EQ(run_pass(b.g, passes::fuse_layer_norm, {}), 0);
  }
  // An intermediate that is also a graph output: the centred d, the variance, the denominator.
  for (const char* op : {"Sub", "Pow", "Sqrt"}) {
    SCOPED_TRACE(op);
    ir::Graph g = make(LayerNormSpec());
    for (auto& n : g.nodes)
      if (n.op_type == op) {
        ir::ValueInfo o;
        o.name = n.outputs[0];
        g.outputs.push_back(o);
      }
    EXPECT_EQ(run_pass(g, passes::fuse_layer_norm, {}), 0);
  }
  {  // an exponent that is not 2
    ir::Graph g = make(LayerNormSpec());
    for (auto& n : g.nodes)
      if (n.op_type == "Pow") g.initializers.at(n.inputs[1]) = Tensor::scalar_f32(3.f);
    EXPECT_EQ(run_pass(g, passes::fuse_layer_norm, {}), 0);
  }
  {  // gamma of the wrong size: the normalization fuses, the Mul stays
    Builder b;
    b.input("x", {2, 5, 8});
    LayerNormSpec s;
    s.gamma = s.beta = false;
    std::string y = layer_norm(b, "x", 3, 8, s);
    b.output(b.add("Mul", {y, b.weight("g", {5, 1})}));
    EXPECT_EQ(run_pass(b.g, passes::fuse_layer_norm, {"g"}), 1);
    EXPECT_EQ(count_ops(b.g, "Mul"), 1);
  }
}

TEST(LayerNormFusion, FiresOnRealExports) {
  struct Export {
    const char* model;
    int layer_norms;
  };
  for (Export e : {Export{"bert-mini", 9}, Export{"gpt2-tiny", 9}, Export{"vit-tiny", 13}}) {
    SCOPED_TRACE(e.model);
    std::string path = onyx::test_exports::real_export(e.model);
    if (path.empty()) GTEST_SKIP() << onyx::test_exports::real_export_missing(e.model);
    ir::Graph g = ir::load_onnx(path);
    auto feeds = export_feeds(g, 2);
    auto [fused, report, sig, vars] = onyx::test_exports::optimize_export(g, feeds);
    EXPECT_EQ(report.applied("layer_norm_fusion"), e.layer_norms);
    EXPECT_EQ(count_ops(fused, "LayerNormalization", "onyx"), e.layer_norms);  // opset-14 exports
    EXPECT_EQ(count_ops(fused, "Sqrt"), 0);
    EXPECT_EQ(count_ops(fused, "ReduceMean"), 0);
  }
}
