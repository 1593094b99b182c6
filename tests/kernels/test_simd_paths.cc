// test_simd_paths.cc — the SIMD kernels of src/kernels/cpu/simd/ on every path this CPU can run
// (AVX-512, AVX2, portable; on aarch64 SVE2/SVE at their widths, NEON, portable;
// kernels/cpu/simd/dispatch.h): each entry point against a float64
// reference, and the paths against each other — bit-identical where the arithmetic has one
// answer (dropout draws, transposes, float16 conversions, the ReLU gradient), within a
// few ulp where a path may fuse a multiply-add the portable one rounds twice. Lengths cover the
// vector tails of every width (1..70), and inputs include ±inf, NaN, huge and tiny values.
// (Run the whole op table per path with ONYX_CPU=avx2 / portable: scripts/test.sh does.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/philox.h"
#include "kernels/cpu/simd/dispatch.h"
#include "kernels/cpu/simd/simd.h"
#include "onyx/dtype.h"
#include "onyx/error.h"

namespace onyx {
namespace {

std::vector<float> inputs(int64_t n, uint32_t seed, float lo, float hi, bool specials) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v((size_t)n);
  for (auto& x : v) x = d(g);
  if (specials && n >= 8) {
    v[1] = INFINITY;
    v[2] = -INFINITY;
    v[3] = NAN;
    v[4] = 0.0f;
    v[5] = -0.0f;
    v[6] = 1e-30f;
  }
  return v;
}

// Restores automatic selection after each test.
class SimdPaths : public ::testing::Test {
 protected:
  // Restores the path the process started on (ONYX_CPU may have forced one).
  void SetUp() override { start_ = simd::chosen_path(); }
  void TearDown() override { simd::select_path(start_); }
  std::string start_;
  // Runs f on every supported path; returns one result per path.
  template <class R>
  std::vector<R> per_path(const std::function<R()>& f) {
    std::vector<R> out;
    for (const std::string& p : simd::supported_paths()) {
      simd::select_path(p);
      EXPECT_EQ(simd::chosen_path(), p);
      out.push_back(f());
    }
    return out;
  }
};

bool same_bits(float a, float b) {
  if (std::isnan(a) && std::isnan(b)) return true;
  uint32_t x, y;
  std::memcpy(&x, &a, 4);
  std::memcpy(&y, &b, 4);
  return x == y;
}

// |a - b| within `ulps` units of the larger magnitude (NaN matches NaN, inf matches itself).
bool near_ulps(float a, float b, float ulps, float abs_floor = 1e-37f) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  if (std::isinf(a) || std::isinf(b)) return a == b;
  float tol = ulps * std::nextafter(std::max(std::fabs(a), std::fabs(b)), INFINITY) * 1.2e-7f;
  return std::fabs(a - b) <= std::max(tol, abs_floor);
}

TEST_F(SimdPaths, EveryPathIsCompiledAndTheBestIsChosen) {
  std::vector<std::string> compiled = simd::compiled_paths(), cpu = simd::supported_paths();
  ASSERT_FALSE(cpu.empty());
  EXPECT_EQ(compiled.back(), "portable");
  EXPECT_EQ(cpu.back(), "portable");
  simd::select_path("auto");
  EXPECT_EQ(simd::chosen_path(), cpu.front());
  // scripts/test_aarch64.sh runs the tests on emulated CPUs picked for one path each
  if (const char* want = std::getenv("ONYX_EXPECT_CPU_PATH")) EXPECT_EQ(cpu.front(), want);
  EXPECT_THROW(simd::select_path("sse9"), Error);
  EXPECT_EQ(simd::chosen_path(), cpu.front());  // a refused selection changes nothing
  EXPECT_NE(simd::describe().find("cpu path " + cpu.front()), std::string::npos);
}

// ONYX_CPU=avx2 / portable (scripts/test.sh runs this binary so) caps oneDNN's dispatch as well
// and turns the native bf16 matmul off: the forced run is what a CPU of that kind runs.
TEST_F(SimdPaths, ForcedPathCapsOneDnnAndTheNativeBf16Matmul) {
  const char* env = std::getenv("ONYX_CPU");
  const std::string forced = env ? env : "";
  const std::string isa = simd::onednn_isa();
  if (forced == "avx2" || forced == "portable") {
    EXPECT_EQ(isa.find("avx512"), std::string::npos) << "ONYX_CPU=" << forced << ": " << isa;
    if (forced == "portable") {
      EXPECT_EQ(isa, "sse41");
    }
    EXPECT_FALSE(kernels::bf16_gemm_native());
    EXPECT_FALSE(simd::native_bf16_conversions());
  } else {
    EXPECT_EQ(kernels::bf16_gemm_native(),
              kernels::cpu_has_avx512_bf16() && simd::chosen_path() == "avx512");
  }
  EXPECT_NE(simd::describe().find("GEMMs oneDNN " + isa), std::string::npos) << simd::describe();
}

