// tests/kernels/test_linear_cross_entropy.cc — onyx.LinearCrossEntropy against the unfused graph
// (MatMul with W or Transpose(W), optional bias Add, SoftmaxCrossEntropyLoss — or the trainer's
// label-smoothed cross-entropy for label_smoothing) run through runtime::Session, with gradients
// from autodiff of that graph: loss, dH, dW, dbias; ignore_index hits, every row ignored, several
// chunk boundaries (contiguous and not), V not a multiple of the SIMD width; the loss-only mode;
// the fused op through autodiff (unit seed, no scaling node); determinism; bad labels.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "autodiff/gradient.h"
#include "runtime/parallel.h"
#include "runtime/session.h"

using namespace onyx;
using autodiff::attr_f;
using autodiff::attr_i;
using autodiff::attr_s;
using onyx::runtime::run_node;

namespace {

struct LceCase {
  const char* name;
  int64_t N, C, V;
  bool transB, bias;
  const char* reduction;
  int ignore_every;  // every k-th row gets ignore_index (0: none; 1: all rows)
  int64_t chunk_rows;
  float eps;  // label smoothing (mean reduction only)
};

Tensor rand_f32(Shape s, uint32_t seed, float lo = -1, float hi = 1) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(shape_numel(s));
  for (auto& x : v) x = d(g);
  return Tensor::from_vector(DType::Float32, s, v);
}

struct Inputs {
  Tensor H, W, labels, bias;
};

Inputs make_inputs(const LceCase& c) {
  Inputs in;
  in.H = rand_f32({c.N, c.C}, 1, -2, 2);
  in.W = rand_f32(c.transB ? Shape{c.V, c.C} : Shape{c.C, c.V}, 2, -1, 1);
  if (c.bias) in.bias = rand_f32({c.V}, 3);
  std::mt19937 g(4);
  std::vector<int64_t> lab(c.N);
  for (int64_t n = 0; n < c.N; n++)
    lab[n] = (c.ignore_every > 0 && n % c.ignore_every == 0) ? -100 : (int64_t)(g() % c.V);
  in.labels = Tensor::from_vector<int64_t>(DType::Int64, {c.N}, lab);
  return in;
}

struct Result {
  double loss;
  Tensor dH, dW, dbias;
};

ir::Node make(const std::string& op, std::vector<std::string> in, std::vector<std::string> out,
              const std::string& domain = "") {
  ir::Node n;
  n.name = op + "_" + out[0];
  n.op_type = op;
  n.domain = domain;
  n.inputs = std::move(in);
  n.outputs = std::move(out);
  return n;
}

// Trains `g` (loss output "loss" or a LossSpec) on H, W, bias as parameters.
Result train(std::shared_ptr<ir::Graph> g, const Inputs& in, autodiff::LossSpec spec) {
  autodiff::GradientOptions opts;
  opts.loss = spec;
  opts.trainable = {"H", "W"};
  if (in.bias.defined()) opts.trainable.push_back("bias");
  auto tg = autodiff::build_training_graph(*g, {{"labels", in.labels.meta()}}, opts);
  runtime::Session s(tg.graph, std::set<std::string>(opts.trainable.begin(), opts.trainable.end()));
  auto res = s.run({{"labels", in.labels}});
  Result r;
  r.loss = res.at(tg.loss).get_as_double(0);
  for (auto& [p, gname] : tg.gradients) {
    if (p == "H") r.dH = res.at(gname);
    if (p == "W") r.dW = res.at(gname);
    if (p == "bias") r.dbias = res.at(gname);
  }
  return r;
}

std::shared_ptr<ir::Graph> base_graph(const Inputs& in) {
  auto g = std::make_shared<ir::Graph>();
  g->opsets[""] = 17;
  g->opsets["onyx"] = 1;
  g->add_initializer("H", in.H);
  g->add_initializer("W", in.W);
  ir::ValueInfo labels;  // a graph input, as the trainer's LossSpec wants it
  labels.name = "labels";
  labels.dtype = DType::Int64;
  g->inputs.push_back(labels);
  if (in.bias.defined()) g->add_initializer("bias", in.bias);
  return g;
}

// The unfused reference: logits = H · op(W) (+ bias), then SCE or the trainer's label smoothing.
Result reference(const LceCase& c, const Inputs& in) {
  auto g = base_graph(in);
  std::string w = "W";
  if (c.transB) {
    auto t = make("Transpose", {"W"}, {"Wt"});
    t.attrs["perm"] = autodiff::attr_ints({1, 0});
    g->nodes.push_back(t);
    w = "Wt";
  }
  g->nodes.push_back(make("MatMul", {"H", w}, {c.bias ? "mm" : "logits"}));
  if (c.bias) g->nodes.push_back(make("Add", {"mm", "bias"}, {"logits"}));
  autodiff::LossSpec spec;
  ir::ValueInfo out;
  if (c.eps > 0) {  // the trainer's label-smoothed cross-entropy (mean over non-ignored rows)
    spec.kind = autodiff::LossSpec::Kind::CrossEntropy;
    spec.output = "logits";
    spec.labels = "labels";
    spec.ignore_index = -100;
    spec.label_smoothing = c.eps;
    out.name = "logits";
  } else {
    auto l = make("SoftmaxCrossEntropyLoss", {"logits", "labels"}, {"loss"});
    l.attrs["reduction"] = attr_s(c.reduction);
    l.attrs["ignore_index"] = attr_i(-100);
    g->nodes.push_back(l);
    spec.kind = autodiff::LossSpec::Kind::GraphOutput;
    spec.output = "loss";
    out.name = "loss";
  }
  g->outputs.push_back(out);
  return train(g, in, spec);
}

