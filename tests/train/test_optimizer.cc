// test_optimizer.cc — optimizers over flat buffers: fused AdamW against the per-tensor reference
// (bit for bit, any thread count), AdamW and SGD (momentum, nesterov, weight decay) against hand
// computations, state()/load_state() round trips and errors, the HF weight-decay mask, and the
// flat helpers (grad norm against a double loop, scale, a non-finite gradient's norm). Every SIMD
// path (kernels/cpu/simd/dispatch.h) gives the same bits: updates, moments and grad norms, tails
// included.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/simd/dispatch.h"
#include "kernels/cpu/simd/optimizer.h"
#include "onyx/error.h"
#include "runtime/parallel.h"
#include "train/optimizer.h"

using namespace onyx;
using namespace onyx::train;

namespace {

// Restores the pool's thread count when a test changes it.
struct ThreadCount {
  int saved = runtime::num_threads();
  explicit ThreadCount(int n) { runtime::set_num_threads(n); }
  ~ThreadCount() { runtime::set_num_threads(saved); }
};

// Mixed sizes: odd ones (vector tails, padding), a large one (several threads), biases and norms.
FlatLayout mixed_layout() {
  return FlatLayout::of({{"embeddings.word_embeddings.weight", {1000, 37}},
                         {"encoder.layer.0.attention.query.weight", {37, 37}},
                         {"encoder.layer.0.attention.query.bias", {37}},
                         {"encoder.layer.0.LayerNorm.weight", {37}},
                         {"encoder.layer.0.LayerNorm.bias", {37}},
                         {"encoder.layer.0.intermediate.dense.weight", {300000}},
                         {"encoder.layer.0.intermediate.dense.bias", {5}},
                         {"classifier.weight", {3, 7}}});
}

// Fills every tensor view (not the padding) with N(0, stddev).
void fill_random(FlatBuffer& b, uint32_t seed, float stddev = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, stddev);
  for (auto& e : b.layout().entries) {
    float* x = b.view(e.name).data<float>();
    for (int64_t i = 0; i < shape_numel(e.shape); ++i) x[i] = dist(rng);
  }
}

