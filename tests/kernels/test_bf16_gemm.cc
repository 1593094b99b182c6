// test_bf16_gemm.cc — the bfloat16 GEMM path (kernels/cpu/gemm.h gemm_bf16, gemm_f32_bf16, the
// conversions) and onyx.MatMulT / onyx.LinearCrossEntropy reading a bfloat16 weight: against a
// float64 loop over the bf16-rounded operands (the products are exact; only the float32
// summation differs), on this CPU's oneDNN path and on the widened float32 fallback.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "kernels/cpu/gemm.h"
#include "onyx/dtype.h"
#include "runtime/parallel.h"
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
  // round_to_bf16: the same values without the bf16 array, also in place and past one 1024 block
  std::vector<float> big = randoms(5000, 4, -1e3f, 1e3f);
  std::copy(x.begin(), x.begin() + 5, big.begin());
  std::vector<uint16_t> big16(big.size());
  kernels::f32_to_bf16(big.data(), big16.data(), (int64_t)big.size());
  std::vector<float> r(big.size());
  kernels::round_to_bf16(big.data(), r.data(), (int64_t)big.size());
  kernels::round_to_bf16(big.data(), big.data(), (int64_t)big.size());
  for (size_t i = 0; i < big.size(); i++) {
    uint32_t want = (uint32_t)big16[i] << 16, got, in_place;
    std::memcpy(&got, &r[i], 4);
    std::memcpy(&in_place, &big[i], 4);
    EXPECT_EQ(got, want) << i;
    EXPECT_EQ(in_place, want) << i;
  }
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
// (and, for dH, the rounded dlogits: compared with a tolerance of bf16's rounding of dlogits);
// with dW, the mixed-precision run of the float32 W.
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
  // With dW (a bf16 W that is mixed precision's shadow of a trained float32 weight): every
  // output, dW included (float32), has the bits of the float32 W's mixed-precision run, which
  // rounds W itself (RunOptions::bf16_gemm).
  ir::Node with_dw = node("LinearCrossEntropy", 3, 3);
  with_dw.attrs["ignore_index"] = ir::Attribute::of_int(-100);
  with_dw.attrs["chunk_rows"] = ir::Attribute::of_int(8);
  runtime::RunOptions mixed;
  mixed.bf16_gemm = true;
  auto shadow = runtime::run_node(with_dw, 17, {h, w, labels}, mixed);
  auto master = runtime::run_node(with_dw, 17, {h, widened(w), labels}, mixed);
  ASSERT_EQ(shadow.size(), 3u);
  for (int i = 0; i < 3; i++) {
    ASSERT_EQ(shadow[i].dtype(), DType::Float32) << i;
    ASSERT_EQ(shadow[i].shape(), master[i].shape()) << i;
    EXPECT_EQ(std::memcmp(shadow[i].raw(), master[i].raw(), master[i].nbytes()), 0) << i;
  }
  EXPECT_EQ(shadow[2].shape(), Shape({V, C}));
}

// The mixed-precision pass's kernel forms (passes/mixed_precision.cc): output_dtype = BFLOAT16 on
// a float32 producer gives exactly Cast(float32 result, bf16); a bf16 Q/K/V, GeluGrad input or
// GEMM operand gives exactly the float32 op on the widened values.
Tensor cast_bf16(const Tensor& f32) {
  ir::Node c = node("Cast", 1, 1);
  c.domain = "";
  c.attrs["to"] = ir::Attribute::of_int((int64_t)DType::BFloat16);
  return runtime::run_node(c, 17, {f32})[0];
}
void expect_same_bits(const Tensor& a, const Tensor& b) {
  ASSERT_EQ(a.dtype(), b.dtype());
  ASSERT_EQ(a.shape(), b.shape());
  EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0);
}