struct MapCase {
  const char* name;
  void (*fn)(const float*, float*, int64_t);
  double (*ref)(double);
  float lo, hi;
  float ulps;     // against the float64 reference (relative)
  float abs_err;  // or absolute
};

double gelu_erf_ref(double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }
double gelu_tanh_ref(double x) {
  return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}

TEST_F(SimdPaths, ArrayMathMatchesFloat64AndAgreesAcrossPaths) {
  const MapCase cases[] = {
      {"exp", simd::exp, [](double x) { return std::exp(x); }, -100, 88, 2, 0},
      {"tanh", simd::tanh, [](double x) { return std::tanh(x); }, -6, 6, 4, 1e-7f},
      {"sigmoid", simd::sigmoid, [](double x) { return 1 / (1 + std::exp(-x)); }, -30, 30, 4, 0},
      {"silu", simd::silu, [](double x) { return x / (1 + std::exp(-x)); }, -30, 30, 4, 1e-30f},
      {"sqrt", simd::sqrt, [](double x) { return std::sqrt(x); }, 0, 1e6, 1, 0},
      {"erf", simd::erf, [](double x) { return std::erf(x); }, -4, 4, 4, 1e-7f},
      {"gelu_erf", simd::gelu_erf, gelu_erf_ref, -6, 6, 8, 1e-7f},
      {"gelu_tanh", simd::gelu_tanh, gelu_tanh_ref, -6, 6, 8, 1e-7f},
  };
  for (const MapCase& c : cases)
    for (int64_t n : {1, 7, 8, 15, 16, 17, 33, 70, 1100}) {
      SCOPED_TRACE(std::string(c.name) + " n=" + std::to_string(n));
      const std::vector<float> x = inputs(n, 7 + (uint32_t)n, c.lo, c.hi, false);
      auto runs = per_path<std::vector<float>>([&] {
        std::vector<float> y(x.size());
        c.fn(x.data(), y.data(), n);
        return y;
      });
      for (size_t p = 0; p < runs.size(); p++)
        for (int64_t i = 0; i < n; i++) {
          const float want = (float)c.ref((double)x[i]);
          ASSERT_TRUE(near_ulps(runs[p][i], want, c.ulps, c.abs_err))
              << simd::supported_paths()[p] << " x=" << x[i] << " got " << runs[p][i] << " want "
              << want;
          ASSERT_TRUE(near_ulps(runs[p][i], runs[0][i], 4, c.abs_err))
              << simd::supported_paths()[p] << " vs " << simd::supported_paths()[0]
              << " x=" << x[i];
        }
    }
}

TEST_F(SimdPaths, SpecialValuesPropagateOnEveryPath) {
  const std::vector<float> x = {NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 200.0f, -200.0f, 1e-30f, 3};
  const int64_t n = (int64_t)x.size();
  per_path<int>([&] {
    std::vector<float> y(x.size());
    simd::exp(x.data(), y.data(), n);
    EXPECT_TRUE(std::isnan(y[0]));
    EXPECT_EQ(y[1], INFINITY);
    EXPECT_EQ(y[2], 0.0f);
    EXPECT_EQ(y[3], 1.0f);
    EXPECT_EQ(y[5], INFINITY);
    EXPECT_LE(y[6], 1.5e-45f);  // at most the smallest subnormal
    simd::tanh(x.data(), y.data(), n);
    EXPECT_TRUE(std::isnan(y[0]));
    EXPECT_EQ(y[1], 1.0f);
    EXPECT_EQ(y[2], -1.0f);
    EXPECT_TRUE(std::signbit(y[4]));
    simd::erf(x.data(), y.data(), n);
    EXPECT_TRUE(std::isnan(y[0]));
    EXPECT_EQ(y[1], 1.0f);
    EXPECT_EQ(y[2], -1.0f);
    // row_sum_exp: exp(x - m) with m the max; -inf contributes 0, NaN poisons the sum.
    const float row[5] = {0.0f, -INFINITY, -1.0f, -2.0f, -3.0f};
    EXPECT_NEAR(simd::row_sum_exp(row, 5, 0.0f, nullptr),
                1 + std::exp(-1.0) + std::exp(-2.0) + std::exp(-3.0), 1e-6);
    EXPECT_TRUE(std::isnan(simd::row_sum_exp(x.data(), 1, 0.0f, nullptr)));
    return 0;
  });
}