bool bits_equal(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// Runs `steps` AdamW steps (lr varying per step, grads new each step) and returns the params.
FlatBuffer run_adamw(const std::string& name, int steps, int threads) {
  ThreadCount tc(threads);
  FlatLayout layout = mixed_layout();
  FlatBuffer params(layout), grads(layout);
  fill_random(params, 1);
  OptimizerConfig cfg;
  cfg.name = name;
  cfg.weight_decay = 0.01;
  auto opt = make_optimizer(cfg, layout, hf_decay_mask(layout, false));
  for (int s = 0; s < steps; ++s) {
    fill_random(grads, 100 + s, s % 3 == 2 ? 1e-3f : 1.0f);
    opt->step(params, grads, 1e-3 * (1.0 - 0.05 * s));
  }
  EXPECT_EQ(opt->step_count, steps);
  return params;
}

TEST(Optimizer, FusedAdamWMatchesPerTensorReferenceBitForBit) {
  FlatBuffer ref = run_adamw("adamw", 10, 1);
  FlatBuffer fused1 = run_adamw("adamw_fused", 10, 1);
  FlatBuffer fused2 = run_adamw("adamw_fused", 10, 2);
  FlatBuffer fused3 = run_adamw("adamw_fused", 10, 3);
  EXPECT_TRUE(bits_equal(ref.flat(), fused1.flat()));
  EXPECT_TRUE(bits_equal(ref.flat(), fused2.flat()));
  EXPECT_TRUE(bits_equal(ref.flat(), fused3.flat()));
  // And the parameters did move.
  FlatBuffer start(mixed_layout());
  fill_random(start, 1);
  EXPECT_FALSE(bits_equal(start.flat(), ref.flat()));
}

// Gradient clipping read into the update (Optimizer::step's grad_scale) is the step on the
// scaled gradients bit for bit, for the fused and the reference AdamW, and leaves the gradients
// as they were; SGD (which does not read one) refuses a scale.
TEST(Optimizer, AdamWGradScaleIsTheStepOnScaledGradients) {
  FlatLayout layout = mixed_layout();
  OptimizerConfig cfg;
  cfg.weight_decay = 0.01;
  for (const char* name : {"adamw_fused", "adamw"}) {
    SCOPED_TRACE(name);
    cfg.name = name;
    FlatBuffer p1(layout), p2(layout), g(layout);
    fill_random(p1, 1);
    fill_random(p2, 1);
    auto o1 = make_optimizer(cfg, layout, hf_decay_mask(layout, false));
    auto o2 = make_optimizer(cfg, layout, hf_decay_mask(layout, false));
    ASSERT_TRUE(o1->scales_gradients());
    for (int s = 0; s < 3; ++s) {
      fill_random(g, 200 + s);
      const float factor = 0.37f + 0.1f * (float)s;
      const Tensor before = g.flat().clone();
      o1->step(p1, g, 1e-3, nullptr, factor);
      EXPECT_TRUE(bits_equal(g.flat(), before));  // the gradients untouched
      scale(g, factor);
      o2->step(p2, g, 1e-3);
    }
    EXPECT_TRUE(bits_equal(p1.flat(), p2.flat()));
    EXPECT_TRUE(bits_equal(o1->state().at("exp_avg_sq"), o2->state().at("exp_avg_sq")));
  }
  cfg.name = "sgd";
  auto sgd = make_optimizer(cfg, layout, {});
  EXPECT_FALSE(sgd->scales_gradients());
  FlatBuffer p(layout), g(layout);
  EXPECT_THROW(sgd->step(p, g, 1e-3, nullptr, 0.5f), Error);
}

TEST(Optimizer, AdamWSingleStepMatchesHandComputation) {
  FlatLayout layout = FlatLayout::of({{"w", {2, 2}}, {"b", {3}}});
  FlatBuffer params(layout), grads(layout);
  const float p0[] = {0.5f, -1.0f, 2.0f, 0.0f, 0.25f, -0.5f, 1.0f};
  const float g0[] = {0.1f, -0.2f, 0.0f, 3.0f, 1e-9f, -0.4f, 0.05f};
  std::memcpy(params.view("w").data<float>(), p0, 4 * sizeof(float));
  std::memcpy(params.view("b").data<float>(), p0 + 4, 3 * sizeof(float));
  std::memcpy(grads.view("w").data<float>(), g0, 4 * sizeof(float));
  std::memcpy(grads.view("b").data<float>(), g0 + 4, 3 * sizeof(float));
  const double lr = 0.01, wd = 0.1, b1 = 0.9, b2 = 0.999, eps = 1e-8;
  for (const char* name : {"adamw_fused", "adamw"}) {
    FlatBuffer p(layout);
    std::memcpy(p.flat().raw(), params.flat().raw(), params.flat().nbytes());
    OptimizerConfig cfg;
    cfg.name = name;
    cfg.weight_decay = wd;
    auto opt = make_optimizer(cfg, layout, {true, false});  // decay "w", not "b"
    opt->step(p, grads, lr);
    for (int i = 0; i < 7; ++i) {
      // Step 1: m = (1-b1) g, v = (1-b2) g^2, m_hat = g, v_hat = g^2.
      double decay = i < 4 ? 1 - lr * wd : 1.0;
      double g = g0[i], m = (1 - b1) * g, v = (1 - b2) * g * g;
      double m_hat = m / (1 - b1), v_hat = v / (1 - b2);
      double expected = p0[i] * decay - lr * m_hat / (std::sqrt(v_hat) + eps);
      float got = i < 4 ? p.view("w").data<float>()[i] : p.view("b").data<float>()[i - 4];
      EXPECT_NEAR(got, expected, 1e-6) << name << " element " << i;
    }
    auto st = opt->state();
    EXPECT_NEAR(st.at("exp_avg").data<float>()[3], 0.3, 1e-7);
    EXPECT_NEAR(st.at("exp_avg_sq").data<float>()[3], 0.009, 1e-8);
    EXPECT_EQ(st.at("step").data<int64_t>()[0], 1);
  }
}

// SGD over one tensor [p] with gradients g1, g2, g3, against the torch recurrences in double.
void check_sgd(double momentum, bool nesterov, double wd) {
  FlatLayout layout = FlatLayout::of({{"w", {3}}});
  FlatBuffer params(layout), grads(layout);
  double p[3] = {1.0, -2.0, 0.5};
  const double g[3][3] = {{0.5, -1.0, 0.25}, {0.25, 0.5, -0.75}, {-1.0, 0.125, 0.5}};
  for (int i = 0; i < 3; ++i) params.view("w").data<float>()[i] = (float)p[i];
  OptimizerConfig cfg;
  cfg.name = "sgd";
  cfg.momentum = momentum;
  cfg.nesterov = nesterov;
  cfg.weight_decay = wd;
  auto opt = make_optimizer(cfg, layout, {});
  double buf[3] = {0, 0, 0};
  const double lrs[3] = {0.1, 0.05, 0.02};
  for (int s = 0; s < 3; ++s) {
    for (int i = 0; i < 3; ++i) grads.view("w").data<float>()[i] = (float)g[s][i];
    opt->step(params, grads, lrs[s]);
    for (int i = 0; i < 3; ++i) {
      double d = g[s][i] + wd * p[i];
      if (momentum != 0) {
        buf[i] = s == 0 ? d : momentum * buf[i] + d;
        d = nesterov ? d + momentum * buf[i] : buf[i];
      }
      p[i] -= lrs[s] * d;
      EXPECT_NEAR(params.view("w").data<float>()[i], p[i], 1e-6)
          << "momentum=" << momentum << " nesterov=" << nesterov << " wd=" << wd << " step " << s
          << " element " << i;
    }
  }
  auto st = opt->state();
  EXPECT_EQ(st.count("momentum_buffer"), momentum != 0 ? 1u : 0u);
  if (momentum != 0) {
    for (int i = 0; i < 3; ++i)
      EXPECT_NEAR(st.at("momentum_buffer").data<float>()[i], buf[i], 1e-6);
  }
}

TEST(Optimizer, SgdThreeStepsMatchHandComputation) {
  check_sgd(0.0, false, 0.0);
  check_sgd(0.9, false, 0.0);
  check_sgd(0.9, true, 0.0);
  check_sgd(0.9, true, 0.01);
  check_sgd(0.0, false, 0.1);
}

TEST(Optimizer, SgdMomentumStepByHandExactValues) {
  // Values chosen to be exact in float: p=1, g=0.5, lr=0.5, momentum 0.5, nesterov.
  // Step 1: buf=0.5, d=0.5+0.25=0.75, p=1-0.375=0.625. Step 2 (g=0.5): buf=0.25+0.5=0.75,
  // d=0.5+0.375=0.875, p=0.625-0.4375=0.1875.
  FlatLayout layout = FlatLayout::of({{"w", {1}}});
  FlatBuffer params(layout), grads(layout);
  params.view("w").data<float>()[0] = 1.0f;
  grads.view("w").data<float>()[0] = 0.5f;
  OptimizerConfig cfg;
  cfg.name = "sgd";
  cfg.momentum = 0.5;
  cfg.nesterov = true;
  auto opt = make_optimizer(cfg, layout, {});
  opt->step(params, grads, 0.5);
  EXPECT_EQ(params.view("w").data<float>()[0], 0.625f);
  opt->step(params, grads, 0.5);
  EXPECT_EQ(params.view("w").data<float>()[0], 0.1875f);
}

TEST(Optimizer, StateRoundTripContinuesIdentically) {
  for (const char* name : {"adamw_fused", "adamw", "sgd"}) {
    FlatLayout layout = mixed_layout();
    OptimizerConfig cfg;
    cfg.name = name;
    cfg.weight_decay = 0.01;
    cfg.momentum = 0.9;
    auto mask = hf_decay_mask(layout, false);
    FlatBuffer params(layout), grads(layout);
    fill_random(params, 7);
    auto a = make_optimizer(cfg, layout, mask);
    for (int s = 0; s < 4; ++s) {
      fill_random(grads, 200 + s);
      a->step(params, grads, 1e-3);
    }
    // Snapshot (state() tensors are live views: clone them as a checkpoint writer would copy).
    std::map<std::string, Tensor> saved;
    for (auto& [k, t] : a->state()) saved[k] = t.clone();
    FlatBuffer params_b(layout);
    std::memcpy(params_b.flat().raw(), params.flat().raw(), params.flat().nbytes());
    auto b = make_optimizer(cfg, layout, mask);
    b->load_state(saved);
    EXPECT_EQ(b->step_count, 4);
    for (int s = 4; s < 8; ++s) {
      fill_random(grads, 200 + s);
      a->step(params, grads, 1e-3);
      b->step(params_b, grads, 1e-3);
    }
    EXPECT_TRUE(bits_equal(params.flat(), params_b.flat())) << name;
    for (auto& [k, t] : a->state())
      EXPECT_TRUE(bits_equal(t, b->state().at(k))) << name << " " << k;
  }
}

std::string load_error(Optimizer& opt, const std::map<std::string, Tensor>& state) {
  try {
    opt.load_state(state);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Optimizer, LoadStateErrorsNameTheKey) {
  FlatLayout layout = mixed_layout();
  auto opt = make_optimizer(OptimizerConfig{}, layout, {});
  auto good = opt->state();

  auto bad_shape = good;
  bad_shape["exp_avg_sq"] = Tensor::zeros(DType::Float32, {layout.numel - 16});
  std::string msg = load_error(*opt, bad_shape);
  EXPECT_NE(msg.find("'exp_avg_sq'"), std::string::npos) << msg;
  EXPECT_NE(msg.find(shape_str({layout.numel})), std::string::npos) << msg;

  auto missing = good;
  missing.erase("exp_avg");
  msg = load_error(*opt, missing);
  EXPECT_NE(msg.find("missing key 'exp_avg'"), std::string::npos) << msg;

  auto extra = good;
  extra["momentum_buffer"] = Tensor::zeros(DType::Float32, {layout.numel});
  msg = load_error(*opt, extra);
  EXPECT_NE(msg.find("unexpected key 'momentum_buffer'"), std::string::npos) << msg;

  auto bad_step = good;
  bad_step["step"] = Tensor::scalar_f32(3.0f);
  msg = load_error(*opt, bad_step);
  EXPECT_NE(msg.find("'step'"), std::string::npos) << msg;

  auto bad_dtype = good;
  bad_dtype["exp_avg"] = Tensor::zeros(DType::Float64, {layout.numel});
  msg = load_error(*opt, bad_dtype);
  EXPECT_NE(msg.find("'exp_avg'"), std::string::npos) << msg;

  // A failed load changes nothing.
  EXPECT_EQ(opt->step_count, 0);
  EXPECT_EQ(load_error(*opt, good), "");
}

TEST(Optimizer, UnknownNameListsValidNames) {
  OptimizerConfig cfg;
  cfg.name = "adam";
  try {
    make_optimizer(cfg, mixed_layout(), {});
    FAIL() << "expected onyx::Error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("'adam'"), std::string::npos) << msg;
    for (auto& n : optimizer_names()) EXPECT_NE(msg.find(n), std::string::npos) << msg;
  }
}

TEST(Optimizer, BadConfigAndBuffersThrow) {
  FlatLayout layout = mixed_layout();
  OptimizerConfig cfg;
  cfg.beta2 = 1.0;
  EXPECT_THROW(make_optimizer(cfg, layout, {}), Error);
  cfg = OptimizerConfig{};
  EXPECT_THROW(make_optimizer(cfg, layout, {true, false}), Error);  // mask size
  cfg.name = "sgd";
  cfg.nesterov = true;  // without momentum
  EXPECT_THROW(make_optimizer(cfg, layout, {}), Error);
  auto opt = make_optimizer(OptimizerConfig{}, layout, {});
  FlatBuffer params(layout), other(FlatLayout::of({{"x", {4}}}));
  EXPECT_THROW(opt->step(params, other, 1e-3), Error);
}

TEST(Optimizer, HfDecayMask) {
  FlatLayout layout = FlatLayout::of({{"bert.embeddings.word_embeddings.weight", {10, 4}},
                                      {"bert.embeddings.LayerNorm.weight", {4}},
                                      {"bert.embeddings.LayerNorm.bias", {4}},
                                      {"h.0.ln_1.weight", {4}},
                                      {"h.0.attn.c_attn.weight", {4, 12}},
                                      {"h.0.attn.c_attn.bias", {12}},
                                      {"model.final_layer_norm.weight", {4}},
                                      {"model.norm.weight", {4}},
                                      {"encoder.Layernorm.gamma", {4}},
                                      {"onnx::MatMul_123", {4, 4}},
                                      {"onnx::Add_124", {4}},
                                      {"scale", {}}});
  std::vector<bool> hf = {true,  false, false, false, true, false,
                          false, false, false, true,  true, true};
  std::vector<bool> onnx = {true,  false, false, false, true,  false,
                            false, false, false, true,  false, false};
  EXPECT_EQ(hf_decay_mask(layout, false), hf);
  EXPECT_EQ(hf_decay_mask(layout, true), onnx);
}

TEST(Optimizer, GlobalGradNormMatchesDoubleLoopForAnyThreadCount) {
  FlatLayout layout = FlatLayout::of({{"a", {200001}}, {"b", {3}}, {"c", {70000}}});
  FlatBuffer g(layout);
  fill_random(g, 11, 0.1f);
  double expected = 0;
  const float* x = g.flat().data<float>();
  for (int64_t i = 0; i < layout.numel; ++i) expected += (double)x[i] * x[i];
  expected = std::sqrt(expected);
  double n1, n2, n3;
  {
    ThreadCount tc(1);
    n1 = global_grad_norm(g);
  }
  {
    ThreadCount tc(2);
    n2 = global_grad_norm(g);
  }
  {
    ThreadCount tc(3);
    n3 = global_grad_norm(g);
  }
  EXPECT_NEAR(n1, expected, 1e-12 * expected);
  EXPECT_EQ(n1, n2);  // bit for bit: fixed chunks, fixed order
  EXPECT_EQ(n1, n3);
}

TEST(Optimizer, SquareSumIsExactAndOrderFree) {
  // 2^53 + 1 + 1: a left fold in double gives 2^53 (each 1 rounds away), the exact sum is
  // 2^53 + 2, whatever the order.
  const double big = std::ldexp(1.0, 53);
  SquareSum a, b;
  a.add(big);
  a.add(1.0);
  a.add(1.0);
  b.add(1.0);
  b.add(1.0);
  b.add(big);
  EXPECT_EQ((big + 1.0) + 1.0, big);
  EXPECT_EQ(a.value(), big + 2.0);
  EXPECT_EQ(b.value(), big + 2.0);
  SquareSum c;
  c.add(1e20);
  for (int i = 0; i < 1000; i++) c.add(3.0);
  SquareSum tiny;
  tiny.add(std::ldexp(1.0, -1074));  // subnormals are exact too
  tiny.add(std::ldexp(1.0, -1074));
  EXPECT_EQ(tiny.value(), std::ldexp(1.0, -1073));
  SquareSum bad;
  bad.add(2.0);
  bad.add(std::numeric_limits<double>::infinity());
  EXPECT_TRUE(std::isinf(bad.value()));
  SquareSum ac = a, ca = c;
  ac.merge(c);
  ca.merge(a);
  EXPECT_EQ(ac.value(), ca.value());
  EXPECT_NEAR(ac.value(), 1e20 + big + 3002.0, 1e5);
}

TEST(Optimizer, ShardedSquareSumsEqualTheWholeBuffer) {
  // ZeRO computes the norm from shards (64-aligned ranges): merged, the same bits as the whole.
  FlatLayout layout = FlatLayout::of({{"a", {100003}}, {"b", {77}}, {"c", {5000}}});
  FlatBuffer g(layout);
  fill_random(g, 5, 3.0f);
  const double whole = global_grad_norm(g);
  for (int64_t shard : {64, 640, 4096, 52800}) {
    SquareSum total;
    for (int64_t b = 0; b < layout.numel; b += shard) {
      ThreadCount tc(b % 3 + 1);
      total.merge(square_sum(g, b, std::min(layout.numel, b + shard)));
    }
    EXPECT_EQ(std::sqrt(total.value()), whole) << "shard " << shard;
  }
  EXPECT_THROW(square_sum(g, 10, 100), Error);  // not block aligned
}

TEST(Optimizer, RangeRestrictedStepsEqualTheWholeStep) {
  // Two ZeRO shards stepped separately give the whole buffer's update, state split by range.
  FlatLayout layout = FlatLayout::of({{"w", {37, 11}}, {"bias", {11}}, {"v", {300}}});
  std::vector<bool> mask = hf_decay_mask(layout, false);
  for (const char* name : {"adamw_fused", "adamw", "sgd"}) {
    OptimizerConfig c;
    c.name = name;
    c.weight_decay = 0.1;
    c.momentum = 0.9;
    FlatBuffer p1(layout), p2(layout), g(layout);
    fill_random(p1, 1);
    std::memcpy(p2.flat().raw(), p1.flat().raw(), p1.flat().nbytes());
    auto whole = make_optimizer(c, layout, mask);
    const int64_t cut = 256;
    auto lo = make_optimizer(c, layout, mask, 0, cut);
    auto hi = make_optimizer(c, layout, mask, cut, layout.numel);
    for (int step = 0; step < 3; step++) {
      fill_random(g, 10 + step);
      whole->step(p1, g, 1e-2);
      lo->step(p2, g, 1e-2);
      hi->step(p2, g, 1e-2);
    }
    EXPECT_EQ(std::memcmp(p1.flat().raw(), p2.flat().raw(), p1.flat().nbytes()), 0) << name;
    auto whole_state = whole->state();
    for (auto& [key, t] : whole_state) {
      if (key == "step") continue;
      Tensor a = lo->state().at(key);
      Tensor b = hi->state().at(key);
      EXPECT_EQ(a.numel(), cut);
      EXPECT_EQ(std::memcmp(t.data<float>(), a.data<float>(), cut * 4), 0) << name << key;
      EXPECT_EQ(std::memcmp(t.data<float>() + cut, b.data<float>(), (layout.numel - cut) * 4), 0)
          << name << key;
    }
  }
  OptimizerConfig c;
  EXPECT_THROW(make_optimizer(c, layout, mask, 10, layout.numel + 1), Error);
}

// scale; and the norm is non-finite exactly when a gradient is (the Trainer skips such a step on
// the norm alone).
TEST(Optimizer, ScaleAndNonFiniteNorms) {
  FlatLayout layout = FlatLayout::of({{"a", {300007}}, {"b", {5}}});
  FlatBuffer g(layout);
  fill_random(g, 3);
  std::vector<float> before(g.flat().data<float>(), g.flat().data<float>() + layout.numel);
  scale(g, 0.5f);
  for (int64_t i = 0; i < layout.numel; ++i) ASSERT_EQ(g.flat().data<float>()[i], before[i] * 0.5f);
  EXPECT_TRUE(std::isfinite(global_grad_norm(g)));
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    for (int64_t pos : {int64_t(0), int64_t(150000), layout.numel - 1}) {
      float* x = g.flat().data<float>();
      float saved = x[pos];
      x[pos] = bad;
      EXPECT_FALSE(std::isfinite(global_grad_norm(g))) << bad << " at " << pos;
      x[pos] = saved;
    }
  }
  g.flat().data<float>()[7] = std::numeric_limits<float>::max();  // its square is finite in double
  EXPECT_TRUE(std::isfinite(global_grad_norm(g)));
}

// Runs a test on each SIMD path this CPU supports; restores the path chosen before (auto's, or
// the one ONYX_CPU forced) at the end.
struct EachPath {
  std::string saved = simd::chosen_path();
  ~EachPath() { simd::select_path(saved); }
};

// Everything the optimizer kernels compute, on the path selected now, as floats to compare bits:
// AdamW (fused, and the scalar reference) and SGD steps of optimizers restricted to odd element
// ranges (vector tails of every width, unaligned starts), the kernels called directly on lengths
// 0..70 at an odd offset, grad norms (of finite and non-finite gradients).
std::vector<float> optimizer_results_on_this_path() {
  std::vector<float> out;
  auto append = [&](const float* x, int64_t n) { out.insert(out.end(), x, x + n); };
  FlatLayout layout = FlatLayout::of({{"w", {37, 11}},
                                      {"bias", {13}},
                                      {"v", {1001}},
                                      {"norm.weight", {3}},
                                      {"x", {20011}},
                                      {"y", {1}}});
  std::vector<bool> mask = hf_decay_mask(layout, false);
  for (auto [begin, end] :
       {std::pair<int64_t, int64_t>{0, layout.numel}, {5, layout.numel - 3}, {417, 1433}}) {
    for (const char* name : {"adamw_fused", "adamw", "sgd"}) {
      for (bool nesterov : {false, true}) {
        if (nesterov && std::string(name) != "sgd") continue;
        OptimizerConfig c;
        c.name = name;
        c.weight_decay = 0.05;
        c.momentum = 0.9;
        c.nesterov = nesterov;
        FlatBuffer p(layout), g(layout);
        fill_random(p, 3);
        auto opt = make_optimizer(c, layout, mask, begin, end);
        for (int s = 0; s < 4; ++s) {
          fill_random(g, 40 + s, s == 2 ? 1e-4f : 1.0f);
          g.flat().data<float>()[begin + s] = 0.0f;
          opt->step(p, g, 1e-2 * (1.0 - 0.1 * s));
        }
        append(p.flat().data<float>(), layout.numel);
        for (auto& [key, t] : opt->state())
          if (key != "step") append(t.data<float>(), t.numel());
      }
    }
  }
  // The kernels on every tail length, starting one element past a vector boundary.
  std::mt19937 rng(9);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (int64_t n = 0; n <= 70; ++n) {
    std::vector<float> p(n + 1), g(n + 1), m(n + 1), v(n + 1), buf(n + 1);
    for (int64_t i = 0; i <= n; ++i) {
      p[i] = nd(rng), g[i] = 0.1f * nd(rng), m[i] = 0.01f * nd(rng);
      v[i] = 1e-3f * std::fabs(nd(rng)), buf[i] = 0.1f * nd(rng);
    }
    const simd::AdamWConstants k{0.9f, 0.1f, 0.999f, 0.001f, 0.0447101778f, 1e-8f, -0.0104f};
    simd::adamw_update(p.data() + 1, g.data() + 1, m.data() + 1, v.data() + 1, n, k, 0.9999f);
    append(p.data(), n + 1), append(m.data(), n + 1), append(v.data(), n + 1);
    for (unsigned flags = 0; flags < 16; ++flags) {
      simd::sgd_update(p.data() + 1, g.data() + 1, buf.data() + 1, n, {0.01f, 0.9f, -0.05f}, flags);
      append(p.data(), n + 1), append(buf.data(), n + 1);
    }
    std::vector<double> sums((n + 63) / 64);
    simd::block_sum_squares(g.data() + 1, n, sums.data());
    for (double s : sums) out.push_back((float)s), out.push_back((float)(s - (float)s));
  }
  FlatBuffer g(layout);
  fill_random(g, 77, 3.0f);
  double norm = global_grad_norm(g);
  out.push_back((float)norm), out.push_back((float)(norm - (float)norm));
  g.flat().data<float>()[layout.numel - 2] = std::numeric_limits<float>::infinity();
  out.push_back(std::isfinite(global_grad_norm(g)) ? 1.0f : 0.0f);
  return out;
}

TEST(Optimizer, EveryCpuPathGivesTheSameBits) {
  EachPath guard;
  std::vector<std::string> paths = simd::supported_paths();
  ASSERT_FALSE(paths.empty());
  std::vector<float> first;
  for (const std::string& path : paths) {
    simd::select_path(path);
    ASSERT_EQ(simd::chosen_path(), path);
    std::vector<float> r = optimizer_results_on_this_path();
    if (first.empty()) {
      first = r;
      continue;
    }
    ASSERT_EQ(r.size(), first.size()) << path;
    size_t diffs = 0, at = 0;
    for (size_t i = 0; i < r.size(); ++i)
      if (std::memcmp(&r[i], &first[i], sizeof(float)) != 0 && diffs++ == 0) at = i;
    EXPECT_EQ(diffs, 0u) << path << " differs from " << paths[0] << " in " << diffs << " of "
                         << r.size() << " values, first at " << at;
  }
}

TEST(Optimizer, FusedAdamWMatchesTheReferenceOnEveryCpuPath) {
  EachPath guard;
  for (const std::string& path : simd::supported_paths()) {
    simd::select_path(path);
    EXPECT_TRUE(bits_equal(run_adamw("adamw", 6, 1).flat(), run_adamw("adamw_fused", 6, 2).flat()))
        << path;
  }
}

}  // namespace