ir::Node lce_node(const LceCase& c, bool grads) {
  std::vector<std::string> in{"H", "W", "labels"};
  if (c.bias) in.push_back("bias");
  std::vector<std::string> out{"loss"};
  if (grads) {
    out.push_back("dH");
    out.push_back("dW");
    if (c.bias) out.push_back("dbias");
  }
  ir::Node n = make("LinearCrossEntropy", in, out, "onyx");
  n.attrs["transB"] = attr_i(c.transB);
  n.attrs["reduction"] = attr_s(c.reduction);
  n.attrs["ignore_index"] = attr_i(-100);
  if (c.chunk_rows) n.attrs["chunk_rows"] = attr_i(c.chunk_rows);
  if (c.eps > 0) n.attrs["label_smoothing"] = attr_f(c.eps);
  return n;
}

std::vector<Tensor> run_lce(const LceCase& c, const Inputs& in, bool grads) {
  std::vector<Tensor> args{in.H, in.W, in.labels};
  if (c.bias) args.push_back(in.bias);
  return run_node(lce_node(c, grads), 1, args);
}

void expect_close(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  auto a = got.to_double_vector(), b = want.to_double_vector();
  double scale = 0;
  for (double v : b) scale = std::max(scale, std::fabs(v));
  for (size_t i = 0; i < a.size(); i++)
    ASSERT_NEAR(a[i], b[i], 2e-5 * scale + 1e-7) << what << "[" << i << "]";
}

void expect_loss(double got, double want) {
  if (std::isnan(want)) {
    EXPECT_TRUE(std::isnan(got)) << got;
    return;
  }
  EXPECT_NEAR(got, want, 1e-5 * std::fabs(want) + 1e-7);
}

class LinearCrossEntropy : public ::testing::TestWithParam<LceCase> {};

TEST_P(LinearCrossEntropy, MatchesUnfusedGraph) {
  const LceCase& c = GetParam();
  Inputs in = make_inputs(c);
  Result ref = reference(c, in);
  auto out = run_lce(c, in, true);
  expect_loss(out[0].get_as_double(0), ref.loss);
  expect_close(out[1], ref.dH, "dH");
  expect_close(out[2], ref.dW, "dW");
  if (c.bias) expect_close(out[3], ref.dbias, "dbias");
  // Loss only (evaluation): the same loss, no gradient work.
  auto lo = run_lce(c, in, false);
  ASSERT_EQ(lo.size(), 1u);
  expect_loss(lo[0].get_as_double(0), ref.loss);
  // Deterministic for a thread count.
  auto again = run_lce(c, in, true);
  for (size_t i = 0; i < out.size(); i++)
    EXPECT_EQ(0, std::memcmp(out[i].data<float>(), again[i].data<float>(),
                             out[i].numel() * sizeof(float)));
}

// The fused op inside a training graph: the rule asks for the saved gradients and, with the unit
// seed, adds no scaling node.
TEST_P(LinearCrossEntropy, ThroughAutodiff) {
  const LceCase& c = GetParam();
  Inputs in = make_inputs(c);
  Result ref = reference(c, in);
  auto g = base_graph(in);
  g->nodes.push_back(lce_node(c, false));
  ir::ValueInfo out;
  out.name = "loss";
  g->outputs.push_back(out);
  Result got = train(g, in, autodiff::LossSpec{});
  expect_loss(got.loss, ref.loss);
  expect_close(got.dH, ref.dH, "dH");
  expect_close(got.dW, ref.dW, "dW");
  if (c.bias) expect_close(got.dbias, ref.dbias, "dbias");
}

INSTANTIATE_TEST_SUITE_P(
    Cases, LinearCrossEntropy,
    ::testing::Values(LceCase{"one_chunk", 6, 8, 11, true, false, "mean", 0, 0, 0},
                      LceCase{"transB0_sum", 6, 8, 11, false, false, "sum", 0, 0, 0},
                      LceCase{"bias_ignored", 9, 5, 13, true, true, "mean", 3, 0, 0},
                      LceCase{"all_ignored_mean", 5, 4, 7, true, true, "mean", 1, 0, 0},
                      LceCase{"all_ignored_sum", 5, 4, 7, false, false, "sum", 1, 2, 0},
                      LceCase{"chunks_contiguous", 50, 16, 37, true, false, "mean", 0, 8, 0},
                      LceCase{"chunks_ignored_gathered", 50, 16, 37, true, true, "mean", 4, 7, 0},
                      LceCase{"chunks_transB0", 33, 12, 45, false, true, "sum", 5, 4, 0},
                      LceCase{"chunk_one_row", 7, 9, 19, true, true, "mean", 2, 1, 0},
                      LceCase{"large_vocab_auto_chunk", 300, 32, 1003, true, false, "mean", 7, 0,
                              0},
                      LceCase{"label_smoothing", 20, 8, 29, true, true, "mean", 3, 6, 0.1f}),
    [](const ::testing::TestParamInfo<LceCase>& info) { return std::string(info.param.name); });

TEST(LinearCrossEntropyKernel, RejectsLabelOutOfRange) {
  LceCase c{"bad", 4, 3, 5, true, false, "mean", 0, 0, 0};
  Inputs in = make_inputs(c);
  in.labels.data<int64_t>()[2] = 5;
  try {
    run_lce(c, in, true);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("LinearCrossEntropy"), std::string::npos) << m;
    EXPECT_NE(m.find("label 5 at row 2"), std::string::npos) << m;
  }
}

TEST(LinearCrossEntropyKernel, RejectsMismatchedShapes) {
  LceCase c{"bad", 4, 3, 5, true, false, "mean", 0, 0, 0};
  Inputs in = make_inputs(c);
  in.W = rand_f32({5, 4}, 9);
  EXPECT_THROW(run_lce(c, in, true), Error);
}

}  // namespace
