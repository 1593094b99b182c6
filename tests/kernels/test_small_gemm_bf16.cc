// test_small_gemm_bf16.cc — kernels/cpu/small_gemm_bf16.h, the attention tiles' bf16 products:
// every transpose combination, odd K, partial row and column blocks, more than one 64-column
// block, strided operands and C, alpha and beta — on small integers, whose products and sums are
// exact in float32 in any order, so the result must equal a float64 loop bit for bit. Both paths:
// vdpbf16ps and, where the CPU has AMX, the tile unit.
#include <gtest/gtest.h>

#include <random>

#include "kernels/cpu/small_gemm_bf16.h"
#include "onyx/dtype.h"

namespace onyx {
namespace {

std::vector<uint16_t> small_int_bits(int64_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<uint16_t> v((size_t)n);
  for (auto& x : v) x = float_to_bf16((float)((int)(g() % 9) - 4));
  return v;
}

// Runs the test body with small_gemm_bf16 forced onto the vdpbf16ps path, then the AMX one.
class SmallGemmBf16 : public testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    if (!kernels::small_gemm_bf16_supported())
      GTEST_SKIP() << "needs AVX512_BF16 (this CPU has none; attention then uses oneDNN's or the "
                      "widened float32 path)";
    if (GetParam() && !kernels::small_gemm_bf16_amx())
      GTEST_SKIP() << "needs AMX-BF16 (this CPU has none: small_gemm_bf16 runs on vdpbf16ps)";
    kernels::force_small_gemm_bf16_amx(GetParam() ? 1 : 0);
  }
  void TearDown() override { kernels::force_small_gemm_bf16_amx(-1); }
};

TEST_P(SmallGemmBf16, EqualsAFloat64LoopOnExactValues) {
  struct Case {
    int64_t M, N, K;
  };
  for (Case c : {Case{1, 1, 1}, Case{4, 16, 2}, Case{50, 50, 64}, Case{7, 33, 5}, Case{64, 130, 64},
                 Case{3, 64, 17}, Case{128, 64, 128}, Case{33, 17, 70}, Case{16, 32, 32}})
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (auto [alpha, beta] : {std::pair<float, float>{1, 0}, {1, 1}, {0.5f, 1}, {2, -0.5f}}) {
          SCOPED_TRACE(testing::Message()
                       << c.M << "x" << c.N << "x" << c.K << " ta " << ta << " tb " << tb
                       << " alpha " << alpha << " beta " << beta);
          // stored shapes with padded leading dimensions (+3): A (M,K) or (K,M), B (K,N) or (N,K)
          const int64_t lda = (ta ? c.M : c.K) + 3, ldb = (tb ? c.K : c.N) + 3, ldc = c.N + 3;
          auto A = small_int_bits((ta ? c.K : c.M) * lda, 1);
          auto B = small_int_bits((tb ? c.N : c.K) * ldb, 2);
          std::vector<float> C((size_t)(c.M * ldc));
          for (size_t i = 0; i < C.size(); i++) C[i] = (float)((int)(i % 7) - 3);
          std::vector<float> want = C;
          for (int64_t i = 0; i < c.M; i++)
            for (int64_t j = 0; j < c.N; j++) {
              double s = 0;
              for (int64_t k = 0; k < c.K; k++)
                s += (double)bf16_to_float(ta ? A[k * lda + i] : A[i * lda + k]) *
                     (double)bf16_to_float(tb ? B[j * ldb + k] : B[k * ldb + j]);
              want[i * ldc + j] = (float)(alpha * s + (beta == 0 ? 0.0 : beta * C[i * ldc + j]));
            }
          kernels::small_gemm_bf16(ta, tb, c.M, c.N, c.K, alpha, A.data(), lda, B.data(), ldb, beta,
                                   C.data(), ldc);
          ASSERT_EQ(C, want);  // (the padding columns of C are untouched too)
        }
}

INSTANTIATE_TEST_SUITE_P(Paths, SmallGemmBf16, testing::Values(false, true),
                         [](const testing::TestParamInfo<bool>& p) {
                           return p.param ? "amx" : "vdpbf16ps";
                         });

}  // namespace
}  // namespace onyx
