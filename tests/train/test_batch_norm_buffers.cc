// test_batch_norm_buffers.cc — BatchNormalization running statistics as buffers (PyTorch's
// semantics): not trainable (autodiff::batch_norm_buffers, trainable_parameters), updated by each
// training forward with the momentum rule (ONNX's population variance, or the unbiased one on
// request), read by evaluation in inference mode, saved by Trainer::save_model and restored by
// resume; passes::batch_norm_to_inference for export.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>

#include "autodiff/gradient.h"
#include "data/dataset.h"
#include "io/safetensors.h"
#include "kernels/cpu/gemm.h"
#include "onyx/trainer.h"
#include "passes/inference_export.h"
#include "train/training_session.h"

using namespace onyx;
namespace fs = std::filesystem;

namespace {

constexpr int64_t N = 4, C = 2, S = 3;
constexpr float kMomentum = 0.8f, kEps = 1e-5f;

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

// x (N, C, S) -> BatchNormalization(training_mode=1) -> y; loss = mean((y - t)^2). `outputs`: the
// BatchNormalization's outputs as the TorchScript exporter writes them (Y, running_mean,
// running_var, unread), or Y alone.
std::shared_ptr<ir::Graph> bn_graph(bool three_outputs = true, bool training = true) {
  auto g = std::make_shared<ir::Graph>();
  g->opsets[""] = 15;
  for (auto name : {"x", "t"}) {
    ir::ValueInfo v;
    v.name = name;
    v.dtype = DType::Float32;
    g->inputs.push_back(v);
  }
  g->add_initializer("bn.weight", Tensor::from_vector<float>(DType::Float32, {C}, {1.0f, 0.5f}));
  g->add_initializer("bn.bias", Tensor::from_vector<float>(DType::Float32, {C}, {0.0f, 0.1f}));
  g->add_initializer("bn.running_mean",
                     Tensor::from_vector<float>(DType::Float32, {C}, {0.2f, -0.1f}));
  g->add_initializer("bn.running_var",
                     Tensor::from_vector<float>(DType::Float32, {C}, {1.0f, 1.5f}));
  std::map<std::string, ir::Attribute> a{{"momentum", autodiff::attr_f(kMomentum)},
                                         {"epsilon", autodiff::attr_f(kEps)}};
  if (training) a["training_mode"] = autodiff::attr_i(1);
  std::vector<std::string> outs{"y"};
  if (three_outputs && training) outs = {"y", "bn_mean_out", "bn_var_out"};
  g->nodes.push_back(node("BatchNormalization",
                          {"x", "bn.weight", "bn.bias", "bn.running_mean", "bn.running_var"}, outs,
                          a));
  g->nodes.push_back(node("Sub", {"y", "t"}, {"d"}));
  g->nodes.push_back(node("Mul", {"d", "d"}, {"d2"}));
  g->nodes.push_back(node("ReduceMean", {"d2"}, {"loss"}, {{"keepdims", autodiff::attr_i(0)}}));
  for (auto name : {"loss", "y"}) {
    ir::ValueInfo v;
    v.name = name;
    v.dtype = DType::Float32;
    g->outputs.push_back(v);
  }
  return g;
}

std::map<std::string, Tensor> batch(uint32_t seed, int64_t n = N) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.5f, 2.0f);
  Tensor x(DType::Float32, {n, C, S}), t(DType::Float32, {n, C, S});
  for (int64_t i = 0; i < x.numel(); i++) x.data<float>()[i] = d(rng);
  for (int64_t i = 0; i < t.numel(); i++) t.data<float>()[i] = 0.3f * d(rng);
  return {{"x", x}, {"t", t}};
}

// Per channel: batch mean and population variance of x (N, C, S), in double.
void batch_stats(const Tensor& x, std::vector<double>& mean, std::vector<double>& var) {
  int64_t n = x.dim(0);
  mean.assign(C, 0);
  var.assign(C, 0);
  for (int64_t c = 0; c < C; c++) {
    double s = 0, ss = 0;
    for (int64_t i = 0; i < n; i++)
      for (int64_t k = 0; k < S; k++) s += x.data<float>()[(i * C + c) * S + k];
    mean[c] = s / (double)(n * S);
    for (int64_t i = 0; i < n; i++)
      for (int64_t k = 0; k < S; k++) {
        double dv = x.data<float>()[(i * C + c) * S + k] - mean[c];
        ss += dv * dv;
      }
    var[c] = ss / (double)(n * S);
  }
}