TEST(Bf16Gemm, OutputDtypeBf16IsCastOfTheFloat32Result) {
  const ir::Attribute bf16 = ir::Attribute::of_int((int64_t)DType::BFloat16);
  Tensor x = Tensor::from_vector(DType::Float32, {6, 100}, randoms(600, 11, -4, 4));
  {  // Gelu, both forms; 600 elements: more than one 512-element block
    for (const char* approx : {"none", "tanh"}) {
      ir::Node g = node("Gelu", 1, 1);
      g.attrs["approximate"] = ir::Attribute::of_string(approx);
      Tensor want = cast_bf16(runtime::run_node(g, 17, {x})[0]);
      g.attrs["output_dtype"] = bf16;
      expect_same_bits(runtime::run_node(g, 17, {x})[0], want);
    }
  }
  {  // LayerNormalization: Y bf16, statistics float32 and unchanged
    ir::Node ln = node("LayerNormalization", 3, 3);
    Tensor gamma = Tensor::from_vector(DType::Float32, {100}, randoms(100, 12));
    Tensor beta = Tensor::from_vector(DType::Float32, {100}, randoms(100, 13));
    auto ref = runtime::run_node(ln, 17, {x, gamma, beta});
    ln.attrs["output_dtype"] = bf16;
    auto got = runtime::run_node(ln, 17, {x, gamma, beta});
    expect_same_bits(got[0], cast_bf16(ref[0]));
    expect_same_bits(got[1], ref[1]);
    expect_same_bits(got[2], ref[2]);
  }
  {  // onyx.RMSNorm: Y bf16, inv_rms float32 and unchanged; onyx.SwiGLU
    ir::Node rn = node("RMSNorm", 2, 2);
    Tensor scale = Tensor::from_vector(DType::Float32, {100}, randoms(100, 17));
    auto ref = runtime::run_node(rn, 17, {x, scale});
    rn.attrs["output_dtype"] = bf16;
    auto got = runtime::run_node(rn, 17, {x, scale});
    expect_same_bits(got[0], cast_bf16(ref[0]));
    expect_same_bits(got[1], ref[1]);
    ir::Node sw = node("SwiGLU", 2, 1);
    Tensor up = Tensor::from_vector(DType::Float32, {6, 100}, randoms(600, 18, -3, 3));
    Tensor want = cast_bf16(runtime::run_node(sw, 17, {x, up})[0]);
    sw.attrs["output_dtype"] = bf16;
    expect_same_bits(runtime::run_node(sw, 17, {x, up})[0], want);
  }
  {  // MatMulT with bias: float32 accumulation and bias, then rounded
    ir::Node mm = node("MatMulT", 3, 1);
    mm.attrs["transB"] = ir::Attribute::of_int(1);
    mm.attrs["output_dtype"] = ir::Attribute::of_int((int64_t)DType::Float32);
    Tensor a = bf16_tensor({2, 7, 100}, 14), w = bf16_tensor({24, 100}, 15);
    Tensor bias = Tensor::from_vector(DType::Float32, {24}, randoms(24, 16));
    Tensor want = cast_bf16(runtime::run_node(mm, 17, {a, w, bias})[0]);
    mm.attrs["output_dtype"] = bf16;
    expect_same_bits(runtime::run_node(mm, 17, {a, w, bias})[0], want);
    // large enough (51200 elements) that the rounding pass runs on two threads
    const int threads = runtime::num_threads();
    runtime::set_num_threads(2);
    Tensor a2 = bf16_tensor({4, 128, 100}, 24), w2 = bf16_tensor({100, 100}, 25);
    Tensor bias2 = Tensor::from_vector(DType::Float32, {100}, randoms(100, 26));
    mm.attrs["output_dtype"] = ir::Attribute::of_int((int64_t)DType::Float32);
    Tensor want2 = cast_bf16(runtime::run_node(mm, 17, {a2, w2, bias2})[0]);
    mm.attrs["output_dtype"] = bf16;
    expect_same_bits(runtime::run_node(mm, 17, {a2, w2, bias2})[0], want2);
    runtime::set_num_threads(threads);
    // where the rules differ: a float32 denormal result becomes a signed zero (the GEMM
    // epilogue's vcvtneps2bf16, kernels::f32_to_bf16), where Cast keeps a bf16 denormal — on
    // the native path and the widened one alike
    Tensor zeros(DType::BFloat16, {2, 7, 100});
    std::memset(zeros.raw(), 0, zeros.nbytes());
    std::vector<float> tiny(24, 3e-39f);
    tiny[1] = -3e-39f;
    Tensor tiny_bias = Tensor::from_vector(DType::Float32, {24}, tiny);
    for (int native : {1, 0}) {
      if (native && !kernels::bf16_gemm_native()) continue;  // (no bf16 matmul on this CPU)
      SCOPED_TRACE(native ? "native bf16 matmul" : "widened");
      kernels::force_bf16_gemm_native(native);
      Tensor y = runtime::run_node(mm, 17, {zeros, w, tiny_bias})[0];
      kernels::force_bf16_gemm_native(-1);
      EXPECT_EQ(y.data<uint16_t>()[0], 0x0000);
      EXPECT_EQ(y.data<uint16_t>()[1], 0x8000);
      EXPECT_NE(cast_bf16(tiny_bias).data<uint16_t>()[0], 0x0000);  // Cast keeps it
    }
  }
  {  // Attention: O written bf16
    ir::Node at = node("Attention", 3, 2);
    at.attrs["num_heads"] = ir::Attribute::of_int(2);
    at.attrs["causal"] = ir::Attribute::of_int(1);
    std::vector<Tensor> qkv;
    for (uint32_t k = 0; k < 3; k++)
      qkv.push_back(Tensor::from_vector(DType::Float32, {2, 70, 16}, randoms(2 * 70 * 16, 20 + k)));
    auto ref = runtime::run_node(at, 17, qkv);
    at.attrs["output_dtype"] = bf16;
    auto got = runtime::run_node(at, 17, qkv);
    expect_same_bits(got[0], cast_bf16(ref[0]));
    expect_same_bits(got[1], ref[1]);
  }
}

