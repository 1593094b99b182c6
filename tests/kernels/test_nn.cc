// tests/kernels/test_nn.cc — hand-checked cases for the nn, loss and reduce kernels: softmax rows,
// LayerNorm against a naive double loop, cross-entropy with ignore_index, Dropout (identity at
// ratio 0, statistics and determinism in training mode), Philox known-answer vectors, and
// reductions over the last / leading / scattered axes against a naive loop.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/cpu/nn_util.h"
#include "kernels/cpu/philox.h"
#include "kernels/cpu/simd/dispatch.h"
#include "kernels/cpu/simd/simd.h"
#include "runtime/parallel.h"
#include "runtime/session.h"

using namespace onyx;
using onyx::runtime::run_node;

namespace {

ir::Node make_node(const std::string& op, int nin, int nout) {
  ir::Node n;
  n.name = op + "_test";
  n.op_type = op;
  for (int i = 0; i < nin; i++) n.inputs.push_back("in" + std::to_string(i));
  for (int i = 0; i < nout; i++) n.outputs.push_back("out" + std::to_string(i));
  return n;
}

void set_int(ir::Node& n, const std::string& k, int64_t v) {
  ir::Attribute a;
  a.kind = ir::Attribute::Kind::Int;
  a.i = v;
  n.attrs[k] = a;
}
void set_float(ir::Node& n, const std::string& k, float v) {
  ir::Attribute a;
  a.kind = ir::Attribute::Kind::Float;
  a.f = v;
  n.attrs[k] = a;
}
void set_string(ir::Node& n, const std::string& k, const std::string& v) {
  ir::Attribute a;
  a.kind = ir::Attribute::Kind::String;
  a.s = v;
  n.attrs[k] = a;
}
void set_ints(ir::Node& n, const std::string& k, std::vector<int64_t> v) {
  ir::Attribute a;
  a.kind = ir::Attribute::Kind::Ints;
  a.ints = std::move(v);
  n.attrs[k] = a;
}

Tensor randn(Shape s, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d;
  std::vector<float> v(shape_numel(s));
  for (auto& x : v) x = d(g);
  return Tensor::from_vector(DType::Float32, s, v);
}

Tensor bool_scalar(bool b) {
  Tensor t(DType::Bool, {});
  *t.data<bool>() = b;
  return t;
}

}  // namespace

