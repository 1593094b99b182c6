// test_dropout_grad.cc — Dropout's gradient in training mode. A random mask cannot be checked by
// finite differences in general, so these tests build the training graph of
//   y = Dropout(x, ratio, training_mode);  loss = sum(y * w)     (so dy = w)
// expose the mask the forward drew, and check dx == dy * mask / (1 - ratio) element by element,
// with training_mode constant, absent ratio (default 0.5), training_mode as a run-time input, and
// runs that are not training runs (identity).
#include <gtest/gtest.h>

#include <random>

#include "autodiff/gradient.h"
#include "runtime/session.h"

using namespace onyx;
using autodiff::attr_i;

namespace {

Tensor random_tensor(const Shape& s, uint32_t seed) {
  Tensor t(DType::Float32, s);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  for (int64_t i = 0; i < t.numel(); i++) t.data<float>()[i] = u(rng);
  return t;
}

Tensor bool_scalar(bool v) { return Tensor::from_vector<uint8_t>(DType::Bool, {}, {(uint8_t)v}); }

// training: 1 or 0 = constant initializer, -1 = bool graph input "training"; ratio < 0: absent.
struct Model {
  std::shared_ptr<ir::Graph> g;
  Tensor x, w;
};

Model make_model(const Shape& shape, float ratio, int training) {
  Model m;
  m.g = std::make_shared<ir::Graph>();
  m.g->opsets[""] = 13;
  m.x = random_tensor(shape, 1);
  m.w = random_tensor(shape, 2);
  m.g->add_initializer("x", m.x);
  m.g->add_initializer("w", m.w);
  ir::Node d;
  d.name = "drop";
  d.op_type = "Dropout";
  d.inputs = {"x", "", ""};
  if (ratio >= 0) {
    m.g->add_initializer("ratio", Tensor::scalar_f32(ratio));
    d.inputs[1] = "ratio";
  }
  if (training >= 0) {
    m.g->add_initializer("training", bool_scalar(training == 1));
  } else {
    ir::ValueInfo vi;
    vi.name = "training";
    vi.dtype = DType::Bool;
    vi.shape = {};
    m.g->inputs.push_back(vi);
  }
  d.inputs[2] = "training";
  d.outputs = {"y"};
  ir::Node mul;
  mul.name = "mul";
  mul.op_type = "Mul";
  mul.inputs = {"y", "w"};
  mul.outputs = {"yw"};
  ir::Node sum;
  sum.name = "sum";
  sum.op_type = "ReduceSum";
  sum.inputs = {"yw"};
  sum.outputs = {"loss"};
  sum.attrs["keepdims"] = attr_i(0);
  m.g->nodes = {d, mul, sum};
  ir::ValueInfo lo;
  lo.name = "loss";
  lo.dtype = DType::Float32;
  m.g->outputs.push_back(lo);
  return m;
}

struct Result {
  Tensor y, mask, dx;
};

// Builds the training graph, adds y and the saved mask to its outputs, runs it.
Result run_training(const Model& m, const std::map<std::string, Tensor>& inputs, uint64_t seed = 0,
                    bool training_run = true) {
  std::map<std::string, TensorMeta> sig;
  for (auto& [k, v] : inputs) sig[k] = v.meta();
  autodiff::GradientOptions opts;
  opts.trainable = {"x"};
  auto tg = autodiff::build_training_graph(*m.g, sig, opts);
  EXPECT_EQ(tg.gradients.size(), 1u);
  std::string mask;
  for (auto& n : tg.graph->nodes)
    if (n.op_type == "Dropout" && n.outputs.size() > 1) mask = n.outputs[1];
  for (std::string name : {std::string("y"), mask}) {
    if (name.empty()) continue;
    ir::ValueInfo vi;
    vi.name = name;
    tg.graph->outputs.push_back(vi);
  }
  runtime::Session s(tg.graph, {"x"});
  runtime::RunOptions ro;
  ro.training = training_run;  // a training run: Dropout applies where the node asks for it
  ro.seed = seed;
  auto out = s.run(inputs, ro);
  Result r;
  r.y = out.at("y");
  if (!mask.empty()) r.mask = out.at(mask);
  r.dx = out.at(tg.gradients[0].second);
  return r;
}

// dx == dy * mask * (float)(1 / (1 - ratio)) and y == x * mask * scale; returns the kept fraction.
double check_masked(const Model& m, const Result& r, double ratio) {
  EXPECT_TRUE(r.mask.defined());
  EXPECT_EQ(r.mask.dtype(), DType::Bool);
  const float scale = (float)(1.0 / (1.0 - ratio));
  int64_t n = m.x.numel(), kept = 0;
  const bool* mk = r.mask.data<bool>();
  for (int64_t i = 0; i < n; i++) {
    float dy = m.w.data<float>()[i];
    float expect_dx = mk[i] ? dy * scale : 0.0f;
    float expect_y = mk[i] ? m.x.data<float>()[i] * scale : 0.0f;
    EXPECT_FLOAT_EQ(r.dx.data<float>()[i], expect_dx) << "element " << i;
    EXPECT_FLOAT_EQ(r.y.data<float>()[i], expect_y) << "element " << i;
    kept += mk[i];
  }
  return (double)kept / (double)n;
}

}  // namespace