// BiasGrad's second output (the mixed_precision pass fuses the Cast of a linear layer's output
// gradient there): exactly Cast(dY, bf16), with the bias gradient unchanged — on one thread and
// on two (column blocks split over the threads), and with a row width that is not a multiple of
// the 64-column blocks.
TEST(Bf16Gemm, BiasGradBf16CopyIsCastOfItsInput) {
  const int threads = runtime::num_threads();
  for (int t : {1, 2}) {
    runtime::set_num_threads(t);
    for (int64_t n : {100, 384}) {
      Tensor dy = Tensor::from_vector(DType::Float32, {3, 50, n}, randoms(150 * n, 40 + n, -4, 4));
      ir::Node bg = node("BiasGrad", 1, 1);
      auto ref = runtime::run_node(bg, 17, {dy});
      bg.outputs.push_back("out1");
      auto got = runtime::run_node(bg, 17, {dy});
      ASSERT_EQ(got.size(), 2u);
      expect_same_bits(got[0], ref[0]);
      expect_same_bits(got[1], cast_bf16(dy));
    }
  }
  runtime::set_num_threads(threads);
  // only a float32 dY has the copy (a bf16 one already is bf16)
  ir::Node bg = node("BiasGrad", 1, 2);
  EXPECT_THROW(runtime::run_node(bg, 17, {bf16_tensor({4, 8}, 41)}), Error);
}

