// test_simd_nn.cc — the row kernels of src/kernels/cpu/simd/nn.h (softmax, attention and loss
// rows, LayerNorm / RMSNorm rows, SwiGLU, rotary) on every path this CPU can run (AVX-512, AVX2,
// portable): each against a float64 reference, and the paths against each other. Lengths cover
// the vector tails of every width. Rotary is bit-identical on every path (no FMA contraction: each
// product and sum rounded once, as the unfused graph rounds them).
// (The op table runs the kernels using these per path: ONYX_CPU=avx2 / portable.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/simd/dispatch.h"
#include "kernels/cpu/simd/nn.h"
#include "kernels/cpu/simd/simd.h"

namespace onyx {
namespace {

std::vector<float> rand_vec(int64_t n, uint32_t seed, float lo, float hi) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v((size_t)n);
  for (auto& x : v) x = d(g);
  return v;
}

const int64_t kLengths[] = {1, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 47, 70, 771};

class SimdNn : public ::testing::Test {
 protected:
  // Restores the path the process started on (ONYX_CPU may have forced one).
  void SetUp() override { start_ = simd::chosen_path(); }
  void TearDown() override { simd::select_path(start_); }
  std::string start_;
  // Runs f on every supported path (f gets the path's name).
  void each_path(const std::function<void(const std::string&)>& f) {
    for (const std::string& p : simd::supported_paths()) {
      simd::select_path(p);
      SCOPED_TRACE("path " + p);
      f(p);
    }
  }
};

// |got - want| <= rel * (|want| + scale): scale is the magnitude the result is computed from.
void expect_near(const std::vector<float>& got, const std::vector<double>& want, double rel,
                 double scale, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); i++)
    ASSERT_NEAR(got[i], want[i], rel * (std::fabs(want[i]) + scale)) << what << " [" << i << "]";
}

TEST_F(SimdNn, SoftmaxRowsMatchFloat64) {
  each_path([&](const std::string&) {
    for (int64_t n : kLengths) {
      SCOPED_TRACE("n=" + std::to_string(n));
      const std::vector<float> x = rand_vec(n, 1 + (uint32_t)n, -6, 4);
      const std::vector<float> dy = rand_vec(n, 2 + (uint32_t)n, -1, 1);
      double mx = -INFINITY, se = 0, sdy = 0;
      for (float v : x) mx = std::max(mx, (double)v);
      for (float v : x) se += std::exp(v - mx);
      std::vector<double> sm(n), lsm(n);
      for (int64_t i = 0; i < n; i++) {
        sm[i] = std::exp(x[i] - mx) / se;
        lsm[i] = x[i] - mx - std::log(se);
        sdy += dy[i];
      }
      std::vector<float> y(n), ly(n), y_in = x;
      simd::softmax_row(x.data(), y.data(), n);
      expect_near(y, sm, 2e-6, 0, "softmax_row");
      simd::softmax_row(y_in.data(), y_in.data(), n);  // in place
      expect_near(y_in, sm, 2e-6, 0, "softmax_row in place");
      simd::log_softmax_row(x.data(), ly.data(), n);
      expect_near(ly, lsm, 2e-6, 1, "log_softmax_row");
      // gradients, from the float outputs
      double dot = 0;
      for (int64_t i = 0; i < n; i++) dot += (double)dy[i] * y[i];
      std::vector<double> g(n), lg(n);
      for (int64_t i = 0; i < n; i++) {
        g[i] = y[i] * (dy[i] - dot);
        lg[i] = dy[i] - std::exp((double)ly[i]) * sdy;
      }
      std::vector<float> dx(n);
      simd::softmax_grad_row(dy.data(), y.data(), dx.data(), n);
      expect_near(dx, g, 1e-5, 1e-2, "softmax_grad_row");
      simd::log_softmax_grad_row(dy.data(), ly.data(), dx.data(), n);
      expect_near(dx, lg, 1e-5, 1 + std::fabs(sdy), "log_softmax_grad_row");
      // the strided-axis forms over n columns: one row r of x against a column max m
      const std::vector<float> m = rand_vec(n, 3 + (uint32_t)n, 4, 5);
      std::vector<float> s = rand_vec(n, 4 + (uint32_t)n, 0, 1), e(n);
      std::vector<double> s_want(n), e_want(n), c_want(n);
      for (int64_t i = 0; i < n; i++) {
        e_want[i] = std::exp((double)x[i] - m[i]);
        s_want[i] = s[i] + e_want[i];
        c_want[i] = dy[i] - std::exp((double)ly[i]) * s[i];
      }
      simd::log_softmax_grad_cols(dy.data(), ly.data(), s.data(), dx.data(), n);
      expect_near(dx, c_want, 1e-5, 1, "log_softmax_grad_cols");
      simd::softmax_cols_exp(x.data(), m.data(), e.data(), s.data(), n);
      expect_near(e, e_want, 2e-6, 0, "softmax_cols_exp e");
      expect_near(s, s_want, 2e-6, 0, "softmax_cols_exp s");
      simd::softmax_cols_exp(x.data(), m.data(), nullptr, s.data(), n);  // sums only
      for (int64_t i = 0; i < n; i++) s_want[i] += e_want[i];
      expect_near(s, s_want, 4e-6, 0, "softmax_cols_exp s (no y)");
    }
  });
}

