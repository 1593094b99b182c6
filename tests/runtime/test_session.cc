// test_session.cc — plans are compiled once per input signature and cached; PyTorch-style shape
// subgraphs (Shape -> Gather -> Unsqueeze -> Concat -> Reshape) fold at plan time; parameters
// (trainable initializers) are never folded and can be replaced per run.
#include <gtest/gtest.h>

#include "autodiff/gradient.h"
#include "runtime/session.h"

using namespace onyx;
using autodiff::attr_i;
using autodiff::attr_ints;

namespace {

ir::Node node(const std::string& op, std::vector<std::string> in, std::vector<std::string> out,
              std::map<std::string, ir::Attribute> attrs = {}) {
  ir::Node n;
  n.name = op + "_" + out[0];
  n.op_type = op;
  n.inputs = std::move(in);
  n.outputs = std::move(out);
  n.attrs = std::move(attrs);
  return n;
}

// y = Reshape(x, [batch, -1]) * w, where [batch, -1] is computed from Shape(x) at run time.
std::shared_ptr<ir::Graph> shape_subgraph_model() {
  auto g = std::make_shared<ir::Graph>();
  g->opsets[""] = 17;
  ir::ValueInfo x;
  x.name = "x";
  x.dtype = DType::Float32;
  x.shape = {-1, -1, 4};
  x.dim_params = {"batch", "seq", ""};
  x.has_shape = true;
  g->inputs.push_back(x);
  ir::ValueInfo y;
  y.name = "y";
  y.dtype = DType::Float32;
  g->outputs.push_back(y);
  g->add_initializer("zero", Tensor::scalar_i64(0));
  g->add_initializer("minus1", Tensor::from_vector<int64_t>(DType::Int64, {1}, {-1}));
  g->add_initializer("w", Tensor::from_vector<float>(DType::Float32, {1}, {2.0f}));
  g->nodes.push_back(node("Shape", {"x"}, {"s"}));
  g->nodes.push_back(node("Gather", {"s", "zero"}, {"b"}, {{"axis", attr_i(0)}}));
  g->nodes.push_back(node("Unsqueeze", {"b", "axes0"}, {"b1"}));
  g->nodes.push_back(node("Concat", {"b1", "minus1"}, {"shape"}, {{"axis", attr_i(0)}}));
  g->nodes.push_back(node("Reshape", {"x", "shape"}, {"r"}));
  g->nodes.push_back(node("Mul", {"r", "w"}, {"y"}));
  g->add_initializer("axes0", Tensor::from_vector<int64_t>(DType::Int64, {1}, {0}));
  return g;
}

Tensor iota(Shape s) {
  Tensor t(DType::Float32, s);
  for (int64_t i = 0; i < t.numel(); i++) t.data<float>()[i] = (float)i;
  return t;
}

}  // namespace

TEST(Session, ShapeSubgraphFoldsAndPlansAreCachedPerSignature) {
  runtime::Session s(shape_subgraph_model());
  auto out = s.run({{"x", iota({2, 3, 4})}});
  EXPECT_EQ(out["y"].shape(), (Shape{2, 12}));
  EXPECT_EQ(out["y"].data<float>()[5], 10.0f);
  EXPECT_EQ(s.cached_plans(), 1u);
  const auto& plan = s.plan_for({{"x", TensorMeta{DType::Float32, {2, 3, 4}}}});
  EXPECT_EQ(plan.folded_nodes, 4) << "Shape, Gather, Unsqueeze, Concat fold at plan time";
  EXPECT_EQ(plan.steps.size(), 2u) << "only Reshape and Mul run";
  for (auto& st : plan.steps) EXPECT_FALSE(st.dynamic);
  s.run({{"x", iota({2, 3, 4})}});
  EXPECT_EQ(s.cached_plans(), 1u) << "same signature reuses the plan";
  auto out2 = s.run({{"x", iota({5, 1, 4})}});
  EXPECT_EQ(out2["y"].shape(), (Shape{5, 4}));
  EXPECT_EQ(s.cached_plans(), 2u);
}

TEST(Session, ParametersAreNotFoldedAndCanBeReplaced) {
  auto g = shape_subgraph_model();
  runtime::Session s(g, {"w"});
  auto a = s.run({{"x", iota({1, 1, 4})}});
  EXPECT_EQ(a["y"].data<float>()[3], 6.0f);
  auto b = s.run(
      {{"x", iota({1, 1, 4})}, {"w", Tensor::from_vector<float>(DType::Float32, {1}, {-1.0f})}});
  EXPECT_EQ(b["y"].data<float>()[3], -3.0f);
  EXPECT_THROW(s.run({{"x", iota({1, 1, 4})},
                      {"w", Tensor::from_vector<float>(DType::Float32, {2}, {1, 2})}}),
               Error);
}

TEST(Session, WrongInputsAreNamed) {
  runtime::Session s(shape_subgraph_model());
  try {
    s.run({{"x", iota({2, 3, 5})}});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("input 'x' has shape [2, 3, 5]"), std::string::npos)
        << e.what();
  }
  try {
    s.run({});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("input 'x'"), std::string::npos) << e.what();
  }
}