TEST_F(SimdPaths, RowReductionsMatchFloat64) {
  for (int64_t n : {1, 5, 8, 13, 16, 31, 32, 33, 64, 65, 767, 768, 3000}) {
    SCOPED_TRACE("n=" + std::to_string(n));
    const std::vector<float> x = inputs(n, 11 + (uint32_t)n, -3, 2, false);
    double s = 0, mx = -INFINITY, mn = INFINITY, sse = 0, se = 0;
    for (float v : x) {
      s += v;
      mx = std::max(mx, (double)v);
      mn = std::min(mn, (double)v);
    }
    const float c = (float)(s / n);
    for (float v : x) {
      sse += ((double)v - c) * ((double)v - c);
      se += std::exp((double)v - mx);
    }
    per_path<int>([&] {
      const double tol = 1e-6 * n;
      EXPECT_NEAR(simd::row_sum(x.data(), n), s, tol);
      EXPECT_NEAR(simd::row_sum_sq_dev(x.data(), n, c), sse, tol * 4);
      EXPECT_EQ(simd::row_max(x.data(), n), (float)mx);
      EXPECT_EQ(simd::row_min(x.data(), n), (float)mn);
      std::vector<float> e(x.size());
      EXPECT_NEAR(simd::row_sum_exp(x.data(), n, (float)mx, e.data()), se, 1e-6 * se);
      for (int64_t i = 0; i < n; i++)
        EXPECT_TRUE(near_ulps(e[i], (float)std::exp((double)(x[i] - (float)mx)), 2)) << i;
      std::vector<float> y = x;
      simd::row_scale(y.data(), n, 0.5f);
      for (int64_t i = 0; i < n; i++) EXPECT_EQ(y[i], x[i] * 0.5f);
      return 0;
    });
  }
}

TEST_F(SimdPaths, ActivationGradientsAgreeAcrossPaths) {
  using Grad = void (*)(const float*, const float*, float*, int64_t);
  struct G {
    const char* name;
    Grad fn;
    bool exact;  // one rounding per element on every path (the others may fuse a multiply-add)
  } grads[] = {{"gelu_erf", simd::gelu_erf_grad, false}, {"gelu_tanh", simd::gelu_tanh_grad, false},
               {"silu", simd::silu_grad, false},         {"erf", simd::erf_grad, false},
               {"relu", simd::relu_grad, true},          {"sigmoid", simd::sigmoid_grad, false},
               {"tanh", simd::tanh_grad, false}};
  for (const G& g : grads)
    for (int64_t n : {int64_t{1}, int64_t{9}, int64_t{17}, int64_t{100}, simd::kGradBlock}) {
      SCOPED_TRACE(std::string(g.name) + " n=" + std::to_string(n));
      const std::vector<float> dy = inputs(n, 3, -1, 1, false), x = inputs(n, 4, -5, 5, false);
      auto runs = per_path<std::vector<float>>([&] {
        std::vector<float> dx(x.size());
        g.fn(dy.data(), x.data(), dx.data(), n);
        return dx;
      });
      for (size_t p = 1; p < runs.size(); p++)
        for (int64_t i = 0; i < n; i++)
          ASSERT_TRUE(g.exact ? same_bits(runs[p][i], runs[0][i])
                              : near_ulps(runs[p][i], runs[0][i], 8, 1e-7f))
              << simd::supported_paths()[p] << " i=" << i << " " << runs[p][i] << " vs "
              << runs[0][i];
    }
}