TEST_F(SimdNn, SoftmaxSpecialValues) {
  each_path([&](const std::string&) {
    for (int64_t n : {3, 9, 17, 33}) {
      SCOPED_TRACE("n=" + std::to_string(n));
      std::vector<float> x = rand_vec(n, 5, -2, 2), y(n);
      x[1] = -INFINITY;  // a masked key: probability 0
      simd::softmax_row(x.data(), y.data(), n);
      EXPECT_EQ(y[1], 0.0f);
      double s = 0;
      for (float v : y) s += v;
      EXPECT_NEAR(s, 1.0, 1e-6);
      std::vector<float> all(n, -INFINITY);  // every key masked: NaN, as numpy
      simd::softmax_row(all.data(), y.data(), n);
      for (float v : y) EXPECT_TRUE(std::isnan(v));
      x[n - 1] = NAN;  // NaN poisons the row
      simd::log_softmax_row(x.data(), y.data(), n);
      EXPECT_TRUE(std::isnan(y[0]));
    }
  });
}

TEST_F(SimdNn, AttentionAndLossRowsMatchFloat64) {
  each_path([&](const std::string&) {
    for (int64_t n : kLengths) {
      SCOPED_TRACE("n=" + std::to_string(n));
      const std::vector<float> p = rand_vec(n, 6 + (uint32_t)n, 0, 1);
      const std::vector<float> pd = rand_vec(n, 7 + (uint32_t)n, 0, 2);
      const std::vector<float> dp = rand_vec(n, 8 + (uint32_t)n, -1, 1);
      const float scale = 0.125f;
      double r = 0, rd = 0;
      for (int64_t i = 0; i < n; i++) {
        r += (double)dp[i] * p[i];
        rd += (double)((float)(pd[i] * dp[i]));
      }
      std::vector<double> want(n), want_d(n);
      for (int64_t i = 0; i < n; i++) {
        want[i] = (dp[i] - r) * p[i] * scale;
        want_d[i] = ((double)(float)(pd[i] * dp[i]) - p[i] * rd) * scale;
      }
      std::vector<float> ds = dp;
      simd::attention_grad_row(p.data(), ds.data(), n, scale);
      expect_near(ds, want, 1e-5, (double)n * scale, "attention_grad_row");
      ds = dp;
      simd::attention_grad_row_dropout(p.data(), pd.data(), ds.data(), n, scale);
      expect_near(ds, want_d, 1e-5, (double)n * scale, "attention_grad_row_dropout");
      // loss rows
      const std::vector<float> lp = rand_vec(n, 9 + (uint32_t)n, -20, 0);
      std::vector<float> y(n);
      std::vector<double> w(n);
      for (int64_t i = 0; i < n; i++) w[i] = std::exp((double)lp[i]) * 0.3;
      simd::scaled_exp_row(lp.data(), y.data(), n, 0.3f);
      expect_near(y, w, 2e-6, 0, "scaled_exp_row");
      std::vector<float> z = dp;
      simd::add_arrays(z.data(), p.data(), z.data(), n);
      for (int64_t i = 0; i < n; i++) ASSERT_EQ(z[i], dp[i] + p[i]) << i;
      z = p;
      simd::row_mul_sub(z.data(), n, 3.0f, 0.25f);
      for (int64_t i = 0; i < n; i++)  // one FMA (two roundings where a path has none)
        ASSERT_NEAR(z[i], std::fma(p[i], 3.0f, -0.25f), 2.5e-7 * 3) << i;
    }
  });
}