TEST(Philox, KnownAnswerVectors) {
  // Random123 kat_vectors for philox4x32_10.
  using P = kernels::Philox4x32;
  auto a = P::generate({0, 0, 0, 0}, {0, 0});
  EXPECT_EQ(a, (P::Counter{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
  auto b =
      P::generate({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, {0xffffffffu, 0xffffffffu});
  EXPECT_EQ(b, (P::Counter{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
  auto c =
      P::generate({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, {0xa4093822u, 0x299f31d0u});
  EXPECT_EQ(c, (P::Counter{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}));
}

// (The eight-lane Philox of simd/dropout.cc is checked against generate() on every SIMD path in
// test_simd_paths.cc.)

// The x <= 0 exp of softmax-style rows (simd::row_sum_exp stores exp(x - m)), on every path.
TEST(VecMath, ExpOfNonPositiveInputsIsAccurate) {
  const std::string start = simd::chosen_path();
  for (const std::string& path : simd::supported_paths()) {
    SCOPED_TRACE(path);
    simd::select_path(path);
    float worst = 0;
    std::vector<float> x(800000), y(800000);
    for (size_t i = 0; i < x.size(); i++) x[i] = -100.0f * (float)i / 800000.0f;
    simd::row_sum_exp(x.data(), (int64_t)x.size(), 0.0f, y.data());
    for (size_t i = 0; i < x.size(); i++) {
      double ref = std::exp((double)x[i]);
      if (ref < 1.2e-38) {
        EXPECT_LE(y[i], 1.2e-38f);
        continue;
      }
      worst = std::max(worst, (float)(std::fabs(y[i] - ref) / ref));
    }
    EXPECT_LT(worst, 3e-7f);
    float xs[8] = {-INFINITY, NAN, 0.f, -0.f, -1e30f, -87.4f, -1.f, -0.5f}, ys[8];
    simd::row_sum_exp(xs, 8, 0.0f, ys);
    EXPECT_EQ(ys[0], 0.f);
    EXPECT_TRUE(std::isnan(ys[1]));
    EXPECT_EQ(ys[2], 1.f);
    EXPECT_EQ(ys[3], 1.f);
    EXPECT_EQ(ys[4], 0.f);
    EXPECT_EQ(ys[5], 0.f);
  }
  simd::select_path(start);
}

TEST(Softmax, RowsSumToOneAndLargeValuesAreStable) {
  for (int64_t opset : {11, 13}) {
    for (int64_t axis : {-1, 0, 1}) {
      auto node = make_node("Softmax", 1, 1);
      set_int(node, "axis", axis);
      Tensor x = randn({4, 37}, 1);
      x.data<float>()[5] = 1000.f;  // no overflow: max is subtracted
      Tensor y = run_node(node, opset, {x})[0];
      int64_t ax = axis < 0 ? 1 : axis;
      if (ax == 0 && opset < 13) continue;  // coerced 2-D over everything: one row
      for (int64_t o = 0; o < (ax == 1 ? 4 : 37); o++) {
        double s = 0;
        for (int64_t r = 0; r < (ax == 1 ? 37 : 4); r++)
          s += ax == 1 ? y.data<float>()[o * 37 + r] : y.data<float>()[r * 37 + o];
        EXPECT_NEAR(s, 1.0, 1e-5) << "opset " << opset << " axis " << axis << " row " << o;
      }
      EXPECT_NEAR(y.data<float>()[5], ax == 1 ? 1.0 : 1.0, 1e-6);
    }
  }
}

TEST(LogSoftmax, MatchesLogOfSoftmax) {
  Tensor x = randn({3, 5, 19}, 2);
  for (int64_t axis : {1, 2}) {
    auto sm = make_node("Softmax", 1, 1), lsm = make_node("LogSoftmax", 1, 1);
    set_int(sm, "axis", axis);
    set_int(lsm, "axis", axis);
    Tensor a = run_node(sm, 13, {x})[0], b = run_node(lsm, 13, {x})[0];
    for (int64_t i = 0; i < x.numel(); i++)
      EXPECT_NEAR(std::log(a.data<float>()[i]), b.data<float>()[i], 1e-5);
  }
}

TEST(LayerNorm, MatchesNaiveDoubleLoop) {
  const int64_t B = 3, T = 5, C = 67;
  Tensor x = randn({B, T, C}, 3), sc = randn({C}, 4), bias = randn({C}, 5);
  auto node = make_node("LayerNormalization", 3, 3);
  set_float(node, "epsilon", 1e-5f);
  auto out = run_node(node, 17, {x, sc, bias});
  ASSERT_EQ(out[1].shape(), (Shape{B, T, 1}));
  ASSERT_EQ(out[2].shape(), (Shape{B, T, 1}));
  const float* xp = x.data<float>();
  for (int64_t r = 0; r < B * T; r++) {
    double m = 0, v = 0;
    for (int64_t c = 0; c < C; c++) m += xp[r * C + c];
    m /= C;
    for (int64_t c = 0; c < C; c++) v += (xp[r * C + c] - m) * (xp[r * C + c] - m);
    v /= C;
    double inv = 1.0 / std::sqrt(v + 1e-5);
    EXPECT_NEAR(out[1].data<float>()[r], m, 1e-5);
    EXPECT_NEAR(out[2].data<float>()[r], inv, 1e-4 * inv);
    for (int64_t c = 0; c < C; c++) {
      double y = (xp[r * C + c] - m) * inv * sc.data<float>()[c] + bias.data<float>()[c];
      EXPECT_NEAR(out[0].data<float>()[r * C + c], y, 1e-4);
    }
  }
}

TEST(SoftmaxCrossEntropy, IgnoreIndexAndWeightedMean) {
  // N=3, C=4; target 1 is ignored.
  const int64_t N = 3, C = 4;
  Tensor x = randn({N, C}, 6);
  Tensor t = Tensor::from_vector(DType::Int64, {N}, std::vector<int64_t>{2, 1, 0});
  Tensor w = Tensor::from_vector(DType::Float32, {C}, std::vector<float>{0.5f, 2.f, 1.5f, 1.f});
  auto node = make_node("SoftmaxCrossEntropyLoss", 3, 2);
  set_int(node, "ignore_index", 1);
  auto out = run_node(node, 13, {x, t, w});
  const float* xp = x.data<float>();
  double num = 0, den = 0;
  for (int64_t n = 0; n < N; n++) {
    double m = -1e30, s = 0;
    for (int64_t c = 0; c < C; c++) m = std::max(m, (double)xp[n * C + c]);
    for (int64_t c = 0; c < C; c++) s += std::exp(xp[n * C + c] - m);
    for (int64_t c = 0; c < C; c++)
      EXPECT_NEAR(out[1].data<float>()[n * C + c], xp[n * C + c] - m - std::log(s), 1e-5);
    int64_t tc = t.data<int64_t>()[n];
    if (tc == 1) continue;
    double wc = w.data<float>()[tc];
    num += -(xp[n * C + tc] - m - std::log(s)) * wc;
    den += wc;
  }
  ASSERT_EQ(out[0].rank(), 0);
  EXPECT_NEAR(out[0].data<float>()[0], num / den, 1e-5);

  // reduction none: ignored element is 0
  set_string(node, "reduction", "none");
  auto none = run_node(node, 13, {x, t, w});
  ASSERT_EQ(none[0].shape(), (Shape{N}));
  EXPECT_EQ(none[0].data<float>()[1], 0.f);

  // a target outside [0, C) that is not ignore_index is an error
  Tensor bad = Tensor::from_vector(DType::Int64, {N}, std::vector<int64_t>{2, 7, 0});
  EXPECT_THROW(run_node(node, 13, {x, bad, w}), Error);
}

TEST(Dropout, InferenceAndZeroRatioAreIdentity) {
  Tensor x = randn({1000}, 7);
  auto node = make_node("Dropout", 3, 2);
  for (auto [ratio, train] : std::vector<std::pair<float, bool>>{{0.5f, false}, {0.f, true}}) {
    auto out = run_node(node, 13, {x, Tensor::scalar_f32(ratio), bool_scalar(train)});
    for (int64_t i = 0; i < x.numel(); i++) {
      EXPECT_EQ(out[0].data<float>()[i], x.data<float>()[i]);
      EXPECT_TRUE(out[1].data<bool>()[i]);
    }
  }
}

TEST(Dropout, TrainingStatisticsAndDeterminism) {
  const int64_t n = 200000;
  Tensor x = randn({n}, 8);
  auto node = make_node("Dropout", 3, 2);
  set_int(node, "seed", 42);
  for (float ratio : {0.1f, 0.5f, 0.9f}) {
    runtime::RunOptions opts;
    opts.training = true;
    opts.seed = 1234;
    auto a = run_node(node, 13, {x, Tensor::scalar_f32(ratio), bool_scalar(true)}, opts);
    auto b = run_node(node, 13, {x, Tensor::scalar_f32(ratio), bool_scalar(true)}, opts);
    int64_t dropped = 0;
    for (int64_t i = 0; i < n; i++) {
      bool keep = a[1].data<bool>()[i];
      float y = a[0].data<float>()[i];
      if (keep)
        EXPECT_FLOAT_EQ(y, x.data<float>()[i] / (1.0f - ratio));
      else {
        EXPECT_EQ(y, 0.f);
        dropped++;
      }
      ASSERT_EQ(keep, b[1].data<bool>()[i]) << "same seed must give the same mask";
    }
    EXPECT_NEAR((double)dropped / n, ratio, 0.01) << "ratio " << ratio;
    // the mask does not depend on the thread count
    int saved = runtime::num_threads();
    runtime::set_num_threads(1);
    auto single = run_node(node, 13, {x, Tensor::scalar_f32(ratio), bool_scalar(true)}, opts);
    runtime::set_num_threads(saved);
    for (int64_t i = 0; i < n; i++) ASSERT_EQ(single[0].data<float>()[i], a[0].data<float>()[i]);
    // another run seed gives another mask
    opts.seed = 1235;
    auto c = run_node(node, 13, {x, Tensor::scalar_f32(ratio), bool_scalar(true)}, opts);
    int64_t diff = 0;
    for (int64_t i = 0; i < n; i++) diff += a[1].data<bool>()[i] != c[1].data<bool>()[i];
    EXPECT_GT(diff, n / 100);
  }
}

// Naive reduction of a (2,3,4,5) tensor over `axes` against the kernel (ReduceSum/Mean/Max).
TEST(Reduce, FastAndGeneralPathsMatchNaive) {
  Shape s{2, 3, 4, 5};
  Tensor x = randn(s, 9);
  const float* xp = x.data<float>();
  // {0, 2, 3} and {0, 3}: reduced, kept, reduced (a convolution's bias gradient's shape)
  std::vector<std::vector<int64_t>> cases{{3},    {0},          {0, 1}, {1},       {0, 2},
                                          {1, 3}, {0, 1, 2, 3}, {2, 3}, {0, 2, 3}, {0, 3}};
  for (const char* op : {"ReduceSum", "ReduceMean", "ReduceMax", "ReduceLogSumExp", "ReduceL2"}) {
    for (auto& axes : cases) {
      // ReduceSum takes axes as an input from opset 13, the others as an attribute until 18.
      bool axes_input = std::string(op) == "ReduceSum";
      auto node = make_node(op, axes_input ? 2 : 1, 1);
      if (!axes_input) set_ints(node, "axes", axes);
      set_int(node, "keepdims", 1);
      Tensor axes_t = Tensor::from_vector(DType::Int64, {(int64_t)axes.size()}, axes);
      Tensor y = axes_input ? run_node(node, 13, {x, axes_t})[0] : run_node(node, 13, {x})[0];
      // naive
      std::vector<bool> red(4, false);
      for (auto a : axes) red[a] = true;
      Shape os = s;
      for (int k = 0; k < 4; k++)
        if (red[k]) os[k] = 1;
      ASSERT_EQ(y.shape(), os);
      std::vector<std::vector<double>> groups(shape_numel(os));
      int64_t idx[4];
      for (idx[0] = 0; idx[0] < 2; idx[0]++)
        for (idx[1] = 0; idx[1] < 3; idx[1]++)
          for (idx[2] = 0; idx[2] < 4; idx[2]++)
            for (idx[3] = 0; idx[3] < 5; idx[3]++) {
              int64_t o = 0, i = 0;
              for (int k = 0; k < 4; k++) {
                o = o * os[k] + (red[k] ? 0 : idx[k]);
                i = i * s[k] + idx[k];
              }
              groups[o].push_back(xp[i]);
            }
      for (size_t o = 0; o < groups.size(); o++) {
        auto& g = groups[o];
        double r = 0, m = -1e30;
        for (double v : g) m = std::max(m, v);
        std::string sop = op;
        if (sop == "ReduceSum" || sop == "ReduceMean")
          for (double v : g) r += v;
        if (sop == "ReduceMean") r /= g.size();
        if (sop == "ReduceMax") r = m;
        if (sop == "ReduceLogSumExp") {
          for (double v : g) r += std::exp(v - m);
          r = m + std::log(r);
        }
        if (sop == "ReduceL2") {
          for (double v : g) r += v * v;
          r = std::sqrt(r);
        }
        EXPECT_NEAR(y.data<float>()[o], r, 1e-4)
            << op << " axes size " << axes.size() << " at " << o;
      }
    }
  }
}

TEST(Reduce, AxesInputNoopAndOpset18) {
  Tensor x = randn({3, 4}, 10);
  auto node = make_node("ReduceSum", 2, 1);
  set_int(node, "noop_with_empty_axes", 1);
  Tensor empty_axes(DType::Int64, {0});
  Tensor y = run_node(node, 13, {x, empty_axes})[0];
  ASSERT_EQ(y.shape(), x.shape());
  for (int64_t i = 0; i < x.numel(); i++) EXPECT_EQ(y.data<float>()[i], x.data<float>()[i]);

  auto mean = make_node("ReduceMean", 2, 1);
  set_int(mean, "keepdims", 0);
  Tensor ax = Tensor::from_vector(DType::Int64, {1}, std::vector<int64_t>{-1});
  Tensor m = run_node(mean, 18, {x, ax})[0];
  ASSERT_EQ(m.shape(), (Shape{3}));
  for (int r = 0; r < 3; r++) {
    double s = 0;
    for (int c = 0; c < 4; c++) s += x.data<float>()[r * 4 + c];
    EXPECT_NEAR(m.data<float>()[r], s / 4, 1e-6);
  }
}

TEST(Reduce, ArgMaxSelectLastAndCumSum) {
  Tensor x = Tensor::from_vector(DType::Float32, {2, 3}, std::vector<float>{1, 3, 3, 5, 2, 5});
  auto am = make_node("ArgMax", 1, 1);
  set_int(am, "axis", 1);
  Tensor a = run_node(am, 13, {x})[0];
  ASSERT_EQ(a.shape(), (Shape{2, 1}));
  EXPECT_EQ(a.data<int64_t>()[0], 1);
  EXPECT_EQ(a.data<int64_t>()[1], 0);
  set_int(am, "select_last_index", 1);
  a = run_node(am, 13, {x})[0];
  EXPECT_EQ(a.data<int64_t>()[0], 2);
  EXPECT_EQ(a.data<int64_t>()[1], 2);

  auto cs = make_node("CumSum", 2, 1);
  set_int(cs, "exclusive", 1);
  set_int(cs, "reverse", 1);
  Tensor y = run_node(cs, 14, {x, Tensor::scalar_i64(1)})[0];
  std::vector<float> expect{6, 3, 0, 7, 5, 0};
  for (int i = 0; i < 6; i++) EXPECT_EQ(y.data<float>()[i], expect[i]);
}

TEST(Reduce, IntegerAndHalfTypes) {
  // int64 sums stay exact beyond 2^53
  int64_t big = (int64_t(1) << 60) + 1;
  Tensor xi = Tensor::from_vector(DType::Int64, {2, 2}, std::vector<int64_t>{big, 1, -3, 7});
  auto sum = make_node("ReduceSum", 2, 1);
  set_int(sum, "keepdims", 0);
  Tensor ax = Tensor::from_vector(DType::Int64, {1}, std::vector<int64_t>{1});
  Tensor s = run_node(sum, 13, {xi, ax})[0];
  EXPECT_EQ(s.data<int64_t>()[0], big + 1);
  EXPECT_EQ(s.data<int64_t>()[1], 4);

  // float16 max over everything (opset 18, axes input absent)
  std::vector<uint16_t> h{float_to_half(1.5f), float_to_half(-2.f), float_to_half(7.25f)};
  Tensor xh = Tensor::from_vector(DType::Float16, {3}, h);
  auto mx = make_node("ReduceMax", 1, 1);
  Tensor m = run_node(mx, 18, {xh})[0];
  ASSERT_EQ(m.shape(), (Shape{1}));
  EXPECT_EQ(half_to_float(m.data<uint16_t>()[0]), 7.25f);

  // repeated axes are an error
  auto mean = make_node("ReduceMean", 1, 1);
  set_ints(mean, "axes", {1, -1});
  EXPECT_THROW(run_node(mean, 13, {xi}), Error);
}
