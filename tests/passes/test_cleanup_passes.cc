// tests/passes/test_cleanup_passes.cc — the passes that shrink a graph before any fusion:
// fold_constants (constant_folding.cc), eliminate_no_ops (no_op_elimination.cc),
// eliminate_common_subexpressions (common_subexpression.cc) and eliminate_dead_nodes
// (dead_node_elimination.cc). Each: the graph before and after (op counts) and equal outputs.
#include <gtest/gtest.h>

#include "../real_exports.h"
#include "decomposed_graphs.h"
#include "ir/onnx_io.h"

using namespace onyx;
using namespace onyx::fusion_test;

namespace {

std::map<std::string, Tensor> feeds_x(Shape s) { return {{"x", random_tensor(s, 7)}}; }

}  // namespace

// PyTorch's Shape→Gather→Unsqueeze→Concat→Reshape target, built from the input's *shape* and
// constants, folds into one initializer; a node reading a trainable weight does not fold.
TEST(ConstantFolding, FoldsShapeSubgraphsButNotWeights) {
  Builder b;
  b.input("x", {2, 3, 4});
  std::string shape = b.add("Shape", {"x"});
  std::string d0 = b.add("Gather", {shape, b.i64({0})}, {{"axis", int_attr(0)}});
  std::string cat = b.add("Concat", {d0, b.i64({-1})}, {{"axis", int_attr(0)}});
  std::string r = b.add("Reshape", {"x", cat});  // (2, 12)
  std::string w = b.weight("w", {12});
  std::string w2 = b.add("Mul", {w, b.scalar(2.0f)});  // reads a variable: stays
  b.output(b.add("Add", {r, w2}));
  ir::Graph before = b.g;
  int folded = run_pass(b.g, passes::fold_constants, {"w"});
  EXPECT_EQ(folded, 3);  // Shape, Gather, Concat
  EXPECT_EQ(count_ops(b.g, "Shape"), 0);
  EXPECT_EQ(count_ops(b.g, "Concat"), 0);
  EXPECT_EQ(count_ops(b.g, "Mul"), 1);
  EXPECT_EQ(count_ops(b.g, "Reshape"), 1);
  auto f = feeds_x({2, 3, 4});
  expect_close(run(b.g, f, b.g.outputs[0].name), run(before, f, before.outputs[0].name), 0,
               "folded");
}

TEST(NoOpElimination, RemovesIdentitiesAndCollapsesLayoutChains) {
  Builder b;
  b.input("x", {2, 3, 4});
  std::string a = b.add("Identity", {"x"});
  std::string d = b.add("Dropout", {a, b.scalar(0.0f)});      // ratio 0: identity
  std::string c = b.add("Cast", {d}, {{"to", int_attr(1)}});  // float → float
  std::string r1 = b.add("Reshape", {c, b.i64({6, 4})});
  std::string r2 = b.add("Reshape", {r1, b.i64({2, 12})});  // chain → one Reshape
  std::string r3 = b.add("Reshape", {r2, b.i64({2, 12})});  // to its own shape
  std::string t1 = b.add("Transpose", {r3}, {{"perm", ints_attr({1, 0})}});
  std::string t2 = b.add("Transpose", {t1}, {{"perm", ints_attr({1, 0})}});  // identity pair
  std::string y = b.add("Neg", {t2});
  b.output(y);
  ir::Graph before = b.g;
  int n = run_pass(b.g, passes::eliminate_no_ops, {});
  EXPECT_GE(n, 6);
  EXPECT_EQ(count_ops(b.g, "Identity"), 0);
  EXPECT_EQ(count_ops(b.g, "Dropout"), 0);
  EXPECT_EQ(count_ops(b.g, "Cast"), 0);
  EXPECT_EQ(count_ops(b.g, "Transpose"), 0);
  EXPECT_EQ(count_ops(b.g, "Reshape"), 1);
  EXPECT_EQ(b.g.nodes.size(), 2u);  // Reshape, Neg
  auto f = feeds_x({2, 3, 4});
  expect_close(run(b.g, f, y), run(before, f, y), 0, "no-ops removed");
}

TEST(NoOpElimination, KeepsADropoutThatDropsAndGraphOutputs) {
  Builder b;
  b.input("x", {4, 5});
  Tensor on = Tensor::from_vector<uint8_t>(DType::Bool, {}, {1});
  b.g.add_initializer("train", on);
  std::string d = b.add("Dropout", {"x", b.scalar(0.5f), "train"});
  std::string i = b.add("Identity", {d});
  b.output(i);  // a graph output keeps its producer
  EXPECT_EQ(run_pass(b.g, passes::eliminate_no_ops, {}), 0);
  EXPECT_EQ(count_ops(b.g, "Dropout"), 1);
  EXPECT_EQ(count_ops(b.g, "Identity"), 1);
}

