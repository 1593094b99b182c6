// test_elementwise.cc — hand-checked cases for the elementwise family (elementwise*.cc, cast.cc):
// broadcasting shapes against a naive loop, C-style integer division and Python-style Mod, Cast
// rounding to float16/bfloat16 and float->int truncation, Gelu's two forms, Clip with absent
// bounds, Where, and the float32 vector math (exp, tanh, erf) against libm.
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/elementwise/elementwise.h"
#include "runtime/session.h"

namespace onyx::runtime {
namespace {

ir::Node make_node(const std::string& op, int n_in, const std::string& domain = "") {
  ir::Node n;
  n.name = "t_" + op;
  n.op_type = op;
  n.domain = domain;
  for (int i = 0; i < n_in; i++) n.inputs.push_back(cat("in", i));
  n.outputs.push_back("out");
  return n;
}

void set_int(ir::Node& n, const std::string& k, int64_t v) {
  ir::Attribute a;
  a.kind = ir::Attribute::Kind::Int;
  a.i = v;
  n.attrs[k] = a;
}

void set_string(ir::Node& n, const std::string& k, const std::string& v) {
  ir::Attribute a;
  a.kind = ir::Attribute::Kind::String;
  a.s = v;
  n.attrs[k] = a;
}

Tensor f32(Shape s, std::vector<float> v) { return Tensor::from_vector(DType::Float32, s, v); }
Tensor i32(Shape s, std::vector<int32_t> v) { return Tensor::from_vector(DType::Int32, s, v); }
Tensor i64(Shape s, std::vector<int64_t> v) { return Tensor::from_vector(DType::Int64, s, v); }
Tensor iota(Shape s, float scale = 1.0f) {
  std::vector<float> v(shape_numel(s));
  for (size_t i = 0; i < v.size(); i++) v[i] = (float)i * scale;
  return f32(s, v);
}
template <class T>
std::vector<T> values(const Tensor& t) {
  return std::vector<T>(t.data<T>(), t.data<T>() + t.numel());
}

// Naive numpy broadcast of a + b for float32, index arithmetic on the full shape.
std::vector<float> naive_add(const Tensor& a, const Tensor& b, const Shape& out) {
  size_t r = out.size();
  std::vector<float> res(shape_numel(out));
  for (int64_t i = 0; i < (int64_t)res.size(); i++) {
    int64_t rem = i, oa = 0, ob = 0, sa = 1, sb = 1;
    for (size_t d = r; d-- > 0;) {
      int64_t idx = rem % out[d];
      rem /= out[d];
      int64_t da = d >= r - a.rank() ? a.shape()[d - (r - a.rank())] : 1;
      int64_t db = d >= r - b.rank() ? b.shape()[d - (r - b.rank())] : 1;
      if (da != 1) oa += idx * sa;
      if (db != 1) ob += idx * sb;
      sa *= da;
      sb *= db;
    }
    res[i] = a.data<float>()[oa] + b.data<float>()[ob];
  }
  return res;
}

TEST(ElementwiseKernels, AddBroadcastsLikeNumpy) {
  auto n = make_node("Add", 2);
  struct Case {
    Shape a, b, out;
  };
  std::vector<Case> cases = {
      {{2, 3, 4}, {2, 3, 4}, {2, 3, 4}},  // same shape
      {{2, 3, 4}, {}, {2, 3, 4}},         // scalar
      {{2, 3, 4}, {4}, {2, 3, 4}},        // row (bias)
      {{2, 3, 4}, {2, 3, 1}, {2, 3, 4}},  // column
      {{3, 1}, {1, 4}, {3, 4}},           // outer
      {{2, 1, 4}, {3, 1}, {2, 3, 4}},     // mixed
      {{1, 3, 1, 5}, {2, 1, 4, 1}, {2, 3, 4, 5}},
      {{0, 3}, {3}, {0, 3}},  // empty
  };
  for (auto& c : cases) {
    Tensor a = iota(c.a), b = iota(c.b, 100.0f);
    auto out = run_node(n, 14, {a, b});
    ASSERT_EQ(out[0].shape(), c.out) << shape_str(c.a) << " + " << shape_str(c.b);
    EXPECT_EQ(values<float>(out[0]), naive_add(a, b, c.out))
        << shape_str(c.a) << " + " << shape_str(c.b);
  }
}

TEST(ElementwiseKernels, LargeAddIsThreadedAndCorrect) {
  auto n = make_node("Add", 2);
  Tensor a = iota({64, 1000}), b = iota({1000}, 0.5f);
  auto out = run_node(n, 14, {a, b});
  EXPECT_EQ(values<float>(out[0]), naive_add(a, b, {64, 1000}));
}

TEST(ElementwiseKernels, IncompatibleShapesThrow) {
  auto n = make_node("Mul", 2);
  EXPECT_THROW(run_node(n, 14, {iota({2, 3}), iota({4})}), Error);
}

TEST(ElementwiseKernels, IntegerDivTruncatesAndModFollowsDivisorSign) {
  auto div = make_node("Div", 2);
  auto out = run_node(div, 14, {i32({4}, {7, -7, 7, -7}), i32({4}, {2, 2, -2, -2})});
  EXPECT_EQ(values<int32_t>(out[0]), (std::vector<int32_t>{3, -3, -3, 3}));

  auto mod = make_node("Mod", 2);
  auto m = run_node(mod, 13, {i64({4}, {7, -7, 7, -7}), i64({4}, {3, 3, -3, -3})});
  EXPECT_EQ(values<int64_t>(m[0]), (std::vector<int64_t>{1, 2, -2, -1}));
  set_int(mod, "fmod", 1);
  auto f = run_node(mod, 13, {i64({4}, {7, -7, 7, -7}), i64({4}, {3, 3, -3, -3})});
  EXPECT_EQ(values<int64_t>(f[0]), (std::vector<int64_t>{1, -1, 1, -1}));
}

TEST(ElementwiseKernels, PowMixedTypesKeepsBaseType) {
  auto n = make_node("Pow", 2);
  auto a = run_node(n, 15, {i32({3}, {1, 2, 3}), f32({3}, {1, 2, 3})});
  EXPECT_EQ(a[0].dtype(), DType::Int32);
  EXPECT_EQ(values<int32_t>(a[0]), (std::vector<int32_t>{1, 4, 27}));
  auto b = run_node(n, 15, {f32({3}, {1.5f, 2, -3}), i64({1}, {2})});
  EXPECT_EQ(values<float>(b[0]), (std::vector<float>{2.25f, 4, 9}));
  // float32 fast paths for scalar exponents agree with powf.
  std::vector<float> x = {0.5f, -1.5f, 3.0f, 7.25f, 1e-3f, 2.0f, 10.0f, 0.1f, 4.0f};
  for (float e : {2.0f, 3.0f, 0.5f, 1.0f, -1.0f, 1.5f}) {
    auto p = run_node(n, 15, {f32({9}, x), f32({}, {e})});
    for (size_t i = 0; i < x.size(); i++) {
      float want = std::pow(x[i], e);
      if (std::isnan(want))
        EXPECT_TRUE(std::isnan(p[0].data<float>()[i]));
      else
        EXPECT_NEAR(p[0].data<float>()[i], want, 2e-7f * std::fabs(want)) << x[i] << "^" << e;
    }
  }
}

TEST(ElementwiseKernels, CastRoundsToNearestEvenAndTruncatesToInt) {
  auto n = make_node("Cast", 1);
  set_int(n, "to", (int64_t)DType::Float16);
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to even (1.0); 1 + 3*2^-11 rounds up.
  auto h = run_node(n, 13, {f32({3}, {1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, 70000.0f})});
  ASSERT_EQ(h[0].dtype(), DType::Float16);
  const uint16_t* bits = h[0].data<uint16_t>();
  EXPECT_EQ(bits[0], 0x3c00);
  EXPECT_EQ(bits[1], 0x3c02);
  EXPECT_EQ(bits[2], 0x7c00);  // overflow -> inf

  set_int(n, "to", (int64_t)DType::BFloat16);
  auto bf = run_node(n, 13, {f32({2}, {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f})});
  EXPECT_EQ(bf[0].data<uint16_t>()[0], 0x3f80);
  EXPECT_EQ(bf[0].data<uint16_t>()[1], 0x3f82);

  set_int(n, "to", (int64_t)DType::Int32);
  auto i = run_node(n, 13, {f32({4}, {2.7f, -2.7f, 0.5f, -0.5f})});
  EXPECT_EQ(values<int32_t>(i[0]), (std::vector<int32_t>{2, -2, 0, 0}));

  set_int(n, "to", (int64_t)DType::Bool);
  auto bl = run_node(n, 13, {f32({3}, {0.0f, -0.1f, NAN})});
  EXPECT_EQ(values<uint8_t>(bl[0]), (std::vector<uint8_t>{0, 1, 1}));

  // double -> float16 is rounded once: just above a float16 tie (not representable as float).
  set_int(n, "to", (int64_t)DType::Float16);
  auto d = run_node(
      n, 13,
      {Tensor::from_vector(DType::Float64, {1}, std::vector<double>{1.0 + 0x1p-11 + 0x1p-40})});
  EXPECT_EQ(d[0].data<uint16_t>()[0], 0x3c01);

  auto like = make_node("CastLike", 2);
  auto l = run_node(like, 15, {f32({2}, {3.9f, -1.0f}), i64({1}, {0})});
  EXPECT_EQ(values<int64_t>(l[0]), (std::vector<int64_t>{3, -1}));
}

TEST(ElementwiseKernels, VectorHalfConversionsMatchScalar) {
  std::vector<float> x;
  for (int i = 0; i < 997; i++)
    x.push_back(std::ldexp((float)((i * 7919) % 2048) - 1024.0f, (i % 40) - 30));
  x.insert(x.end(), {INFINITY, -INFINITY, 65519.0f, 65520.0f, 1e-8f, -3e-5f, 0.0f, -0.0f});
  auto n = make_node("Cast", 1);
  set_int(n, "to", (int64_t)DType::Float16);
  auto h = run_node(n, 13, {f32({(int64_t)x.size()}, x)});
  for (size_t i = 0; i < x.size(); i++)
    ASSERT_EQ(h[0].data<uint16_t>()[i], float_to_half(x[i])) << x[i];
  set_int(n, "to", (int64_t)DType::Float32);
  auto back = run_node(n, 13, {h[0]});
  for (size_t i = 0; i < x.size(); i++)
    ASSERT_EQ(back[0].data<float>()[i], half_to_float(float_to_half(x[i])));
  // A float16 unary op goes through the same float blocks.
  auto neg = run_node(make_node("Neg", 1), 13, {h[0]});
  for (size_t i = 0; i < x.size(); i++)
    ASSERT_EQ(neg[0].data<uint16_t>()[i], h[0].data<uint16_t>()[i] ^ 0x8000);
}

TEST(ElementwiseKernels, GeluBothForms) {
  std::vector<float> x = {-3.0f, -1.0f, -0.25f, 0.0f, 0.5f, 1.0f, 2.5f, 10.0f};
  for (int n = 0; n < 5; n++) x.insert(x.end(), {0.1f * n, -0.3f * n});  // exercise the tail
  auto exact = [](double v) { return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0))); };
  auto approx = [](double v) {
    return 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
  };
  Tensor t = f32({(int64_t)x.size()}, x);

  auto g = make_node("Gelu", 1);
  auto none = run_node(g, 20, {t});
  set_string(g, "approximate", "tanh");
  auto tanh_form = run_node(g, 20, {t});
  auto ms = run_node(make_node("Gelu", 1, "com.microsoft"), 1, {t});
  auto fast = run_node(make_node("FastGelu", 1, "com.microsoft"), 1, {t});
  for (size_t i = 0; i < x.size(); i++) {
    EXPECT_NEAR(none[0].data<float>()[i], exact(x[i]), 2e-7 + 2e-7 * std::fabs(exact(x[i])))
        << x[i];
    EXPECT_NEAR(ms[0].data<float>()[i], exact(x[i]), 2e-7 + 2e-7 * std::fabs(exact(x[i]))) << x[i];
    EXPECT_NEAR(tanh_form[0].data<float>()[i], approx(x[i]), 3e-7 + 3e-7 * std::fabs(approx(x[i])));
    EXPECT_NEAR(fast[0].data<float>()[i], approx(x[i]), 3e-7 + 3e-7 * std::fabs(approx(x[i])));
  }
  // FastGelu with bias over the last dim: gelu(x + b).
  auto fb = run_node(make_node("FastGelu", 2, "com.microsoft"), 1,
                     {f32({2, 2}, {0, 1, 2, 3}), f32({2}, {1, -1})});
  std::vector<float> want = {(float)approx(1), (float)approx(0), (float)approx(3),
                             (float)approx(2)};
  for (int i = 0; i < 4; i++) EXPECT_NEAR(fb[0].data<float>()[i], want[i], 1e-6);

  set_string(g, "approximate", "sigmoid");
  EXPECT_THROW(run_node(g, 20, {t}), Unsupported);
}

