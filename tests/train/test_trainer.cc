// test_trainer.cc — Trainer behaviour through the C++ API: callback events and control flags,
// EarlyStoppingCallback, gradient accumulation equal to one big batch, the non-finite-gradient
// guard, and metrics.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <random>

#include "autodiff/gradient.h"
#include "data/dataset.h"
#include "onyx/trainer.h"
#include "train/training_session.h"

using namespace onyx;
namespace fs = std::filesystem;

namespace {

ir::Node node(const std::string& op, std::vector<std::string> in, std::string out,
              std::map<std::string, ir::Attribute> attrs = {}) {
  ir::Node n;
  n.name = op + "_" + out;
  n.op_type = op;
  n.inputs = std::move(in);
  n.outputs = {out};
  n.attrs = std::move(attrs);
  return n;
}

// Linear regression: y = x W + b, loss = mean((y - t)^2), outputs loss and y.
Model linear_model() {
  auto g = std::make_shared<ir::Graph>();
  g->opsets[""] = 17;
  for (auto [name, dt] : {std::pair{"x", DType::Float32}, std::pair{"t", DType::Float32}}) {
    ir::ValueInfo v;
    v.name = name;
    v.dtype = dt;
    g->inputs.push_back(v);
  }
  g->add_initializer("W", Tensor::from_vector<float>(DType::Float32, {3, 1}, {0.1f, -0.2f, 0.3f}));
  g->add_initializer("b", Tensor::from_vector<float>(DType::Float32, {1}, {0.0f}));
  g->nodes.push_back(node("MatMul", {"x", "W"}, "xw"));
  g->nodes.push_back(node("Add", {"xw", "b"}, "y"));
  g->nodes.push_back(node("Sub", {"y", "t"}, "d"));
  g->nodes.push_back(node("Mul", {"d", "d"}, "d2"));
  g->nodes.push_back(node("ReduceMean", {"d2"}, "loss", {{"keepdims", autodiff::attr_i(0)}}));
  for (auto name : {"loss", "y"}) {
    ir::ValueInfo v;
    v.name = name;
    v.dtype = DType::Float32;
    g->outputs.push_back(v);
  }
  Model m;
  m.graph = g;
  m.predictions = "y";
  return m;
}

std::shared_ptr<data::TensorDataset> regression_data(int n, bool with_nan = false) {
  std::mt19937 rng(7);
  std::normal_distribution<float> d;
  Tensor x(DType::Float32, {n, 3}), t(DType::Float32, {n, 1});
  for (int i = 0; i < n; i++) {
    float s = 0;
    for (int k = 0; k < 3; k++) {
      x.data<float>()[i * 3 + k] = d(rng);
      s += x.data<float>()[i * 3 + k] * (k + 1);
    }
    t.data<float>()[i] = s + 0.5f;
  }
  if (with_nan) x.data<float>()[0] = NAN;
  return std::make_shared<data::TensorDataset>(std::map<std::string, Tensor>{{"x", x}, {"t", t}});
}

std::string tmpdir(const std::string& name) {
  auto p = fs::temp_directory_path() / ("onyx_trainer_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(p);
  return p.string();
}

struct Recorder : TrainerCallback {
  std::vector<std::string> events;
  int stop_at = -1;
  void on_train_begin(const TrainingArguments&, TrainerState&, TrainerControl&) override {
    events.push_back("train_begin");
  }
  void on_epoch_begin(const TrainingArguments&, TrainerState&, TrainerControl&) override {
    events.push_back("epoch_begin");
  }
  void on_step_end(const TrainingArguments&, TrainerState& s, TrainerControl& c) override {
    events.push_back("step_end");
    if (s.global_step == stop_at) c.should_training_stop = true;
  }
  void on_log(const TrainingArguments&, TrainerState&, TrainerControl&, const LogEntry&) override {
    events.push_back("log");
  }
  void on_evaluate(const TrainingArguments&, TrainerState&, TrainerControl&,
                   const Metrics&) override {
    events.push_back("evaluate");
  }
  void on_save(const TrainingArguments&, TrainerState&, TrainerControl&) override {
    events.push_back("save");
  }
  void on_train_end(const TrainingArguments&, TrainerState&, TrainerControl&) override {
    events.push_back("train_end");
  }
};

TrainingArguments base_args(const std::string& dir) {
  TrainingArguments a;
  a.output_dir = dir;
  a.learning_rate = 0.05;
  a.per_device_train_batch_size = 8;
  a.num_train_epochs = 2;
  a.logging_steps = 2;
  a.save_strategy = "no";
  a.disable_tqdm = true;
  a.train_sampling_strategy = "sequential";
  return a;
}

}  // namespace

TEST(Trainer, CallbackEventsAndStopFlag) {
  auto a = base_args(tmpdir("events"));
  a.eval_strategy = "epoch";
  a.save_strategy = "epoch";
  auto rec = std::make_shared<Recorder>();
  rec->stop_at = 5;
  Trainer t(linear_model(), a, regression_data(32), regression_data(16), nullptr, {rec});
  auto out = t.train();
  EXPECT_EQ(out.global_step, 5) << "should_training_stop ends training after step 5";
  auto& ev = rec->events;
  EXPECT_EQ(ev.front(), "train_begin");
  EXPECT_EQ(ev.back(), "train_end");
  EXPECT_EQ(std::count(ev.begin(), ev.end(), "step_end"), 5);
  EXPECT_EQ(std::count(ev.begin(), ev.end(), "epoch_begin"), 2);
  EXPECT_GE(std::count(ev.begin(), ev.end(), "evaluate"), 1);
  EXPECT_GE(std::count(ev.begin(), ev.end(), "save"), 1);
  EXPECT_TRUE(fs::exists(fs::path(a.output_dir) / "checkpoint-4" / "trainer_state.json"));
  fs::remove_all(a.output_dir);
}

// Transformers logs the learning rate the logged step applied (read before lr_scheduler.step()):
// lr 0.1 with linear decay over 3 steps logs 0.1, 0.0667, 0.0333.
TEST(Trainer, LogsTheLearningRateTheStepApplied) {
  auto a = base_args(tmpdir("lr_logged"));
  a.learning_rate = 0.1;
  a.lr_scheduler_type = "linear";
  a.max_steps = 3;
  a.logging_steps = 1;
  Trainer t(linear_model(), a, regression_data(32));
  t.train();
  std::vector<double> lrs;
  for (auto& e : t.state().log_history)
    if (e.values.count("learning_rate")) lrs.push_back(e.values.at("learning_rate"));
  ASSERT_EQ(lrs.size(), 3u);
  EXPECT_NEAR(lrs[0], 0.1, 1e-12);
  EXPECT_NEAR(lrs[1], 0.1 * 2 / 3, 1e-12);
  EXPECT_NEAR(lrs[2], 0.1 / 3, 1e-12);
  fs::remove_all(a.output_dir);
}

TEST(Trainer, LossDecreasesAndLogsHaveTransformersKeys) {
  auto a = base_args(tmpdir("keys"));
  a.num_train_epochs = 20;
  Trainer t(linear_model(), a, regression_data(64));
  auto out = t.train();
  const auto& h = t.state().log_history;
  ASSERT_GE(h.size(), 3u);
  EXPECT_TRUE(h.front().values.count("loss") && h.front().values.count("grad_norm") &&
              h.front().values.count("learning_rate"));
  EXPECT_TRUE(h.back().values.count("train_runtime") && h.back().values.count("train_loss") &&
              h.back().values.count("train_samples_per_second"));
  EXPECT_LT(h[h.size() - 2].values.at("loss"), h.front().values.at("loss") * 0.2);
  fs::remove_all(a.output_dir);
}

TEST(Trainer, EarlyStoppingStopsWhenTheMetricStopsImproving) {
  auto a = base_args(tmpdir("early"));
  a.learning_rate = 0.0;  // nothing improves after the first evaluation
  a.num_train_epochs = 50;
  a.eval_strategy = "steps";
  a.eval_steps = 2;
  a.metric_for_best_model = "loss";  // required, as Transformers asserts
  auto es = std::make_shared<EarlyStoppingCallback>(2, 0.0);
  Trainer t(linear_model(), a, regression_data(32), regression_data(8), nullptr, {es});
  auto out = t.train();
  EXPECT_EQ(out.global_step, 6) << "evals at 2 (best), 4, 6 (patience 2 exhausted)";
  fs::remove_all(a.output_dir);
}

TEST(Trainer, GradientAccumulationEqualsOneBigBatch) {
  auto run = [](int64_t batch, int64_t ga) {
    auto a = base_args(tmpdir("ga"));
    a.per_device_train_batch_size = batch;
    a.gradient_accumulation_steps = ga;
    a.num_train_epochs = 3;
    a.max_grad_norm = 0;
    Trainer t(linear_model(), a, regression_data(32));
    t.train();
    std::vector<float> w(t.session().params().view("W").data<float>(),
                         t.session().params().view("W").data<float>() + 3);
    fs::remove_all(a.output_dir);
    return w;
  };
  auto big = run(8, 1), acc = run(4, 2);
  for (int i = 0; i < 3; i++) EXPECT_NEAR(big[i], acc[i], 1e-5);
}

TEST(Trainer, NonFiniteGradientsSkipTheStepAndTrainingGoesOn) {
  auto a = base_args(tmpdir("nan"));
  a.num_train_epochs = 1;
  Trainer t(linear_model(), a, regression_data(32, /*with_nan=*/true));
  auto out = t.train();
  EXPECT_EQ(out.global_step, 4);
  int skipped = 0;
  for (auto& e : t.state().log_history) skipped += e.values.count("skipped_nonfinite_step");
  EXPECT_EQ(skipped, 1);
  const Tensor& w = t.session().params().view("W");
  for (int i = 0; i < 3; i++) EXPECT_TRUE(std::isfinite(w.data<float>()[i]));
  fs::remove_all(a.output_dir);
}

TEST(Trainer, Metrics) {
  Tensor logits = Tensor::from_vector<float>(DType::Float32, {4, 2}, {1, 0, 0, 1, 1, 0, 0, 1});
  Tensor labels = Tensor::from_vector<int64_t>(DType::Int64, {4}, {0, 1, 1, -100});
  auto acc = metrics::accuracy({logits, labels});
  EXPECT_NEAR(acc["accuracy"], 2.0 / 3.0, 1e-12);
  auto f1 = metrics::f1({logits, labels});
  EXPECT_NEAR(f1["f1"], (2.0 / 3.0 + 2.0 / 3.0) / 2, 1e-12);
  EXPECT_THROW(metrics::by_names({"bleu"}), Error);
}

// Transformers' get_length_grouped_indices on onyx's permutation: 100 samples in batches of 4 ->
// megabatches of min(100 / 16, 50) = 6 batches (24 samples), each sorted longest first, the
// longest sample of all at the very front; a pure function of (seed, epoch).
TEST(Sampling, LengthGroupedOrder) {
  std::vector<int64_t> lengths(100);
  for (int i = 0; i < 100; i++) lengths[i] = (i * 37) % 23 + 1 + (i == 71 ? 100 : 0);
  auto order = data::length_grouped_order(lengths, 4, 9, 2);
  std::vector<int64_t> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  for (int i = 0; i < 100; i++) ASSERT_EQ(sorted[i], i);
  EXPECT_EQ(order[0], 71);
  // the permutation it groups is epoch_order's: same megabatch contents
  auto perm = data::epoch_order(100, true, 9, 2);
  for (int s = 0; s < 100; s += 24) {
    std::vector<int64_t> a(order.begin() + s, order.begin() + std::min(100, s + 24));
    std::vector<int64_t> b(perm.begin() + s, perm.begin() + std::min(100, s + 24));
    if (std::find(b.begin(), b.end(), 71) != b.end() || s == 0) continue;  // (the swap)
    for (size_t i = 1; i < a.size(); i++) EXPECT_GE(lengths[a[i - 1]], lengths[a[i]]) << s;
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
    EXPECT_EQ(a, b) << "megabatch at " << s;
  }
  EXPECT_EQ(order, data::length_grouped_order(lengths, 4, 9, 2));
  EXPECT_NE(order, data::length_grouped_order(lengths, 4, 9, 3));
}

// BatchRebalanceSampler by hand: one long sample and seven short ones, GA 2 -> the balance moves
// samples from the costly group until it holds the long sample alone (cost 100 + 10 = 110
// against 7 * 10 + 0.7 = 70.7); the costlier group is slot 0.
TEST(Sampling, RebalancedBatchesByHand) {
  std::vector<int64_t> lengths = {10, 10, 10, 100, 10, 10, 10, 10};
  std::vector<int64_t> order = {7, 6, 5, 4, 3, 2, 1, 0};
  auto batches = data::rebalanced_batches(order, lengths, 8, 1, 2, false);
  ASSERT_EQ(batches.size(), 2u);
  EXPECT_EQ(batches[0], std::vector<int64_t>({3}));
  EXPECT_EQ(batches[1], std::vector<int64_t>({7, 6, 5, 4, 2, 1, 0}));  // stable: order kept
}

// Every step holds exactly its samples of the order, in world x GA micro-batches; the last,
// short step is kept (padded from the front when it has fewer samples than micro-batches)
// unless drop_last; per_step below the micro-batch count is an error.
TEST(Sampling, RebalancedBatchesCoverEachStep) {
  std::vector<int64_t> lengths(50);
  for (int i = 0; i < 50; i++) lengths[i] = (i * 29) % 41 + 3;
  auto order = data::epoch_order(50, true, 5, 1);
  const int64_t world = 2, ga = 3, per_step = 2 * ga * world;  // 12: 4 steps + 2 samples
  auto batches = data::rebalanced_batches(order, lengths, per_step, world, ga, false);
  ASSERT_EQ(batches.size(), 5u * world * ga);
  for (int64_t s = 0; s < 4; s++) {
    std::vector<int64_t> got,
        want(order.begin() + s * per_step, order.begin() + (s + 1) * per_step);
    for (int64_t k = 0; k < world * ga; k++) {
      auto& b = batches[s * world * ga + k];
      ASSERT_FALSE(b.empty());
      got.insert(got.end(), b.begin(), b.end());
    }
    std::sort(got.begin(), got.end());
    std::sort(want.begin(), want.end());
    EXPECT_EQ(got, want) << "step " << s;
  }
  // the tail: order[48], order[49], then order[0..3] so that each of the 6 micro-batches has one
  std::vector<int64_t> tail;
  for (int64_t k = 0; k < world * ga; k++) {
    ASSERT_EQ(batches[4 * world * ga + k].size(), 1u);
    tail.push_back(batches[4 * world * ga + k][0]);
  }
  std::sort(tail.begin(), tail.end());
  std::vector<int64_t> want_tail = {order[48], order[49], order[0], order[1], order[2], order[3]};
  std::sort(want_tail.begin(), want_tail.end());
  EXPECT_EQ(tail, want_tail);
  EXPECT_EQ(data::rebalanced_batches(order, lengths, per_step, world, ga, true).size(),
            4u * world * ga);
  EXPECT_THROW(data::rebalanced_batches(order, lengths, 5, world, ga, false), Error);
}

TEST(Sampling, TensorDatasetLengths) {
  Tensor ids = Tensor::zeros(DType::Int64, {3, 7});
  Tensor len = Tensor::from_vector<int64_t>(DType::Int64, {3}, {5, 2, 7});
  data::TensorDataset padded({{"input_ids", ids}});
  EXPECT_EQ(padded.lengths("length"), (std::vector<int64_t>{7, 7, 7}));  // len(input_ids)
  data::TensorDataset with_column({{"input_ids", ids}, {"length", len}});
  EXPECT_EQ(with_column.lengths("length"), (std::vector<int64_t>{5, 2, 7}));
  data::TensorDataset images({{"pixel_values", Tensor::zeros(DType::Float32, {3, 4})}});
  EXPECT_TRUE(images.lengths("length").empty());
}