// The running statistics after one training forward on x: ONNX's rule, with the population
// variance or (unbiased) PyTorch's n / (n - 1) correction.
void expect_updated(const Tensor& x, std::vector<double>& rm, std::vector<double>& rv,
                    train::TrainingSession& ts, bool unbiased) {
  std::vector<double> m, v;
  batch_stats(x, m, v);
  double count = (double)(x.dim(0) * S);
  for (int64_t c = 0; c < C; c++) {
    rm[c] = rm[c] * kMomentum + m[c] * (1 - kMomentum);
    rv[c] = rv[c] * kMomentum + v[c] * (unbiased ? count / (count - 1) : 1.0) * (1 - kMomentum);
    EXPECT_NEAR(ts.buffer("bn.running_mean").data<float>()[c], rm[c], 1e-6) << "channel " << c;
    EXPECT_NEAR(ts.buffer("bn.running_var").data<float>()[c], rv[c], 1e-6) << "channel " << c;
  }
}

std::string tmpdir(const std::string& name) {
  auto p = fs::temp_directory_path() / ("onyx_bn_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(p);
  return p.string();
}

}  // namespace

TEST(BatchNormBuffers, RunningStatisticsAreBuffersNotParameters) {
  auto g = bn_graph();
  EXPECT_EQ(autodiff::batch_norm_buffers(*g),
            (std::vector<std::string>{"bn.running_mean", "bn.running_var"}));
  EXPECT_EQ(autodiff::trainable_parameters(*g, {}),
            (std::vector<std::string>{"bn.weight", "bn.bias"}));
  // An initializer read by anything else as well is a parameter like any other.
  g->nodes.push_back(node("Add", {"loss", "bn.running_var"}, {"unused"}));
  EXPECT_EQ(autodiff::batch_norm_buffers(*g), (std::vector<std::string>{"bn.running_mean"}));
  auto p = autodiff::trainable_parameters(*g, {});
  EXPECT_EQ(p, (std::vector<std::string>{"bn.weight", "bn.bias", "bn.running_var"}));
  // Inference-mode BatchNormalization (e.g. torch's dynamo export): still buffers.
  EXPECT_EQ(autodiff::batch_norm_buffers(*bn_graph(true, false)).size(), 2u);
}

TEST(BatchNormBuffers, EachTrainingForwardUpdatesThemAndEvaluationReadsThem) {
  for (bool three_outputs : {true, false}) {
    for (bool unbiased : {false, true}) {
      SCOPED_TRACE(testing::Message()
                   << "three outputs " << three_outputs << ", unbiased " << unbiased);
      train::TrainingSession ts(bn_graph(three_outputs), {});
      ts.set_unbiased_running_var(unbiased);
      EXPECT_EQ(ts.parameters(), (std::vector<std::string>{"bn.weight", "bn.bias"}));
      ASSERT_EQ(ts.buffers().size(), 2u);
      std::vector<double> rm{0.2, -0.1}, rv{1.0, 1.5};
      // Two micro-batches of one step (accumulate), then one more step: three updates in order,
      // each reading the previous one's statistics.
      auto b1 = batch(1), b2 = batch(2), b3 = batch(3, 2);
      ts.forward_backward(b1, false);
      expect_updated(b1.at("x"), rm, rv, ts, unbiased);
      ts.forward_backward(b2, true);
      expect_updated(b2.at("x"), rm, rv, ts, unbiased);
      ts.forward_backward(b3, false);  // another signature: another training graph
      expect_updated(b3.at("x"), rm, rv, ts, unbiased);
      // Evaluation: inference mode with the updated statistics, which it does not change.
      auto e = batch(4);
      auto out = ts.forward(e);
      const Tensor& x = e.at("x");
      const Tensor& t = e.at("t");
      double want = 0;
      const float scale[] = {1.0f, 0.5f}, bias[] = {0.0f, 0.1f};
      for (int64_t i = 0; i < x.numel(); i++) {
        int64_t c = (i / S) % C;
        double y = (x.data<float>()[i] - rm[c]) / std::sqrt(rv[c] + kEps) * scale[c] + bias[c];
        EXPECT_NEAR(out.at("y").data<float>()[i], y, 1e-5);
        want += (y - t.data<float>()[i]) * (y - t.data<float>()[i]);
      }
      EXPECT_NEAR(out.at("loss").get_as_double(0), want / (double)x.numel(), 1e-5);
      EXPECT_NEAR(ts.buffer("bn.running_mean").data<float>()[0], rm[0], 1e-6);
    }
  }
}