TEST_F(SimdNn, NormRowsMatchFloat64) {
  each_path([&](const std::string&) {
    for (int64_t n : kLengths) {
      SCOPED_TRACE("n=" + std::to_string(n));
      const std::vector<float> x = rand_vec(n, 10 + (uint32_t)n, -2, 3);
      const std::vector<float> sc = rand_vec(n, 11 + (uint32_t)n, 0.5f, 1.5f);
      const std::vector<float> bi = rand_vec(n, 12 + (uint32_t)n, -1, 1);
      const std::vector<float> dy = rand_vec(n, 13 + (uint32_t)n, -1, 1);
      const float eps = 1e-5f;
      // LayerNorm forward
      double mean = 0, var = 0;
      for (float v : x) mean += v;
      mean /= n;
      for (float v : x) var += (v - mean) * (v - mean);
      var /= n;
      const double inv = 1 / std::sqrt(var + eps);
      std::vector<double> want(n), want_nb(n);
      for (int64_t i = 0; i < n; i++) {
        want_nb[i] = (x[i] - mean) * inv * sc[i];
        want[i] = want_nb[i] + bi[i];
      }
      std::vector<float> y(n);
      float m_out, inv_out;
      simd::layer_norm_row(x.data(), y.data(), n, sc.data(), bi.data(), eps, &m_out, &inv_out);
      EXPECT_NEAR(m_out, mean, 1e-6);
      EXPECT_NEAR(inv_out, inv, 1e-5 * inv);
      expect_near(y, want, 1e-5, 2, "layer_norm_row");
      simd::layer_norm_row(x.data(), y.data(), n, sc.data(), nullptr, eps, &m_out, &inv_out);
      expect_near(y, want_nb, 1e-5, 2, "layer_norm_row (no bias)");
      // LayerNorm backward, at the float statistics
      double sg = 0, sgx = 0;
      for (int64_t i = 0; i < n; i++) {
        const double xh = (x[i] - (double)m_out) * inv_out, g = (double)dy[i] * sc[i];
        sg += g;
        sgx += g * xh;
      }
      std::vector<double> dx_want(n), ds_want(n), db_want(n);
      std::vector<float> dx(n), ds = rand_vec(n, 14, -1, 1), db = rand_vec(n, 15, -1, 1);
      for (int64_t i = 0; i < n; i++) {
        const double xh = (x[i] - (double)m_out) * inv_out, g = (double)dy[i] * sc[i];
        dx_want[i] = (g - sg / n - xh * sgx / n) * inv_out;
        ds_want[i] = ds[i] + dy[i] * xh;
        db_want[i] = db[i] + dy[i];
      }
      simd::layer_norm_grad_row(dy.data(), x.data(), sc.data(), m_out, inv_out, n, dx.data(),
                                ds.data(), db.data());
      expect_near(dx, dx_want, 1e-5, 4 * inv_out, "layer_norm_grad_row dx");
      expect_near(ds, ds_want, 1e-6, 4, "layer_norm_grad_row ds");
      expect_near(db, db_want, 1e-6, 2, "layer_norm_grad_row db");
      // RMSNorm forward and backward
      double ss = 0;
      for (float v : x) ss += (double)v * v;
      const double rinv = 1 / std::sqrt(ss / n + eps);
      for (int64_t i = 0; i < n; i++) want[i] = x[i] * rinv * sc[i];
      const float r_out = simd::rms_norm_row(x.data(), y.data(), n, sc.data(), eps);
      EXPECT_NEAR(r_out, rinv, 1e-5 * rinv);
      expect_near(y, want, 1e-5, 1, "rms_norm_row");
      double rgx = 0;
      for (int64_t i = 0; i < n; i++) rgx += (double)dy[i] * sc[i] * x[i] * r_out;
      ds = rand_vec(n, 16, -1, 1);
      for (int64_t i = 0; i < n; i++) {
        const double xh = (double)x[i] * r_out;
        dx_want[i] = ((double)dy[i] * sc[i] - xh * rgx / n) * r_out;
        ds_want[i] = ds[i] + dy[i] * xh;
      }
      simd::rms_norm_grad_row(dy.data(), x.data(), sc.data(), r_out, n, dx.data(), ds.data());
      expect_near(dx, dx_want, 1e-5, 4 * r_out, "rms_norm_grad_row dx");
      expect_near(ds, ds_want, 1e-6, 4, "rms_norm_grad_row ds");
    }
  });
}

