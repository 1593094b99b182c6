// tests/kernels/test_random_draws.cc — onyx.DrawNormal / onyx.DrawIntegers (kernels/random/
// draws.cc), the draws of diffusion training: a given tensor passes through (its shape checked);
// otherwise the draws are standard normal / uniform in [0, high) (moments and counts within
// bounds several standard errors wide), a function of (run seed, node output name, element) only —
// the same for any thread count, different for another seed or node.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "autodiff/gradient.h"
#include "runtime/parallel.h"
#include "runtime/session.h"

using namespace onyx;
using onyx::runtime::run_node;

namespace {

ir::Node draw_node(const std::string& op, const std::string& out, int64_t high = 0) {
  ir::Node n;
  n.name = out + "_node";
  n.op_type = op;
  n.domain = "onyx";
  n.inputs = {"given", "like"};
  n.outputs = {out};
  if (high) n.attrs["high"] = autodiff::attr_i(high);
  return n;
}

runtime::RunOptions seeded(uint64_t seed) {
  runtime::RunOptions ro;
  ro.seed = seed;
  ro.training = true;
  return ro;
}

Tensor draw(const std::string& op, const std::string& out, const Shape& like, uint64_t seed,
            int64_t high = 0) {
  Tensor given(op == "DrawNormal" ? DType::Float32 : DType::Int64, {0});
  return run_node(draw_node(op, out, high), 21, {given, Tensor(DType::Float32, like)},
                  seeded(seed))[0];
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

}  // namespace

TEST(RandomDraws, NormalMomentsAndReproducibility) {
  const Shape s{4, 3, 101, 83};  // an odd element count: the last Box-Muller pair half used
  Tensor a = draw("DrawNormal", "noise", s, 5);
  ASSERT_EQ(a.shape(), s);
  double sum = 0, sq = 0, quart = 0;
  int64_t beyond3 = 0;
  const float* x = a.data<float>();
  const int64_t n = a.numel();
  for (int64_t i = 0; i < n; i++) {
    sum += x[i], sq += (double)x[i] * x[i], quart += std::pow((double)x[i], 4);
    beyond3 += std::fabs(x[i]) > 3;
  }
  const double mean = sum / n, var = sq / n - mean * mean;
  EXPECT_NEAR(mean, 0.0, 5 / std::sqrt((double)n));
  EXPECT_NEAR(var, 1.0, 5 * std::sqrt(2.0 / n));
  EXPECT_NEAR(quart / n, 3.0, 0.1);                  // a normal's fourth moment
  EXPECT_NEAR((double)beyond3 / n, 0.0027, 0.0012);  // P(|z| > 3)
  EXPECT_TRUE(same_bits(a, draw("DrawNormal", "noise", s, 5)));
  EXPECT_FALSE(same_bits(a, draw("DrawNormal", "noise", s, 6)));   // another step's seed
  EXPECT_FALSE(same_bits(a, draw("DrawNormal", "noise2", s, 5)));  // another node
  const int saved = runtime::num_threads();
  runtime::set_num_threads(1);
  Tensor one = draw("DrawNormal", "noise", s, 5);
  runtime::set_num_threads(saved);
  EXPECT_TRUE(same_bits(a, one)) << "the draws depend on the thread count";
}

TEST(RandomDraws, IntegersUniformInRange) {
  const int64_t high = 10, n = 200000;
  Tensor t = draw("DrawIntegers", "timesteps", {n, 3}, 9, high);
  ASSERT_EQ(t.shape(), (Shape{n}));
  std::vector<int64_t> counts(high, 0);
  for (int64_t i = 0; i < n; i++) {
    const int64_t v = t.data<int64_t>()[i];
    ASSERT_TRUE(v >= 0 && v < high) << v;
    counts[v]++;
  }
  for (int64_t k = 0; k < high; k++)  // expected 20000 each, standard error ~134
    EXPECT_NEAR((double)counts[k], (double)n / high, 700) << "value " << k;
  EXPECT_FALSE(same_bits(t, draw("DrawIntegers", "timesteps", {n, 3}, 10, high)));
}

TEST(RandomDraws, GivenPassesThroughAndIsChecked) {
  Tensor given(DType::Float32, {2, 3});
  for (int i = 0; i < 6; i++) given.data<float>()[i] = (float)i;
  auto out = run_node(draw_node("DrawNormal", "noise"), 21, {given, Tensor(DType::Float32, {2, 3})},
                      seeded(1))[0];
  EXPECT_TRUE(same_bits(out, given));
  EXPECT_THROW(run_node(draw_node("DrawNormal", "noise"), 21,
                        {given, Tensor(DType::Float32, {3, 2})}, seeded(1)),
               Error);
  Tensor steps = Tensor::from_vector<int64_t>(DType::Int64, {2}, {4, 12});
  EXPECT_THROW(run_node(draw_node("DrawIntegers", "t", 10), 21,
                        {steps, Tensor(DType::Float32, {2, 5})}, seeded(1)),
               Error);  // 12 is outside [0, 10)
}