TEST(BatchNormBuffers, InferenceGraphNormalizesWithTheRunningStatistics) {
  ir::Graph g = *bn_graph();
  EXPECT_EQ(passes::batch_norm_to_inference(g), 1);
  EXPECT_FALSE(g.nodes[0].has_attr("training_mode"));
  EXPECT_EQ(g.nodes[0].outputs, (std::vector<std::string>{"y"}));
  passes::InferenceExportOptions o;
  o.loss_output = "loss";
  ir::Graph inf = passes::make_inference_graph(*bn_graph(), o);
  ASSERT_EQ(inf.nodes.size(), 1u);
  EXPECT_EQ(inf.nodes[0].outputs.size(), 1u);
  EXPECT_EQ(inf.nodes[0].attr_int("training_mode", 0), 0);
  // Statistics read by the graph cannot be dropped.
  ir::Graph read = *bn_graph();
  read.nodes.push_back(node("Identity", {"bn_mean_out"}, {"m"}));
  EXPECT_THROW(passes::batch_norm_to_inference(read), Error);
}

TEST(BatchNormBuffers, TrainerSavesAndResumesThem) {
  auto data = [] {
    auto b = batch(5, 16);
    return std::make_shared<data::TensorDataset>(b);
  };
  auto args = [](const std::string& dir) {
    TrainingArguments a;
    a.output_dir = dir;
    a.learning_rate = 0.05;
    a.per_device_train_batch_size = 4;
    a.max_steps = 6;
    a.logging_steps = 2;
    a.save_strategy = "steps";
    a.save_steps = 3;
    a.disable_tqdm = true;
    a.train_sampling_strategy = "sequential";
    return a;
  };
  auto model = [] {
    Model m;
    m.graph = bn_graph();
    return m;
  };
  std::string dir = tmpdir("full");
  Trainer full(model(), args(dir), data());
  full.train();
  full.save_model(dir);
  auto saved = io::load_safetensors(dir + "/model.safetensors").tensors;
  auto mid = io::load_safetensors(dir + "/checkpoint-3/model.safetensors").tensors;
  for (auto name : {"bn.running_mean", "bn.running_var"}) {
    const Tensor& s = saved.at(name);
    const Tensor& b = full.session().buffer(name);
    const Tensor& init = bn_graph()->initializers.at(name);
    for (int64_t c = 0; c < C; c++) {
      EXPECT_EQ(s.data<float>()[c], b.data<float>()[c]) << name;
      EXPECT_NE(s.data<float>()[c], init.data<float>()[c]) << name << " never updated";
      EXPECT_NE(s.data<float>()[c], mid.at(name).data<float>()[c])
          << name << " not updated after step 3";
    }
  }
  // Resumed from checkpoint-3: the same statistics (and weights) bit for bit.
  std::string dir2 = tmpdir("resumed");
  auto a2 = args(dir2);
  a2.resume_from_checkpoint = dir + "/checkpoint-3";
  Trainer resumed(model(), a2, data());
  resumed.train();
  resumed.save_model(dir2);
  auto again = io::load_safetensors(dir2 + "/model.safetensors").tensors;
  ASSERT_EQ(again.size(), saved.size());
  for (auto& [name, t] : saved) {
    ASSERT_TRUE(again.count(name)) << name;
    EXPECT_EQ(std::memcmp(again.at(name).raw(), t.raw(), t.nbytes()), 0) << name;
  }
  fs::remove_all(dir);
  fs::remove_all(dir2);
}