TEST_F(SimdPaths, DropoutDrawsPhiloxBitForBitOnEveryPath) {
  const uint32_t k0 = 0x12345678u, k1 = 0x9abcdef0u;
  per_path<int>([&] {
    for (uint64_t g : {0ull, 1ull, 77ull, (1ull << 32) + 5}) {
      uint32_t u[32];
      simd::philox_group_words(g, k0, k1, u);
      for (int l = 0; l < 8; l++) {
        const auto c = kernels::Philox4x32::generate(
            {(uint32_t)(g * 8 + l), (uint32_t)((g * 8 + l) >> 32), 0, 0}, {k0, k1});
        for (int w = 0; w < 4; w++) EXPECT_EQ(u[w * 8 + l], c[w]) << "group " << g;
      }
    }
    return 0;
  });
  // A range starting inside a group, with a residual and a mask, against the words.
  const int64_t e0 = 45, n = 203;
  const uint32_t t24 = (uint32_t)std::ceil(0.3 * 16777216.0);
  const std::vector<float> x = inputs(n, 5, -2, 2, false), res = inputs(n, 6, -2, 2, false);
  auto runs = per_path<std::vector<float>>([&] {
    std::vector<float> out((size_t)n);
    std::vector<char> mask((size_t)n);
    simd::dropout_range(k0, k1, t24, 1 / 0.7f, e0, n, x.data(), res.data(), out.data(),
                        (bool*)mask.data());
    for (int64_t i = 0; i < n; i++) {
      const int64_t e = e0 + i;
      uint32_t u[32];
      simd::philox_group_words((uint64_t)(e / 32), k0, k1, u);
      const bool keep = (u[e % 32] >> 8) >= t24;
      EXPECT_EQ((bool)mask[i], keep) << i;
      EXPECT_TRUE(same_bits(out[i], (keep ? x[i] * (1 / 0.7f) : 0.0f) + res[i])) << i;
    }
    return out;
  });
  for (size_t p = 1; p < runs.size(); p++)
    for (int64_t i = 0; i < n; i++) ASSERT_TRUE(same_bits(runs[p][i], runs[0][i]));
}

TEST_F(SimdPaths, TransposeAndFloat16ConversionsAreExactOnEveryPath) {
  const int64_t P = 21, Q = 8, ls = 29, ld = 13;  // 21 = two full 8-row blocks and a partial one
  std::vector<uint32_t> s((size_t)(ls * Q));
  for (size_t i = 0; i < s.size(); i++)
    s[i] = 0x7fc00000u + (uint32_t)i * 2654435761u;  // NaN bits too
  const std::vector<float> f = inputs(70, 9, -70000, 70000, true);
  per_path<int>([&] {
    for (int64_t qn : {8, 3}) {
      std::vector<uint32_t> d((size_t)(ld * P), 0);
      simd::transpose_strip32(d.data(), ld, s.data(), ls, P, qn);
      for (int64_t p = 0; p < P; p++)
        for (int64_t q = 0; q < qn; q++) EXPECT_EQ(d[p * ld + q], s[p + q * ls]) << p << "," << q;
    }
    std::vector<uint16_t> h(f.size());
    std::vector<float> back(f.size());
    simd::f32_to_f16(f.data(), h.data(), (int64_t)f.size());
    simd::f16_to_f32(h.data(), back.data(), (int64_t)f.size());
    for (size_t i = 0; i < f.size(); i++) {
      if (std::isnan(f[i])) {
        EXPECT_TRUE(std::isnan(back[i]));
        continue;
      }
      EXPECT_EQ(h[i], float_to_half(f[i])) << f[i];
      EXPECT_TRUE(same_bits(back[i], half_to_float(h[i]))) << f[i];
    }
    return 0;
  });
}

// float32 -> bf16 (Cast's rule, the scalar float_to_bf16) on every path: ties to even both ways,
// values that round up into the next binade and to infinity, NaNs (made quiet, sign and payload
// kept), infinities, signed zeros and denormals (kept, not flushed), over a length with a tail.
TEST_F(SimdPaths, Bfloat16ConversionIsTheScalarRuleOnEveryPath) {
  std::vector<uint32_t> bits = {0x3f808000u, 0x3f818000u, 0x3f80ffffu, 0x3f7fffffu, 0x7f7fffffu,
                                0xff7fffffu, 0x7f800000u, 0xff800000u, 0x7f800001u, 0xffc00001u,
                                0x7fbfffffu, 0x00000000u, 0x80000000u, 0x00000001u, 0x807fffffu,
                                0x00408000u, 0x3f80c000u, 0xbf808000u};
  for (uint32_t k = 0; k < 300; k++) bits.push_back(k * 2654435761u);  // every exponent, NaNs too
  std::vector<float> f(bits.size());
  std::memcpy(f.data(), bits.data(), bits.size() * 4);
  per_path<int>([&] {
    std::vector<uint16_t> h(f.size());
    simd::f32_to_bf16_bits(f.data(), h.data(), (int64_t)f.size());
    for (size_t i = 0; i < f.size(); i++)
      EXPECT_EQ(h[i], float_to_bf16(f[i])) << std::hex << bits[i];
    return 0;
  });
}

}  // namespace
}  // namespace onyx
