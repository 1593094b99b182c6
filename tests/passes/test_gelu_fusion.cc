// tests/passes/test_gelu_fusion.cc — passes/gelu_fusion.cc: the exported erf GELU (BERT, ViT) and
// GPT-2's tanh GELU, in every association and operand order the pass claims
// (tests/passes/decomposed_graphs.h), become one Gelu {approximate} — op counts before and after,
// equal outputs through runtime::Session within 1e-5 — look-alikes with other constants or shared
// intermediates stay, and the real opset-14 exports in <build>/bench-exports get 4 (bert-mini,
// erf), 4 (gpt2-tiny, tanh) and 6 (vit-tiny, erf) fused GELUs in passes::optimize_forward.
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
  std::string name;
  GeluSpec spec;
};

std::vector<Variant> variants() {
  std::vector<Variant> v;
  for (GeluForm form : {GeluForm::Erf, GeluForm::Tanh})
    for (HalfAt half : {HalfAt::Last, HalfAt::WithOnePlus, HalfAt::WithX})
      for (int alt = 0; alt < 2; alt++)
        for (bool swapped : {false, true}) {
          GeluSpec s;
          s.form = form;
          s.half = half;
          s.swapped = swapped;
          s.erf_mul = alt == 1;
          s.cube_as_mul = alt == 1;
          std::string name =
              std::string(form == GeluForm::Erf ? "erf" : "tanh") +
              (half == HalfAt::Last          ? "_half_last"
               : half == HalfAt::WithOnePlus ? "_half_with_h"
                                             : "_half_with_x") +
              (alt ? (form == GeluForm::Erf ? "_mul_inv_sqrt2" : "_cube_as_mul") : "") +
              (swapped ? "_swapped" : "");
          v.push_back({name, s});
        }
  return v;
}

ir::Graph make(const GeluSpec& s) {
  Builder b;
  b.input("x", {2, 3, 16});
  b.output(gelu(b, "x", s));
  return b.g;
}

int count_all(const ir::Graph& g) { return (int)g.nodes.size(); }

}  // namespace

TEST(GeluFusion, FusesEachVariantWithEqualNumerics) {
  std::map<std::string, Tensor> feeds{{"x", random_tensor({2, 3, 16}, 11, -4, 4)}};
  for (auto& v : variants()) {
    SCOPED_TRACE(v.name);
    ir::Graph g = make(v.spec);
    bool tanh = v.spec.form == GeluForm::Tanh;
    EXPECT_EQ(count_ops(g, tanh ? "Tanh" : "Erf"), 1);
    EXPECT_GE(count_all(g), 5);
    ir::Graph f = g;
    ASSERT_EQ(run_pass(f, passes::fuse_gelu, {}), 1);
    ASSERT_EQ(f.nodes.size(), 1u);
    EXPECT_EQ(count_ops(f, "Gelu", "onyx"), 1);  // opset 14 < 20: the onyx-domain Gelu
    EXPECT_EQ(f.opset("onyx"), 1);
    EXPECT_EQ(f.nodes[0].attr_string("approximate", ""), tanh ? "tanh" : "none");
    EXPECT_EQ(f.nodes[0].inputs[0], "x");
    std::string out = g.outputs[0].name;
    expect_close(run(f, feeds, out), run(g, feeds, out), 1e-5, v.name);
  }
}

// A model importing opset 20 (where ONNX has Gelu) gets the standard op, with no onyx import.
TEST(GeluFusion, EmitsTheStandardOpFromOpset20) {
  for (GeluForm form : {GeluForm::Erf, GeluForm::Tanh}) {
    GeluSpec s;
    s.form = form;
    Builder b(20);
    b.input("x", {2, 3, 16});
    b.output(gelu(b, "x", s));
    ir::Graph f = b.g;
    ASSERT_EQ(run_pass(f, passes::fuse_gelu, {}), 1);
    EXPECT_EQ(count_ops(f, "Gelu", ""), 1);
    EXPECT_EQ(f.opset("onyx"), 0);
    std::map<std::string, Tensor> feeds{{"x", random_tensor({2, 3, 16}, 5, -4, 4)}};
    std::string out = b.g.outputs[0].name;
    expect_close(run(f, feeds, out), run(b.g, feeds, out), 1e-5, "opset 20");
  }
}