// bf16_full_eval reads what model.to(torch.bfloat16) would hold: the trained parameters, a
// frozen weight and the running statistics all rounded to bf16 — the same outputs, bit for bit,
// as a model whose tensors were rounded beforehand — and changes none of them.
TEST(BatchNormBuffers, Bf16FullEvalRoundsFrozenWeightsAndRunningStatistics) {
  auto frozen_graph = [] {
    auto g = bn_graph();
    std::mt19937 rng(11);
    std::normal_distribution<float> d(0.0f, 0.7f);
    Tensor f(DType::Float32, {S, S});
    for (int64_t i = 0; i < f.numel(); i++) f.data<float>()[i] = d(rng);
    g->add_initializer("proj.weight", f);
    Tensor gate(DType::Float32, {S});
    for (int64_t i = 0; i < S; i++) gate.data<float>()[i] = 1.0f + d(rng);
    g->add_initializer("gate", gate);
    // y -> MatMul(y, proj.weight) * gate = z, and the loss reads z. (The MatMul rounds its
    // operands under bf16 anyway; the gate shows that the frozen tensors are rounded.)
    g->nodes.insert(g->nodes.begin() + 1, node("MatMul", {"y", "proj.weight"}, {"zm"}));
    g->nodes.insert(g->nodes.begin() + 2, node("Mul", {"zm", "gate"}, {"z"}));
    g->nodes[3].inputs[0] = "z";  // Sub(z, t)
    ir::ValueInfo v;
    v.name = "z";
    v.dtype = DType::Float32;
    g->outputs.push_back(v);
    return g;
  };
  autodiff::GradientOptions opts;
  opts.frozen = {"proj.weight", "gate"};
  auto g = frozen_graph();
  const Tensor frozen_before = g->initializers.at("proj.weight").clone();
  train::TrainingSession ts(g, opts);
  ts.forward_backward(batch(1), false);  // running statistics no longer bf16 values
  const Tensor stats_before = ts.buffer("bn.running_var").clone();
  ts.set_bf16_full_eval(true);
  auto e = batch(4);
  auto full = ts.forward(e);

  // The same model with its tensors rounded to bf16 beforehand, run with bf16 GEMM inputs.
  auto reference = [&](bool round_frozen) {
    auto r = frozen_graph();
    auto put = [&](const std::string& name, const Tensor& t, bool round) {
      Tensor c = t.clone();
      if (round) kernels::round_to_bf16(c.data<float>(), c.data<float>(), c.numel());
      r->initializers[name] = c;
    };
    for (auto& p : ts.parameters()) put(p, ts.params().view(p), true);
    for (auto& [b, t] : ts.buffers()) put(b, t, true);
    put("proj.weight", g->initializers.at("proj.weight"), round_frozen);
    put("gate", g->initializers.at("gate"), round_frozen);
    train::TrainingSession rs(r, opts);
    rs.set_bf16_gemm(true);
    return rs.forward(e);
  };
  auto want = reference(true);
  auto unrounded_frozen = reference(false);
  ASSERT_EQ(full.at("z").numel(), want.at("z").numel());
  int differs = 0;
  for (int64_t i = 0; i < want.at("z").numel(); i++) {
    EXPECT_EQ(full.at("z").data<float>()[i], want.at("z").data<float>()[i]) << "element " << i;
    differs += unrounded_frozen.at("z").data<float>()[i] != want.at("z").data<float>()[i];
  }
  EXPECT_EQ(full.at("loss").get_as_double(0), want.at("loss").get_as_double(0));
  EXPECT_GT(differs, 0) << "rounding the frozen weight changed nothing: the check cannot fail";
  // Nothing rounded in place.
  EXPECT_EQ(std::memcmp(g->initializers.at("proj.weight").raw(), frozen_before.raw(),
                        frozen_before.nbytes()),
            0);
  EXPECT_EQ(
      std::memcmp(ts.buffer("bn.running_var").raw(), stats_before.raw(), stats_before.nbytes()), 0);
}