TEST(Bf16Gemm, Bf16InputsAreTheFloat32OpOnWidenedValues) {
  {  // GeluGrad(dy float32, x bf16) -> dx float32
    ir::Node gg = node("GeluGrad", 2, 1);
    Tensor dy = Tensor::from_vector(DType::Float32, {3, 300}, randoms(900, 30));
    Tensor x = bf16_tensor({3, 300}, 31);
    Tensor got = runtime::run_node(gg, 17, {dy, x})[0];
    expect_same_bits(got, runtime::run_node(gg, 17, {dy, widened(x)})[0]);
  }
  {  // Attention and AttentionGrad with bf16 Q/K/V
    ir::Node at = node("Attention", 3, 2);
    at.attrs["num_heads"] = ir::Attribute::of_int(2);
    std::vector<Tensor> q16, q32;
    for (uint32_t k = 0; k < 3; k++) {
      q16.push_back(bf16_tensor({2, 40, 16}, 40 + k));
      q32.push_back(widened(q16.back()));
    }
    auto got = runtime::run_node(at, 17, q16), want = runtime::run_node(at, 17, q32);
    expect_same_bits(got[0], want[0]);
    ir::Node ag = node("AttentionGrad", 5, 3);
    ag.attrs["num_heads"] = ir::Attribute::of_int(2);
    ag.inputs[4] = "";  // no mask
    ag.inputs.push_back("lse");
    Tensor dO = Tensor::from_vector(DType::Float32, {2, 40, 16}, randoms(2 * 40 * 16, 50));
    auto g16 = runtime::run_node(ag, 17, {dO, q16[0], q16[1], q16[2], Tensor(), want[1]});
    auto g32 = runtime::run_node(ag, 17, {dO, q32[0], q32[1], q32[2], Tensor(), want[1]});
    for (int i = 0; i < 3; i++) expect_same_bits(g16[i], g32[i]);
  }
}

// Conv, ConvGradInput, ConvGradWeight and ConvTranspose under bf16_gemm (mixed precision, as
// autocast runs conv): the float32 ops on the bf16-rounded operands (float32 accumulation, so
// within float32 summation error of them: on the widened path the same bits), and measurably off
// the unrounded float32 ops. A ViT patch embedding (kernel = stride 4), a padded 3x3 conv with
// groups, and a 3x3 conv of 16 channels over 1,024 output positions, which every pass runs on
// oneDNN's blocked layouts (conv_onednn.h: its bf16 convolutions where the CPU has AVX512_BF16).
TEST(Bf16Gemm, ConvAndItsGradientsTakeBf16RoundedOperands) {
  struct Case {
    Shape x, w;
    std::vector<int64_t> strides, pads;
    int64_t group;
  };
  const Case cases[] = {{{3, 3, 16, 16}, {8, 3, 4, 4}, {4, 4}, {0, 0, 0, 0}, 1},
                        {{2, 4, 9, 7}, {6, 2, 3, 3}, {1, 1}, {1, 1, 1, 1}, 2},
                        {{4, 16, 16, 16}, {16, 16, 3, 3}, {1, 1}, {1, 1, 1, 1}, 1}};
  runtime::RunOptions mixed;
  mixed.bf16_gemm = true;
  auto rel = [](const Tensor& got, const Tensor& want) {
    double big = 0, worst = 0;
    for (int64_t i = 0; i < want.numel(); i++)
      big = std::max(big, (double)std::fabs(want.data<float>()[i]));
    for (int64_t i = 0; i < want.numel(); i++)
      worst = std::max(worst, (double)std::fabs(got.data<float>()[i] - want.data<float>()[i]));
    return worst / std::max(big, 1e-30);
  };
  uint32_t seed = 60;
  for (const Case& c : cases) {
    auto attrs = [&](ir::Node& n) {
      n.attrs["strides"] = ir::Attribute::of_ints(c.strides);
      n.attrs["pads"] = ir::Attribute::of_ints(c.pads);
      n.attrs["group"] = ir::Attribute::of_int(c.group);
    };
    ir::Node conv = node("Conv", 3, 1);
    conv.domain = "";
    attrs(conv);
    Tensor x = Tensor::from_vector(DType::Float32, c.x, randoms(shape_numel(c.x), seed++));
    Tensor w = Tensor::from_vector(DType::Float32, c.w, randoms(shape_numel(c.w), seed++));
    Tensor b = Tensor::from_vector(DType::Float32, {c.w[0]}, randoms(c.w[0], seed++));
    Tensor y = runtime::run_node(conv, 17, {x, w, b}, mixed)[0];
    Tensor want = runtime::run_node(conv, 17, {rounded(x), rounded(w), b})[0];
    EXPECT_LE(rel(y, want), 1e-5) << "Conv";
    EXPECT_GT(rel(runtime::run_node(conv, 17, {x, w, b})[0], want), 1e-4) << "Conv";

    Tensor dy = Tensor::from_vector(DType::Float32, y.shape(), randoms(y.numel(), seed++));
    ir::Node gi = node("ConvGradInput", 2, 1);
    attrs(gi);
    gi.attrs["input_shape"] = ir::Attribute::of_ints(c.x);
    Tensor dx = runtime::run_node(gi, 17, {dy, w}, mixed)[0];
    Tensor want_dx = runtime::run_node(gi, 17, {rounded(dy), rounded(w)})[0];
    EXPECT_LE(rel(dx, want_dx), 1e-5) << "ConvGradInput";
    EXPECT_GT(rel(runtime::run_node(gi, 17, {dy, w})[0], want_dx), 1e-4) << "ConvGradInput";

    ir::Node gw = node("ConvGradWeight", 2, 1);
    attrs(gw);
    gw.attrs["kernel_shape"] = ir::Attribute::of_ints({c.w[2], c.w[3]});
    Tensor dw = runtime::run_node(gw, 17, {dy, x}, mixed)[0];
    Tensor want_dw = runtime::run_node(gw, 17, {rounded(dy), rounded(x)})[0];
    EXPECT_LE(rel(dw, want_dw), 1e-5) << "ConvGradWeight";
    EXPECT_GT(rel(runtime::run_node(gw, 17, {dy, x})[0], want_dw), 1e-4) << "ConvGradWeight";

    // ConvTranspose (a UNet's upsampling) back from y's shape with the same W (C_in = M).
    ir::Node ct = node("ConvTranspose", 3, 1);
    ct.domain = "";
    attrs(ct);
    const int64_t m_out = c.w[1] * c.group;
    Tensor bt = Tensor::from_vector(DType::Float32, {m_out}, randoms(m_out, seed++));
    Tensor yt = runtime::run_node(ct, 17, {y, w, bt}, mixed)[0];
    Tensor want_t = runtime::run_node(ct, 17, {rounded(y), rounded(w), bt})[0];
    EXPECT_LE(rel(yt, want_t), 1e-5) << "ConvTranspose";
    EXPECT_GT(rel(runtime::run_node(ct, 17, {y, w, bt})[0], want_t), 1e-4) << "ConvTranspose";
  }
}