TEST(GeluFusion, LeavesLookAlikesAlone) {
  auto set_const = [](ir::Graph& g, float from, float to) {
    for (auto& [k, t] : g.initializers)
      if (t.numel() == 1 && std::fabs(t.get_as_double(0) - from) < 1e-6) t = Tensor::scalar_f32(to);
  };
  {  // 0.6 · x · (1 + erf(x/√2))
    ir::Graph g = make(GeluSpec());
    set_const(g, 0.5f, 0.6f);
    EXPECT_EQ(run_pass(g, passes::fuse_gelu, {}), 0);
  }
  {  // erf(x / 1.5): off by more than the 1e-4 tolerance
    ir::Graph g = make(GeluSpec());
    set_const(g, 1.4142135f, 1.5f);
    EXPECT_EQ(run_pass(g, passes::fuse_gelu, {}), 0);
  }
  {  // tanh with 0.05 instead of 0.044715
    GeluSpec s;
    s.form = GeluForm::Tanh;
    ir::Graph g = make(s);
    set_const(g, 0.044715f, 0.05f);
    EXPECT_EQ(run_pass(g, passes::fuse_gelu, {}), 0);
  }
  {  // x² instead of x³
    GeluSpec s;
    s.form = GeluForm::Tanh;
    ir::Graph g = make(s);
    set_const(g, 3.f, 2.f);
    EXPECT_EQ(run_pass(g, passes::fuse_gelu, {}), 0);
  }
  {  // the multiplier is another value than the Erf's argument: y·(1 + erf(x/√2))·0.5
    Builder b;
    b.input("x", {4, 8});
    b.input("w", {4, 8});
    std::string h =
        b.add("Add", {b.add("Erf", {b.add("Div", {"x", b.scalar(1.4142135f)})}), b.scalar(1)});
    b.output(b.add("Mul", {b.add("Mul", {"w", h}), b.scalar(0.5f)}));
    EXPECT_EQ(run_pass(b.g, passes::fuse_gelu, {}), 0);
  }
  // An intermediate that is also a graph output: erf, 1 + erf, x·(1 + erf).
  for (const char* op : {"Erf", "Add", "Mul"}) {
    SCOPED_TRACE(op);
    ir::Graph g = make(GeluSpec());
    for (auto& n : g.nodes)
      if (n.op_type == op && n.outputs[0] != g.outputs[0].name) {
        ir::ValueInfo o;
        o.name = n.outputs[0];
        g.outputs.push_back(o);
        break;
      }
    EXPECT_EQ(run_pass(g, passes::fuse_gelu, {}), 0);
  }
}

TEST(GeluFusion, FiresOnRealExports) {
  struct Export {
    const char* model;
    int gelus;
    const char* approximate;
  };
  for (Export e : {Export{"bert-mini", 4, "none"}, Export{"gpt2-tiny", 4, "tanh"},
                   Export{"vit-tiny", 6, "none"}}) {
    SCOPED_TRACE(e.model);
    std::string path = onyx::test_exports::real_export(e.model);
    if (path.empty()) GTEST_SKIP() << onyx::test_exports::real_export_missing(e.model);
    ir::Graph g = ir::load_onnx(path);
    auto feeds = export_feeds(g, 2);
    auto [fused, report, sig, vars] = onyx::test_exports::optimize_export(g, feeds);
    EXPECT_EQ(report.applied("gelu_fusion"), e.gelus);
    EXPECT_EQ(count_ops(fused, "Gelu", "onyx"), e.gelus);
    for (auto& n : fused.nodes) {
      if (n.op_type == "Gelu") {
        EXPECT_EQ(n.attr_string("approximate", ""), e.approximate);
      }
    }
    EXPECT_EQ(count_ops(fused, "Erf"), 0);
  }
}