// The unfused graph's rotary: each product and sum rounded to float once.
__attribute__((optimize("fp-contract=off"))) void rotary_ref(const float* x, const float* c,
                                                             const float* s, float* y, int64_t D,
                                                             bool transposed) {
  const int64_t h = D / 2;
  for (int64_t i = 0; i < h; i++) {
    const float x1 = x[i], x2 = x[h + i];
    if (transposed) {
      y[i] = x1 * c[i] + x2 * s[h + i];
      y[h + i] = x2 * c[h + i] - x1 * s[i];
    } else {
      y[i] = x1 * c[i] - x2 * s[i];
      y[h + i] = x2 * c[h + i] + x1 * s[h + i];
    }
  }
}

TEST_F(SimdNn, SwiGLUAndRotary) {
  std::vector<std::vector<float>> sw_runs;
  each_path([&](const std::string&) {
    std::vector<float> all;
    for (int64_t n : kLengths) {
      SCOPED_TRACE("n=" + std::to_string(n));
      const std::vector<float> g = rand_vec(n, 17 + (uint32_t)n, -8, 8);
      const std::vector<float> u = rand_vec(n, 18 + (uint32_t)n, -2, 2);
      const std::vector<float> dy = rand_vec(n, 19 + (uint32_t)n, -1, 1);
      std::vector<double> y_want(n), dg_want(n), du_want(n);
      for (int64_t i = 0; i < n; i++) {
        const double s = 1 / (1 + std::exp(-(double)g[i]));
        y_want[i] = g[i] * s * u[i];
        du_want[i] = dy[i] * g[i] * s;
        dg_want[i] = (double)dy[i] * u[i] * s * (1 + g[i] * (1 - s));
      }
      std::vector<float> y(n), dg(n), du(n);
      simd::swiglu(g.data(), u.data(), y.data(), n);
      expect_near(y, y_want, 4e-6, 1e-6, "swiglu");
      simd::swiglu_grad(dy.data(), g.data(), u.data(), dg.data(), du.data(), n);
      // (1 + g (1 - s)) cancels near g = -1.28: an absolute bound there
      expect_near(dg, dg_want, 4e-6, 1, "swiglu_grad dg");
      expect_near(du, du_want, 4e-6, 1e-6, "swiglu_grad du");
      all.insert(all.end(), y.begin(), y.end());
      // rotary rows of D = 2n: bit-identical to the float reference
      const int64_t D = 2 * n;
      const std::vector<float> x = rand_vec(D, 20 + (uint32_t)n, -2, 2);
      const std::vector<float> c = rand_vec(D, 21 + (uint32_t)n, -1, 1);
      const std::vector<float> s = rand_vec(D, 22 + (uint32_t)n, -1, 1);
      for (bool tr : {false, true}) {
        std::vector<float> got(D), want(D);
        (tr ? simd::rotary_grad_row : simd::rotary_row)(x.data(), c.data(), s.data(), got.data(),
                                                        D);
        rotary_ref(x.data(), c.data(), s.data(), want.data(), D, tr);
        ASSERT_EQ(std::memcmp(got.data(), want.data(), D * sizeof(float)), 0)
            << (tr ? "rotary_grad_row" : "rotary_row");
      }
    }
    sw_runs.push_back(all);
  });
  // every path within a few ulp of the first (exp's FMAs may differ on the portable path)
  for (size_t p = 1; p < sw_runs.size(); p++)
    for (size_t i = 0; i < sw_runs[0].size(); i++)
      ASSERT_NEAR(sw_runs[p][i], sw_runs[0][i], 8 * 1.2e-7 * (std::fabs(sw_runs[0][i]) + 1e-6))
          << simd::supported_paths()[p] << " i=" << i;
}

}  // namespace
}  // namespace onyx