TEST(DropoutGrad, TrainingConstantUsesForwardMask) {
  Model m = make_model({7, 33}, 0.3f, 1);  // 231 elements: vector body and scalar tail
  Result r = run_training(m, {});
  double kept = check_masked(m, r, 0.3);
  EXPECT_GT(kept, 0.55);
  EXPECT_LT(kept, 0.85);
}

TEST(DropoutGrad, DefaultRatioIsHalf) {
  Model m = make_model({16, 64}, -1.0f, 1);
  Result r = run_training(m, {});
  double kept = check_masked(m, r, 0.5);
  EXPECT_GT(kept, 0.4);
  EXPECT_LT(kept, 0.6);
}

TEST(DropoutGrad, SeedChangesMaskNotTheRule) {
  Model m = make_model({8, 40}, 0.25f, 1);
  Result a = run_training(m, {}, 1);
  Result b = run_training(m, {}, 2);
  check_masked(m, a, 0.25);
  check_masked(m, b, 0.25);
  int64_t diff = 0;
  for (int64_t i = 0; i < m.x.numel(); i++)
    diff += a.mask.data<bool>()[i] != b.mask.data<bool>()[i];
  EXPECT_GT(diff, 0);
  Result a2 = run_training(m, {}, 1);  // same seed: same mask, bit for bit
  for (int64_t i = 0; i < m.x.numel(); i++)
    EXPECT_EQ(a.dx.data<float>()[i], a2.dx.data<float>()[i]);
}

TEST(DropoutGrad, TrainingModeAsRuntimeInput) {
  Model m = make_model({5, 50}, 0.4f, -1);
  Result on = run_training(m, {{"training", bool_scalar(true)}});
  double kept = check_masked(m, on, 0.4);
  EXPECT_LT(kept, 0.8);
  Result off = run_training(m, {{"training", bool_scalar(false)}});
  for (int64_t i = 0; i < m.x.numel(); i++) {
    EXPECT_EQ(off.dx.data<float>()[i], m.w.data<float>()[i]);  // identity: dx = dy exactly
    EXPECT_EQ(off.y.data<float>()[i], m.x.data<float>()[i]);
  }
}

TEST(DropoutGrad, TrainingFalseConstantIsIdentity) {
  Model m = make_model({3, 9}, 0.5f, 0);
  Result r = run_training(m, {});
  EXPECT_FALSE(r.mask.defined());  // no mask requested: the rule passes dy through
  for (int64_t i = 0; i < m.x.numel(); i++) EXPECT_EQ(r.dx.data<float>()[i], m.w.data<float>()[i]);
}

TEST(DropoutGrad, RatioZeroIsIdentity) {
  Model m = make_model({4, 17}, 0.0f, 1);
  Result r = run_training(m, {});
  for (int64_t i = 0; i < m.x.numel(); i++) {
    EXPECT_EQ(r.dx.data<float>()[i], m.w.data<float>()[i]);
    EXPECT_EQ(r.y.data<float>()[i], m.x.data<float>()[i]);
  }
}

// The training graph evaluated in a run that is not a training run (RunOptions::training false):
// the forward is the identity although the node asks for training, so the gradient must be too.
TEST(DropoutGrad, EvalRunIsIdentity) {
  for (int training : {1, -1}) {
    Model m = make_model({6, 21}, 0.3f, training);
    std::map<std::string, Tensor> in;
    if (training < 0) in["training"] = bool_scalar(true);
    Result r = run_training(m, in, 0, /*training_run=*/false);
    for (int64_t i = 0; i < m.x.numel(); i++) {
      EXPECT_EQ(r.dx.data<float>()[i], m.w.data<float>()[i]);
      EXPECT_EQ(r.y.data<float>()[i], m.x.data<float>()[i]);
    }
  }
}