TEST(CommonSubexpression, MergesEqualNodesAndEqualConstants) {
  Builder b;
  b.input("x", {3, 4});
  // two equal scalar constants under different names, two equal expressions over them
  std::string e1 = b.add("Mul", {"x", b.scalar(0.5f)});
  std::string e2 = b.add("Mul", {"x", b.scalar(0.5f)});
  std::string s1 = b.add("Softmax", {e1}, {{"axis", int_attr(-1)}});
  std::string s2 = b.add("Softmax", {e2}, {{"axis", int_attr(-1)}});
  std::string s3 = b.add("Softmax", {e2}, {{"axis", int_attr(0)}});  // other attribute: stays
  std::string y = b.add("Add", {b.add("Add", {s1, s2}), s3});
  b.output(y);
  ir::Graph before = b.g;
  EXPECT_EQ(run_pass(b.g, passes::eliminate_common_subexpressions, {}), 2);
  EXPECT_EQ(count_ops(b.g, "Mul"), 1);
  EXPECT_EQ(count_ops(b.g, "Softmax"), 2);
  auto f = feeds_x({3, 4});
  expect_close(run(b.g, f, y), run(before, f, y), 0, "merged");
}

TEST(CommonSubexpression, NeverMergesRandomOps) {
  Builder b;
  b.input("x", {8, 8});
  Tensor on = Tensor::from_vector<uint8_t>(DType::Bool, {}, {1});
  b.g.add_initializer("train", on);
  std::string d1 = b.add("Dropout", {"x", b.scalar(0.5f), "train"});
  std::string d2 = b.add("Dropout", {"x", b.scalar(0.5f), "train"});
  b.output(b.add("Add", {d1, d2}));
  EXPECT_EQ(run_pass(b.g, passes::eliminate_common_subexpressions, {}), 0);
  EXPECT_EQ(count_ops(b.g, "Dropout"), 2);
}

TEST(DeadNodeElimination, RemovesWhatReachesNoOutput) {
  Builder b;
  b.input("x", {2, 2});
  b.input("unused", {2, 2});
  std::string w = b.weight("w", {2, 2});
  b.add("Neg", {"x"});                     // dead
  b.add("Mul", {b.add("Exp", {"x"}), w});  // dead, with its weight
  std::string y = b.add("Relu", {"x"});
  b.output(y);
  EXPECT_EQ(passes::eliminate_dead_nodes(b.g), 3);
  EXPECT_EQ(b.g.nodes.size(), 1u);
  EXPECT_EQ(b.g.inputs.size(), 1u);
  EXPECT_FALSE(b.g.initializers.count("w"));
}

// On a real export: the cleanup alone takes bert-mini's forward graph from the exporter's 555
// nodes to well under half, and the loss is unchanged.
TEST(CleanupPasses, ShrinkTheRealBertExport) {
  std::string path = onyx::test_exports::real_export("bert-mini");
  if (path.empty()) GTEST_SKIP() << onyx::test_exports::real_export_missing("bert-mini");
  ir::Graph g = ir::load_onnx(path);
  auto feeds = export_feeds(g, 2);
  std::map<std::string, TensorMeta> sig;
  for (auto& [k, t] : feeds) sig[k] = t.meta();
  passes::OptimizeOptions no_fusion;
  no_fusion.fusions = false;
  passes::PassReport rep;
  ir::Graph small = passes::optimize_forward(g, sig, {}, no_fusion, &rep);
  EXPECT_GT(rep.applied("fold_constants"), 300);
  EXPECT_LT(small.nodes.size() * 2, g.nodes.size());
  expect_close(run(small, feeds, "loss"), run(g, feeds, "loss"), 1e-6, "loss");
}

// The fusions register themselves (ONYX_REGISTER_FUSION in each pass file); the pipeline runs them
// by their order, token pruning last and to a fixpoint.
TEST(Pipeline, FusionsRunInRegisteredOrder) {
  std::vector<std::string> names;
  for (auto& p : passes::fusion_passes()) names.push_back(p.name);
  std::vector<std::string> want{"layer_norm_fusion", "gelu_fusion",        "linear_fusion",
                                "attention_fusion",  "dropout_add_fusion", "cross_entropy_fusion",
                                "token_pruning"};
  // Fusions added later sit between these; the relative order of these stays.
  std::vector<std::string> seen;
  for (auto& n : names)
    if (std::find(want.begin(), want.end(), n) != want.end()) seen.push_back(n);
  EXPECT_EQ(seen, want);
  EXPECT_EQ(names.back(), "token_pruning");
  EXPECT_TRUE(passes::fusion_pass("token_pruning").until_fixpoint);
  EXPECT_FALSE(passes::fusion_pass("gelu_fusion").until_fixpoint);
  try {
    passes::fusion_pass("no_such_fusion");
    ADD_FAILURE() << "no throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("registered: layer_norm_fusion"), std::string::npos)
        << e.what();
  }
}
