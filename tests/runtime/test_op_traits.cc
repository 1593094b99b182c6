// test_op_traits.cc — the op traits passes and planners read come from the kernel registry, as
// each kernel declares them (runtime/kernel.h OpTraits), and the lists they replaced agree.
#include <gtest/gtest.h>

#include "autodiff/gradient.h"
#include "runtime/kernel.h"

namespace onyx::runtime {
namespace {

ir::Node node(const std::string& domain, const std::string& op) {
  ir::Node n;
  n.domain = domain;
  n.op_type = op;
  return n;
}

TEST(OpTraits, ViewsAndReshapeLikes) {
  for (const char* op : {"Reshape", "Flatten", "Squeeze", "Unsqueeze"}) {
    EXPECT_TRUE(op_traits(node("", op)).view) << op;
    EXPECT_TRUE(op_traits(node("", op)).reshape_like) << op;
  }
  EXPECT_TRUE(op_traits(node("", "Identity")).view);
  EXPECT_FALSE(op_traits(node("", "Identity")).reshape_like);
  EXPECT_FALSE(op_traits(node("", "Transpose")).view);
  EXPECT_TRUE(op_traits(node("ai.onnx", "Reshape")).view) << "ai.onnx is the default domain";
}

TEST(OpTraits, NeverFoldedAndMetaOnly) {
  EXPECT_TRUE(op_traits(node("", "Dropout")).random);
  EXPECT_TRUE(op_traits(node("onyx", "AccumulateGrad")).side_effects);
  EXPECT_FALSE(op_traits(node("", "Add")).random);
  EXPECT_EQ(op_traits(node("", "Shape")).meta_only_inputs, std::vector<int>{0});
  EXPECT_EQ(op_traits(node("", "Size")).meta_only_inputs, std::vector<int>{0});
  EXPECT_EQ(op_traits(node("", "CastLike")).meta_only_inputs, std::vector<int>{1});
  EXPECT_TRUE(op_traits(node("", "Cast")).meta_only_inputs.empty());
}

TEST(OpTraits, PerTokenClasses) {
  using P = OpTraits::PerToken;
  for (const char* op : {"Gelu", "Relu", "Tanh", "Sigmoid", "Erf", "Neg", "Exp", "Sqrt", "Identity",
                         "Cast", "Softplus", "LeakyRelu", "Elu", "Abs", "Reciprocal"})
    EXPECT_EQ(op_traits(node("", op)).per_token, P::Unary) << op;
  for (const char* op : {"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min"})
    EXPECT_EQ(op_traits(node("", op)).per_token, P::Binary) << op;
  for (const char* op : {"Softmax", "LayerNormalization", "MatMul", "Transpose", "Gather"})
    EXPECT_EQ(op_traits(node("", op)).per_token, P::No) << op;
  EXPECT_EQ(op_traits(node("", "NoSuchOp")).per_token, P::No) << "unregistered: defaults";
  // The onyx-domain forms of Gelu / LayerNormalization (fusions below opset 20 / 17) are the same
  // op.
  EXPECT_EQ(op_traits(node("onyx", "Gelu")).per_token, P::Unary);
  EXPECT_EQ(op_traits(node("onyx", "LayerNormalization")).precision, OpTraits::Precision::Fp32);
}

TEST(OpTraits, FlopsFormulas) {
  TensorMeta a{DType::Float32, {4, 8, 16}}, w{DType::Float32, {16, 32}},
      y{DType::Float32, {4, 8, 32}};
  ir::Node mm = node("", "MatMul");
  ASSERT_TRUE(op_traits(mm).flops);
  EXPECT_DOUBLE_EQ(op_traits(mm).flops(mm, {&a, &w}, {&y}), 2.0 * 4 * 8 * 32 * 16);
  EXPECT_DOUBLE_EQ(op_traits(mm).flops(mm, {nullptr, &w}, {&y}), 0.0) << "unknown metas count 0";
  ir::Node t = node("onyx", "MatMulT");
  t.attrs["transA"] = autodiff::attr_i(1);
  TensorMeta at{DType::Float32, {16, 8}}, yt{DType::Float32, {8, 32}};
  EXPECT_DOUBLE_EQ(op_traits(t).flops(t, {&at, &w}, {&yt}), 2.0 * 8 * 32 * 16)
      << "transA: K = rows";
  for (auto [d, op] :
       std::vector<std::pair<const char*, const char*>>{{"", "Gemm"},
                                                        {"", "Conv"},
                                                        {"onyx", "MatMulGradB"},
                                                        {"onyx", "ConvGradInput"},
                                                        {"onyx", "ConvGradWeight"},
                                                        {"onyx", "Attention"},
                                                        {"onyx", "AttentionGrad"},
                                                        {"onyx", "LinearCrossEntropy"}})
    EXPECT_TRUE(op_traits(node(d, op)).flops) << d << "." << op;
  EXPECT_FALSE(op_traits(node("", "Add")).flops);
  // Einsum: 2·M·N·K for a matmul-shaped equation; a chain counts each pair's GEMM.
  ir::Node es = node("", "Einsum");
  es.attrs["equation"] = ir::Attribute::of_string("bij,bjk->bik");
  TensorMeta ea{DType::Float32, {4, 8, 16}}, eb{DType::Float32, {4, 16, 32}},
      ey{DType::Float32, {4, 8, 32}};
  ASSERT_TRUE(op_traits(es).flops);
  EXPECT_DOUBLE_EQ(op_traits(es).flops(es, {&ea, &eb}, {&ey}), 2.0 * 4 * 8 * 16 * 32);
  es.attrs["equation"] = ir::Attribute::of_string("ij,jk,kl->il");
  TensorMeta c1{DType::Float32, {2, 3}}, c2{DType::Float32, {3, 5}}, c3{DType::Float32, {5, 7}};
  EXPECT_DOUBLE_EQ(op_traits(es).flops(es, {&c1, &c2, &c3}, {nullptr}),
                   2.0 * (2 * 3 * 5 + 2 * 5 * 7));
  es.attrs["equation"] = ir::Attribute::of_string("ii->");
  TensorMeta sq{DType::Float32, {3, 3}};
  EXPECT_DOUBLE_EQ(op_traits(es).flops(es, {&sq}, {nullptr}), 0.0) << "one operand: no GEMM";
}

TEST(OpTraits, PrecisionClasses) {
  using P = OpTraits::Precision;
  for (const char* op : {"MatMul", "Gemm", "Conv"})
    EXPECT_EQ(op_traits(node("", op)).precision, P::LowPrecision) << op;
  for (const char* op : {"Attention", "AttentionGrad", "MatMulT", "MatMulGradB"})
    EXPECT_EQ(op_traits(node("onyx", op)).precision, P::LowPrecision) << op;
  for (const char* op : {"LayerNormalization", "Softmax", "LogSoftmax", "SoftmaxCrossEntropyLoss"})
    EXPECT_EQ(op_traits(node("", op)).precision, P::Fp32) << op;
  EXPECT_EQ(op_traits(node("", "Reshape")).precision, P::Follow);
}

}  // namespace
}  // namespace onyx::runtime