// TrainingArguments.fp16 (KernelContext::fp16_gemm, emulated): every GEMM-class kernel is the
// float32 op on its operands rounded to float16 — as float16 rounds (nearest even, beyond 65504
// inf, float16's subnormals), checked against dtype.h's scalar conversion — bit for bit where the
// same sgemm runs (MatMulT, MatMulGradB, Conv's widened path, LinearCrossEntropy's forward), and
// off the unrounded float32 op.
TEST(Fp16Gemm, KernelsTakeFloat16RoundedOperands) {
  auto half = [](const Tensor& t) {
    Tensor r = t.clone();
    for (int64_t i = 0; i < r.numel(); i++)
      r.data<float>()[i] = half_to_float(float_to_half(r.data<float>()[i]));
    return r;
  };
  {  // the conversion itself, specials included
    std::vector<float> v = randoms(3000, 70, -3, 3);
    const float special[] = {65504.f, 65520.f, 1e6f, -1e6f, 6e-5f, 3e-8f, 1e-9f, -0.0f, 1.0f / 3};
    for (size_t i = 0; i < sizeof(special) / sizeof(float); i++) v[i] = special[i];
    Tensor x = Tensor::from_vector(DType::Float32, {3000}, v), y(DType::Float32, {3000});
    kernels::round_to_fp16(x.data<float>(), y.data<float>(), 3000);
    expect_same_bits(y, half(x));
    EXPECT_TRUE(std::isinf(y.data<float>()[1]) && std::isinf(y.data<float>()[2]));
    EXPECT_EQ(y.data<float>()[0], 65504.f);
  }
  runtime::RunOptions f16;
  f16.fp16_gemm = true;
  Tensor a = Tensor::from_vector(DType::Float32, {2, 9, 40}, randoms(720, 71));
  Tensor w = Tensor::from_vector(DType::Float32, {24, 40}, randoms(960, 72));
  Tensor bias = Tensor::from_vector(DType::Float32, {24}, randoms(24, 73));
  ir::Node mm = node("MatMulT", 3, 1);
  mm.attrs["transB"] = ir::Attribute::of_int(1);
  Tensor y = runtime::run_node(mm, 17, {a, w, bias}, f16)[0];
  expect_same_bits(y, runtime::run_node(mm, 17, {half(a), half(w), bias})[0]);
  EXPECT_NE(std::memcmp(y.raw(), runtime::run_node(mm, 17, {a, w, bias})[0].raw(), y.nbytes()), 0);
  Tensor dy = Tensor::from_vector(DType::Float32, {2, 9, 24}, randoms(432, 74));
  ir::Node gb = node("MatMulGradB", 2, 1);
  Tensor dw = runtime::run_node(gb, 17, {a, dy}, f16)[0];
  expect_same_bits(dw, runtime::run_node(gb, 17, {half(a), half(dy)})[0]);

  ir::Node conv = node("Conv", 3, 1);
  conv.domain = "";
  conv.attrs["strides"] = ir::Attribute::of_ints({4, 4});
  Tensor x = Tensor::from_vector(DType::Float32, {2, 3, 8, 8}, randoms(384, 75));
  Tensor cw = Tensor::from_vector(DType::Float32, {5, 3, 4, 4}, randoms(240, 76));
  Tensor cb = Tensor::from_vector(DType::Float32, {5}, randoms(5, 77));
  expect_same_bits(runtime::run_node(conv, 17, {x, cw, cb}, f16)[0],
                   runtime::run_node(conv, 17, {half(x), half(cw), cb})[0]);

  // LinearCrossEntropy: the loss from float16-rounded H and W
  ir::Node lce = node("LinearCrossEntropy", 3, 1);
  lce.attrs["transB"] = ir::Attribute::of_int(1);
  Tensor h = Tensor::from_vector(DType::Float32, {10, 40}, randoms(400, 78));
  Tensor lw = Tensor::from_vector(DType::Float32, {30, 40}, randoms(1200, 79));
  std::vector<int64_t> lab(10);
  for (int i = 0; i < 10; i++) lab[i] = (i * 7) % 30;
  Tensor labels = Tensor::from_vector<int64_t>(DType::Int64, {10}, lab);
  expect_same_bits(runtime::run_node(lce, 17, {h, lw, labels}, f16)[0],
                   runtime::run_node(lce, 17, {half(h), half(lw), labels})[0]);

  // Attention: the tiles' operands rounded (within float32 summation error of the op on rounded
  // Q/K/V: P is rounded per tile as well), and measurably off the float32 op
  ir::Node at = node("Attention", 3, 2);
  at.attrs["num_heads"] = ir::Attribute::of_int(2);
  std::vector<Tensor> qkv, qkv16;
  for (uint32_t k = 0; k < 3; k++) {
    qkv.push_back(Tensor::from_vector(DType::Float32, {2, 20, 16}, randoms(640, 80 + k, -2, 2)));
    qkv16.push_back(half(qkv.back()));
  }
  Tensor o = runtime::run_node(at, 17, qkv, f16)[0];
  Tensor o_rounded = runtime::run_node(at, 17, qkv16)[0];
  Tensor o_f32 = runtime::run_node(at, 17, qkv)[0];
  double off_rounded = 0, off_f32 = 0;
  for (int64_t i = 0; i < o.numel(); i++) {
    off_rounded =
        std::max(off_rounded, (double)std::fabs(o.data<float>()[i] - o_rounded.data<float>()[i]));
    off_f32 = std::max(off_f32, (double)std::fabs(o.data<float>()[i] - o_f32.data<float>()[i]));
  }
  EXPECT_LE(off_rounded, 2e-3);  // P's rounding: 2^-11 relative
  EXPECT_GT(off_f32, 1e-5);
}