TEST(ElementwiseKernels, VectorMathMatchesLibm) {
  std::vector<float> x;
  for (float v = -12.0f; v <= 12.0f; v += 0.0007f) x.push_back(v);
  x.insert(x.end(), {0.0f, -0.0f, 1e-30f, -1e-30f, 90.0f, -90.0f, -110.0f, 1e-3f});
  std::vector<float> y(x.size());
  double erf_err = 0, tanh_err = 0, exp_rel = 0;
  kernels::ew::erf_f32(x.data(), y.data(), (int64_t)x.size());
  for (size_t i = 0; i < x.size(); i++)
    erf_err = std::max(erf_err, std::fabs(y[i] - std::erf((double)x[i])));
  kernels::ew::tanh_f32(x.data(), y.data(), (int64_t)x.size());
  for (size_t i = 0; i < x.size(); i++)
    tanh_err = std::max(tanh_err, std::fabs(y[i] - std::tanh((double)x[i])));
  kernels::ew::exp_f32(x.data(), y.data(), (int64_t)x.size());
  for (size_t i = 0; i < x.size(); i++) {
    double want = std::exp((double)x[i]);
    if (want > 1e-37 && want < 3e38) exp_rel = std::max(exp_rel, std::fabs(y[i] - want) / want);
  }
  EXPECT_LT(erf_err, 1e-7);
  EXPECT_LT(tanh_err, 1e-7);
  EXPECT_LT(exp_rel, 2.5e-7);

  std::vector<float> special = {INFINITY, -INFINITY, NAN, 100.0f, -200.0f};
  std::vector<float> e(special.size());
  kernels::ew::exp_f32(special.data(), e.data(), 5);
  EXPECT_EQ(e[0], INFINITY);
  EXPECT_EQ(e[1], 0.0f);
  EXPECT_TRUE(std::isnan(e[2]));
  EXPECT_EQ(e[3], INFINITY);
  EXPECT_EQ(e[4], 0.0f);
  kernels::ew::erf_f32(special.data(), e.data(), 3);
  EXPECT_EQ(e[0], 1.0f);
  EXPECT_EQ(e[1], -1.0f);
  EXPECT_TRUE(std::isnan(e[2]));
  kernels::ew::tanh_f32(special.data(), e.data(), 3);
  EXPECT_EQ(e[0], 1.0f);
  EXPECT_EQ(e[1], -1.0f);
  EXPECT_TRUE(std::isnan(e[2]));
}