// Mixed precision's bf16 shadow (Optimizer::step's bf16_shadow): every optimizer writes exactly
// kernels::f32_to_bf16 of the weights it updated — the rounding the GEMMs apply to a float32
// operand — over its own range only, and the update itself is the one without a shadow.
TEST(Optimizer, Bf16ShadowIsTheUpdatedWeightsRoundedOverTheOptimizersRange) {
  ThreadCount tc(2);
  FlatLayout layout = mixed_layout();
  FlatLayout l16 = layout;
  l16.dtype = DType::BFloat16;
  const int64_t cut = 1 << 15;  // a ZeRO-like shard boundary inside the large tensor
  for (const std::string& name : optimizer_names()) {
    OptimizerConfig c;
    c.name = name;
    if (name == "adafactor") {  // per-tensor state: no ZeRO range (zero_stage 0 only)
      EXPECT_THROW(make_optimizer(c, layout, hf_decay_mask(layout, false), 0, cut), Error);
      continue;
    }
    c.weight_decay = 0.01;
    c.momentum = 0.9;
    FlatBuffer p1(layout), p2(layout), g(layout), shadow(l16);
    fill_random(p1, 3);
    std::memcpy(p2.flat().raw(), p1.flat().raw(), p1.flat().nbytes());
    auto plain = make_optimizer(c, layout, hf_decay_mask(layout, false));
    auto with = make_optimizer(c, layout, hf_decay_mask(layout, false), 0, cut);
    std::vector<uint16_t> want(layout.numel);
    for (int s = 0; s < 3; ++s) {
      fill_random(g, 20 + s);
      uint16_t* sh = shadow.flat().data<uint16_t>();
      for (int64_t i = 0; i < layout.numel; ++i) sh[i] = 0x5555;  // untouched outside the range
      plain->step(p1, g, 1e-2);
      with->step(p2, g, 1e-2, &shadow);
      kernels::f32_to_bf16(p2.flat().data<float>(), want.data(), layout.numel);
      int64_t wrong = 0, touched = 0;
      for (int64_t i = 0; i < layout.numel; ++i) {
        if (i < cut)
          wrong += sh[i] != want[i];
        else
          touched += sh[i] != 0x5555;
      }
      EXPECT_EQ(wrong, 0) << name << " step " << s;
      EXPECT_EQ(touched, 0) << name << " step " << s;
      EXPECT_EQ(std::memcmp(p1.flat().raw(), p2.flat().raw(), cut * sizeof(float)), 0) << name;
    }
    // A shadow of another layout is refused before anything changes.
    FlatLayout other = FlatLayout::of({{"w", {10}}}, DType::BFloat16);
    FlatBuffer bad(other);
    std::vector<char> before(p2.flat().nbytes());
    std::memcpy(before.data(), p2.flat().raw(), before.size());
    const int64_t steps = with->step_count;
    EXPECT_THROW(with->step(p2, g, 1e-2, &bad), Error) << name;
    EXPECT_EQ(with->step_count, steps) << name;
    EXPECT_EQ(std::memcmp(before.data(), p2.flat().raw(), before.size()), 0) << name;
    FlatBuffer f32_shadow(layout);  // float32, not bf16
    EXPECT_THROW(with->step(p2, g, 1e-2, &f32_shadow), Error) << name;
  }
}