// The standard MatMul and Gemm (an unfused attention product, a forward run as exported) under
// mixed precision: the float32 op on operands rounded to bf16 / float16, bit for bit (the same
// sgemm), C (Gemm's bias) float32; and off the unrounded op. Not an outer product.
TEST(Bf16Gemm, StandardMatMulAndGemmTakeRoundedOperands) {
  for (kernels::LowPrecision lp : {kernels::LowPrecision::Bf16, kernels::LowPrecision::Fp16}) {
    SCOPED_TRACE(lp == kernels::LowPrecision::Bf16 ? "bf16" : "fp16");
    runtime::RunOptions ro;
    ro.bf16_gemm = lp == kernels::LowPrecision::Bf16;
    ro.fp16_gemm = lp == kernels::LowPrecision::Fp16;
    auto round = [&](const Tensor& t) {
      Tensor r = t.clone();
      kernels::round_to(lp, r.data<float>(), r.data<float>(), r.numel());
      return r;
    };
    Tensor a = Tensor::from_vector(DType::Float32, {2, 7, 30}, randoms(420, 90));
    Tensor b = Tensor::from_vector(DType::Float32, {2, 30, 11}, randoms(660, 91));
    ir::Node mm = node("MatMul", 2, 1);
    mm.domain = "";
    Tensor y = runtime::run_node(mm, 17, {a, b}, ro)[0];
    expect_same_bits(y, runtime::run_node(mm, 17, {round(a), round(b)})[0]);
    EXPECT_NE(std::memcmp(y.raw(), runtime::run_node(mm, 17, {a, b})[0].raw(), y.nbytes()), 0);
    ir::Node gm = node("Gemm", 3, 1);
    gm.domain = "";
    gm.attrs["transB"] = ir::Attribute::of_int(1);
    Tensor ga = Tensor::from_vector(DType::Float32, {9, 30}, randoms(270, 92));
    Tensor gb = Tensor::from_vector(DType::Float32, {12, 30}, randoms(360, 93));
    Tensor gc = Tensor::from_vector(DType::Float32, {12}, randoms(12, 94));
    Tensor gy = runtime::run_node(gm, 17, {ga, gb, gc}, ro)[0];
    expect_same_bits(gy, runtime::run_node(gm, 17, {round(ga), round(gb), gc})[0]);
    EXPECT_NE(std::memcmp(gy.raw(), runtime::run_node(gm, 17, {ga, gb, gc})[0].raw(), gy.nbytes()),
              0);
    // An outer product (K = 1) stays float32: an exported rotary embedding's frequencies x
    // positions (positions above 256 are not bf16 values)
    std::vector<float> pos(40), freq(8);
    for (int i = 0; i < 40; i++) pos[i] = 250.0f + (float)i;
    for (int i = 0; i < 8; i++) freq[i] = std::pow(10000.0f, -(float)i / 8);
    Tensor fr = Tensor::from_vector(DType::Float32, {1, 8, 1}, freq);
    Tensor ps = Tensor::from_vector(DType::Float32, {1, 1, 40}, pos);
    expect_same_bits(runtime::run_node(mm, 17, {fr, ps}, ro)[0],
                     runtime::run_node(mm, 17, {fr, ps})[0]);
  }
}

TEST(Bf16Gemm, OutputDtypeOutsideItsFormsIsAClearError) {
  auto message = [](const ir::Node& n, const std::vector<Tensor>& in) {
    try {
      runtime::run_node(n, 17, in);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  Tensor x = Tensor::from_vector(DType::Float32, {2, 8}, randoms(16, 60));
  ir::Node g = node("Gelu", 1, 1);
  g.attrs["output_dtype"] = ir::Attribute::of_int((int64_t)DType::Float16);
  EXPECT_NE(message(g, {x}).find("output_dtype 10 is supported only as BFLOAT16"),
            std::string::npos)
      << message(g, {x});
  ir::Node gb = node("MatMulGradB", 2, 1);
  gb.attrs["output_dtype"] = ir::Attribute::of_int((int64_t)DType::BFloat16);
  EXPECT_NE(message(gb, {x, x}).find("MatMulGradB writes a float32 gradient"), std::string::npos)
      << message(gb, {x, x});
}

}  // namespace
}  // namespace onyx