TEST(ElementwiseKernels, ClipWithAbsentBoundsAndIntegers) {
  auto n = make_node("Clip", 3);
  n.inputs[1] = "";  // no min
  auto out = run_node(n, 13, {f32({4}, {-5, 0, 5, NAN}), Tensor(), f32({}, {2})});
  auto v = values<float>(out[0]);
  EXPECT_EQ(v[0], -5);
  EXPECT_EQ(v[2], 2);
  EXPECT_TRUE(std::isnan(v[3]));
  auto i8 = Tensor::from_vector(DType::Int8, {3}, std::vector<int8_t>{-100, 3, 100});
  auto lo = Tensor::from_vector(DType::Int8, {}, std::vector<int8_t>{-10});
  auto c = run_node(make_node("Clip", 2), 13, {i8, lo});
  EXPECT_EQ(values<int8_t>(c[0]), (std::vector<int8_t>{-10, 3, 100}));
}

TEST(ElementwiseKernels, WhereAndComparisonsBroadcast) {
  auto less = make_node("Less", 2);
  auto cmp = run_node(less, 13, {iota({2, 3}), f32({3}, {2, 2, 2})});
  EXPECT_EQ(cmp[0].dtype(), DType::Bool);
  EXPECT_EQ(values<uint8_t>(cmp[0]), (std::vector<uint8_t>{1, 1, 0, 0, 0, 0}));
  auto where = make_node("Where", 3);
  auto w = run_node(where, 16, {cmp[0], iota({2, 3}), f32({}, {-1})});
  EXPECT_EQ(values<float>(w[0]), (std::vector<float>{0, 1, -1, -1, -1, -1}));
}

TEST(ElementwiseKernels, VariadicMaxAndMeanBroadcast) {
  auto mx = make_node("Max", 3);
  auto m = run_node(mx, 13, {f32({3}, {1, 5, 2}), f32({2, 1}, {3, 0}), f32({}, {NAN})});
  for (float v : values<float>(m[0])) EXPECT_TRUE(std::isnan(v));
  auto m2 = run_node(make_node("Max", 2), 13, {f32({3}, {1, 5, 2}), f32({2, 1}, {3, 0})});
  EXPECT_EQ(values<float>(m2[0]), (std::vector<float>{3, 5, 3, 1, 5, 2}));
  auto mean =
      run_node(make_node("Mean", 3), 13, {f32({2}, {1, 2}), f32({1}, {3}), f32({2}, {5, 7})});
  EXPECT_EQ(values<float>(mean[0]), (std::vector<float>{3, 4}));
}

}  // namespace
}  // namespace onyx::runtime
