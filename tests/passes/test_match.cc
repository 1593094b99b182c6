// test_match.cc — the pass toolkit (passes/match.h, GraphIndex in passes/pass.h) and the
// ir::Attribute factories on hand-built graphs.
#include <gtest/gtest.h>

#include "ir/graph.h"
#include "passes/match.h"
#include "passes/pass.h"

namespace onyx {
namespace {

using passes::GraphIndex;

ir::Node node(const std::string& op, std::vector<std::string> in, std::vector<std::string> out,
              const std::string& domain = "") {
  const std::string name =
      op + "_" + out[0];  // before out is moved (argument order is unspecified)
  return passes::make_node(op, domain, std::move(in), std::move(out), {}, name);
}

TEST(PassToolkit, AttributeFactories) {
  using A = ir::Attribute;
  EXPECT_EQ(A::of_int(-1).kind, A::Kind::Int);
  EXPECT_EQ(A::of_int(-1).i, -1);
  EXPECT_EQ(A::of_float(0.5f).kind, A::Kind::Float);
  EXPECT_EQ(A::of_float(0.5f).f, 0.5f);
  EXPECT_EQ(A::of_string("tanh").kind, A::Kind::String);
  EXPECT_EQ(A::of_string("tanh").s, "tanh");
  EXPECT_EQ(A::of_ints({0, 2, 1, 3}).ints, (std::vector<int64_t>{0, 2, 1, 3}));
  EXPECT_EQ(A::of_ints({}).kind, A::Kind::Ints);
  EXPECT_EQ(A::of_floats({1.f, 2.f}).floats, (std::vector<float>{1.f, 2.f}));
  EXPECT_EQ(A::of_strings({"a", "b"}).strings, (std::vector<std::string>{"a", "b"}));
  A t = A::of_tensor(Tensor::scalar_f32(3.f));
  EXPECT_EQ(t.kind, A::Kind::Tensor);
  EXPECT_EQ(t.t.get_as_double(0), 3.0);
  // read back through the node accessors
  ir::Node n =
      passes::make_node("Gelu", "", {"x"}, {"y"}, {{"approximate", A::of_string("tanh")}}, "g");
  EXPECT_EQ(n.attr_string("approximate", "none"), "tanh");
  EXPECT_EQ(n.name, "g");
  EXPECT_EQ(n.inputs, (std::vector<std::string>{"x"}));
}

TEST(PassToolkit, IsOpDomainsAndOpsets) {
  ir::Graph g;
  g.opsets[""] = 14;
  ir::Node a = node("Add", {"x", "y"}, {"z"});
  ir::Node b = node("Add", {"x", "y"}, {"z"}, "ai.onnx");
  ir::Node m = node("MatMulT", {"x", "w"}, {"y"}, "onyx");
  EXPECT_TRUE(passes::is_op(a, "Add"));
  EXPECT_TRUE(passes::is_op(b, "Add"));  // "ai.onnx" is the default domain too
  EXPECT_TRUE(passes::is_op(a, "ai.onnx", "Add"));
  EXPECT_TRUE(passes::is_op(b, "", "Add"));
  EXPECT_FALSE(passes::is_op(a, "Sub"));
  EXPECT_FALSE(passes::is_op(m, "MatMulT"));  // not a standard op
  EXPECT_TRUE(passes::is_op(m, "onyx", "MatMulT"));
  EXPECT_FALSE(passes::is_op(a, "onyx", "Add"));
  // opset range of the graph's import of the domain
  EXPECT_TRUE(passes::is_op(g, a, "", "Add", 14));
  EXPECT_TRUE(passes::is_op(g, b, "ai.onnx", "Add", 7, 14));
  EXPECT_FALSE(passes::is_op(g, a, "", "Add", 17));
  EXPECT_FALSE(passes::is_op(g, a, "", "Add", 1, 13));
  EXPECT_FALSE(passes::is_op(g, m, "onyx", "MatMulT", 1));  // onyx not imported: opset 0
  passes::import_domain(g, "onyx");
  EXPECT_TRUE(passes::is_op(g, m, "onyx", "MatMulT", 1));
  passes::import_domain(g, "", 20);  // already imported: kept
  EXPECT_EQ(g.opset(""), 14);
}

TEST(PassToolkit, TransposeAndOperands) {
  ir::Node t = node("Transpose", {"w"}, {"wt"});
  EXPECT_TRUE(passes::is_transpose(t, {1, 0}));  // no perm: the reversal
  EXPECT_TRUE(passes::is_transpose(t, {2, 1, 0}));
  EXPECT_EQ(passes::transpose_perm(t, 3), (std::vector<int64_t>{2, 1, 0}));
  t.attrs["perm"] = ir::Attribute::of_ints({0, 2, 1, 3});
  EXPECT_TRUE(passes::is_transpose(t, {0, 2, 1, 3}));
  EXPECT_FALSE(passes::is_transpose(t, {3, 2, 1, 0}));
  EXPECT_FALSE(passes::is_transpose(node("Reshape", {"w"}, {"r"}), {1, 0}));

  ir::Node add = node("Add", {"a", "b"}, {"c"});
  EXPECT_EQ(passes::other_input(add, "a"), "b");
  EXPECT_EQ(passes::other_input(add, "b"), "a");
  EXPECT_EQ(passes::other_input(add, "q"), "");
  EXPECT_EQ(passes::other_input(node("Add", {"a", "a"}, {"c"}), "a"), "a");
  EXPECT_EQ(passes::other_input(node("Neg", {"a"}, {"c"}), "a"), "");

  ir::Node d = node("Dropout", {"x"}, {"y", "mask"});
  EXPECT_EQ(passes::dropout_rng_key(d), "y");
  d.attrs["rng_key"] = ir::Attribute::of_string("orig");
  EXPECT_EQ(passes::dropout_rng_key(d), "orig");
}

TEST(PassToolkit, ScalarsAndConstants) {
  ir::Graph g;
  g.add_initializer("half", Tensor::scalar_f32(0.5f));
  g.add_initializer("w", Tensor::scalar_f32(0.5f));
  passes::PassContext ctx;
  ctx.variables = {"w"};
  EXPECT_TRUE(passes::is_scalar_near(ctx, g, "half", 0.5, 1e-6));
  EXPECT_TRUE(passes::is_scalar_near(ctx, g, "half", 0.50001, 1e-4));
  EXPECT_FALSE(passes::is_scalar_near(ctx, g, "half", 0.6, 1e-4));
  EXPECT_FALSE(passes::is_scalar_near(ctx, g, "w", 0.5, 1e-6));  // a trainable weight
  EXPECT_FALSE(passes::is_scalar_near(ctx, g, "missing", 0.5, 1e-6));
  std::string s = passes::add_i64_constant(g, ctx, "x_shape", {2, 3, 4});
  EXPECT_NE(s, "x_shape");  // a fresh name
  ASSERT_TRUE(g.is_initializer(s));
  EXPECT_EQ(g.initializers.at(s).to_int64_vector(), (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(g.initializers.at(s).dtype(), DType::Int64);
  EXPECT_NE(passes::add_i64_constant(g, ctx, "x_shape", {1}), s);
}

TEST(PassToolkit, GraphIndexUses) {
  // x -> Neg -> a; a read by Exp and Abs; Exp -> b (graph output, also read by Sqrt); Abs -> c
  // read once; Dropout(c) -> d, mask (mask unread); Sqrt -> e only a graph output.
  ir::Graph g;
  g.nodes = {node("Neg", {"x"}, {"a"}),  node("Exp", {"a"}, {"b"}),
             node("Abs", {"a"}, {"c"}),  node("Dropout", {"c"}, {"d", "mask"}),
             node("Sqrt", {"b"}, {"e"}), node("Mul", {"d", "d"}, {"f"})};
  for (auto o : {"b", "e", "f"}) {
    ir::ValueInfo vi;
    vi.name = o;
    g.outputs.push_back(vi);
  }
  GraphIndex idx(g);
  EXPECT_EQ(idx.producer("a"), 0);
  EXPECT_EQ(idx.producer("x"), -1);
  EXPECT_EQ(idx.producer_node(g, "c"), &g.nodes[2]);
  EXPECT_EQ(idx.producer_node(g, "x"), nullptr);
  EXPECT_EQ(idx.uses("a"), 2);
  EXPECT_FALSE(idx.single_use("a"));
  EXPECT_EQ(idx.sole_consumer("a"), -1);
  EXPECT_TRUE(idx.single_use("c"));
  EXPECT_EQ(idx.sole_consumer("c"), 3);
  EXPECT_EQ(idx.uses("b"), 2);  // Sqrt and the graph output
  EXPECT_EQ(idx.sole_consumer("b"), -1);
  EXPECT_TRUE(idx.single_use("e"));       // only the graph output reads it ...
  EXPECT_EQ(idx.sole_consumer("e"), -1);  // ... so no node may absorb it
  EXPECT_EQ(idx.uses("d"), 2);            // Mul reads it twice
  EXPECT_EQ(idx.sole_consumer("d"), -1);
  EXPECT_TRUE(idx.unused("mask"));
  EXPECT_TRUE(idx.unused(""));
  EXPECT_FALSE(idx.unused("c"));
  EXPECT_TRUE(idx.outputs_unused(g.nodes[3]));      // the mask
  EXPECT_FALSE(idx.outputs_unused(g.nodes[3], 0));  // d is read
  g.nodes.push_back(node("Not", {"mask"}, {"m2"}));
  GraphIndex idx2(g);
  EXPECT_FALSE(idx2.outputs_unused(g.nodes[3]));
}

}  // namespace
}  // namespace onyx
