// test_bf16_gemm.cc — the bfloat16 GEMM path (kernels/cpu/gemm.h gemm_bf16, gemm_f32_bf16, the
// conversions) and onyx.MatMulT / onyx.LinearCrossEntropy reading a bfloat16 weight: against a
// float64 loop over the bf16-rounded operands (the products are exact; only the float32
// summation differs), on this CPU's oneDNN path and on the widened float32 fallback.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "kernels/cpu/gemm.h"
#include "onyx/dtype.h"
#include "runtime/session.h"

namespace onyx {
namespace {

std::vector<float> randoms(int64_t n, uint32_t seed, float lo = -1, float hi = 1) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v((size_t)n);
  for (auto& x : v) x = d(g);
  return v;
}

std::vector<uint16_t> to_bf16(const std::vector<float>& x) {
  std::vector<uint16_t> y(x.size());
  for (size_t i = 0; i < x.size(); i++) y[i] = float_to_bf16(x[i]);
  return y;
}

// C = alpha op(A) op(B) + beta C in float64 from bf16 bits.
std::vector<double> reference(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha,
                              const std::vector<uint16_t>& A, int64_t lda,
                              const std::vector<uint16_t>& B, int64_t ldb, double beta,
                              const std::vector<float>& C0, int64_t ldc) {
  std::vector<double> C(C0.begin(), C0.end());
  for (int64_t i = 0; i < M; i++)
    for (int64_t j = 0; j < N; j++) {
      double s = 0;
      for (int64_t k = 0; k < K; k++)
        s += (double)bf16_to_float(ta ? A[k * lda + i] : A[i * lda + k]) *
             (double)bf16_to_float(tb ? B[j * ldb + k] : B[k * ldb + j]);
      C[i * ldc + j] = alpha * s + beta * (double)C0[i * ldc + j];
    }
  return C;
}

// max |got - want| / (max |want|): float32 accumulation of exact products
double rel_err(const std::vector<float>& got, const std::vector<double>& want) {
  double big = 0, worst = 0;
  for (double w : want) big = std::max(big, std::fabs(w));
  for (size_t i = 0; i < want.size(); i++) worst = std::max(worst, std::fabs(got[i] - want[i]));
  return worst / std::max(big, 1e-30);
}

TEST(Bf16Gemm, ConversionRoundsToNearestEvenLikeTheScalarRule) {
  std::vector<float> x = randoms(1000, 3, -1e3f, 1e3f);
  x[0] = NAN, x[1] = INFINITY, x[2] = -0.0f, x[3] = 1e-40f;  // NaN, inf, -0, a denormal
  x[4] = bf16_to_float(0x3f80) + std::ldexp(1.0f, -8);       // a tie: 1 + 2^-8 rounds to 1
  std::vector<uint16_t> y(x.size());
  kernels::f32_to_bf16(x.data(), y.data(), (int64_t)x.size());
  for (size_t i = 0; i < x.size(); i++)
    if (std::isnan(x[i]))
      EXPECT_TRUE(std::isnan(bf16_to_float(y[i]))) << i;
    else if (std::fpclassify(x[i]) == FP_SUBNORMAL)
      EXPECT_EQ(y[i], 0) << i << ": a denormal flushes to zero (as vcvtneps2bf16)";
    else
      EXPECT_EQ(y[i], float_to_bf16(x[i])) << i << ": " << x[i];
  EXPECT_EQ(y[4], 0x3f80);
  std::vector<float> back(x.size());
  kernels::bf16_to_f32(y.data(), back.data(), (int64_t)y.size());
  for (size_t i = 5; i < x.size(); i++) EXPECT_EQ(back[i], bf16_to_float(y[i]));
}

TEST(Bf16Gemm, MatchesFloat64OnRoundedOperands) {
  struct Case {
    bool ta, tb;
    int64_t M, N, K, lda, ldb, ldc;
    float alpha, beta;
  };
  for (const Case& c : {Case{false, false, 7, 5, 3, 3, 5, 5, 1.f, 0.f},
                        Case{false, true, 64, 48, 80, 80, 80, 48, 1.f, 0.f},
                        Case{true, false, 33, 17, 65, 40, 20, 19, 0.5f, 1.f},
                        Case{true, true, 16, 130, 31, 20, 40, 131, 2.f, 0.25f},
                        Case{false, false, 512, 256, 768, 768, 256, 256, 1.f, 0.f}}) {
    SCOPED_TRACE(cat(c.ta, c.tb, " ", c.M, "x", c.N, "x", c.K));
    auto A = to_bf16(randoms((c.ta ? c.K : c.M) * c.lda, 1));
    auto B = to_bf16(randoms((c.tb ? c.N : c.K) * c.ldb, 2));
    std::vector<float> C0 = randoms(c.M * c.ldc, 3), C = C0;
    kernels::gemm_bf16(c.ta, c.tb, c.M, c.N, c.K, c.alpha, A.data(), c.lda, B.data(), c.ldb, c.beta,
                       C.data(), c.ldc);
    auto want =
        reference(c.ta, c.tb, c.M, c.N, c.K, c.alpha, A, c.lda, B, c.ldb, c.beta, C0, c.ldc);
    EXPECT_LT(rel_err(C, want), 2e-6);
  }
}

// gemm_f32_bf16: A float32 rounded to bf16 (round to nearest even) first.
TEST(Bf16Gemm, MixedRoundsTheFloat32Operand) {
  const int64_t M = 70, N = 40, K = 50;
  std::vector<float> A = randoms(M * K, 4);
  auto B = to_bf16(randoms(N * K, 5));
  std::vector<float> C(M * N, 0.f);
  kernels::gemm_f32_bf16(true, M, N, K, 1.f, A.data(), K, B.data(), K, 0.f, C.data(), N);
  auto want = reference(false, true, M, N, K, 1.0, to_bf16(A), K, B, K, 0.0,
                        std::vector<float>(M * N, 0.f), N);
  EXPECT_LT(rel_err(C, want), 2e-6);
}

ir::Node node(const std::string& op, int inputs, int outputs) {
  ir::Node n;
  n.name = "n";
  n.op_type = op;
  n.domain = "onyx";
  for (int i = 0; i < inputs; i++) n.inputs.push_back(cat("in", i));
  for (int i = 0; i < outputs; i++) n.outputs.push_back(cat("out", i));
  return n;
}

Tensor bf16_tensor(const Shape& s, uint32_t seed) {
  Tensor t(DType::BFloat16, s);
  auto v = to_bf16(randoms(shape_numel(s), seed));
  std::memcpy(t.raw(), v.data(), v.size() * 2);
  return t;
}

Tensor widened(const Tensor& b16) {
  Tensor f(DType::Float32, b16.shape());
  kernels::bf16_to_f32(b16.data<uint16_t>(), f.data<float>(), f.numel());
  return f;
}

Tensor rounded(const Tensor& f32) {
  Tensor r = f32.clone();
  for (int64_t i = 0; i < r.numel(); i++)
    r.data<float>()[i] = bf16_to_float(float_to_bf16(r.data<float>()[i]));
  return r;
}

// MatMulT(A f32, W bf16 [, bias]) = MatMulT(round(A), widen(W) [, bias]) in float32, for the
// linear-layer layouts (transB 0/1, bias) and a batched one (the widened fallback).
TEST(Bf16Gemm, MatMulTWithABfloat16WeightIsTheFloat32OpOnRoundedInputs) {
  struct Case {
    Shape a, w;
    bool tb, bias;
  };
  for (const Case& c :
       {Case{{2, 9, 24}, {40, 24}, true, true}, Case{{3, 5, 24}, {24, 40}, false, false},
        Case{{2, 9, 24}, {2, 24, 16}, false, false}}) {
    SCOPED_TRACE(shape_str(c.a) + " x " + shape_str(c.w));
    ir::Node n = node("MatMulT", c.bias ? 3 : 2, 1);
    if (c.tb) n.attrs["transB"] = ir::Attribute::of_int(1);
    Tensor a = Tensor::from_vector(DType::Float32, c.a, randoms(shape_numel(c.a), 7));
    Tensor w = bf16_tensor(c.w, 8);
    int64_t N = c.tb ? c.w[0] : c.w.back();
    Tensor bias = Tensor::from_vector(DType::Float32, {N}, randoms(N, 9));
    std::vector<Tensor> in{a, w};
    std::vector<Tensor> ref_in{rounded(a), widened(w)};
    if (c.bias) in.push_back(bias), ref_in.push_back(bias);
    Tensor got = runtime::run_node(n, 17, in)[0];
    Tensor want = runtime::run_node(n, 17, ref_in)[0];
    ASSERT_EQ(got.dtype(), DType::Float32);
    ASSERT_EQ(got.shape(), want.shape());
    double big = 0, worst = 0;
    for (int64_t i = 0; i < want.numel(); i++)
      big = std::max(big, (double)std::fabs(want.data<float>()[i]));
    for (int64_t i = 0; i < want.numel(); i++)
      worst = std::max(worst, (double)std::fabs(got.data<float>()[i] - want.data<float>()[i]));
    EXPECT_LT(worst / big, 2e-6);
  }
}

// LinearCrossEntropy with a bf16 W: loss and dH as the float32 op computes them on the rounded H
// (and, for dH, the rounded dlogits: compared with a tolerance of bf16's rounding of dlogits).
TEST(Bf16Gemm, LinearCrossEntropyWithABfloat16Weight) {
  const int64_t N = 37, C = 24, V = 300;
  ir::Node n = node("LinearCrossEntropy", 3, 2);
  n.attrs["ignore_index"] = ir::Attribute::of_int(-100);
  n.attrs["chunk_rows"] = ir::Attribute::of_int(8);
  Tensor h = Tensor::from_vector(DType::Float32, {N, C}, randoms(N * C, 11));
  Tensor w = bf16_tensor({V, C}, 12);
  std::vector<int64_t> t(N);
  for (int64_t i = 0; i < N; i++) t[i] = i % 5 == 4 ? -100 : (i * 37) % V;
  Tensor labels = Tensor::from_vector<int64_t>(DType::Int64, {N}, t);
  auto got = runtime::run_node(n, 17, {h, w, labels});
  auto want = runtime::run_node(n, 17, {rounded(h), widened(w), labels});
  EXPECT_NEAR(got[0].get_as_double(0), want[0].get_as_double(0),
              1e-6 * std::fabs(want[0].get_as_double(0)));
  double big = 0, worst = 0;
  for (int64_t i = 0; i < N * C; i++) big = std::max(big, std::fabs(want[1].get_as_double(i)));
  for (int64_t i = 0; i < N * C; i++)
    worst = std::max(worst, std::fabs(got[1].get_as_double(i) - want[1].get_as_double(i)));
  EXPECT_LT(worst / big, 1e-2);  // dlogits rounded to bf16 (8 bits) before dH's GEMM
  EXPECT_GT(worst, 0.0);         // ... which the float32 op does not do
  // a bf16 W has no gradient: asking for dW is an error naming the node
  ir::Node with_dw = node("LinearCrossEntropy", 3, 3);
  with_dw.attrs["ignore_index"] = ir::Attribute::of_int(-100);
  EXPECT_THROW(runtime::run_node(with_dw, 17, {h, w, labels}), Error);
}

}  // namespace
}  // namespace onyx
