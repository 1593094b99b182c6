// diffusion/unipc.cc — see unipc.h. Formulas from diffusers 0.42's
// scheduling_unipc_multistep.py (multistep_uni_p_bh_update, multistep_uni_c_bh_update); every
// per-step scalar float32 in diffusers' order (its 0-d float32 tensors), the small linear solve
// for the rhos in double (torch.linalg.solve's float32 differs in the last bits), every update an
// elementwise float32 expression evaluated as torch evaluates it.
#include "diffusion/unipc.h"

#include <algorithm>
#include <cmath>

#include "diffusion/dpm_solver.h"
#include "onyx/error.h"

namespace onyx::diffusion {
namespace {

void check_config(const ScheduleConfig& c) {
  const std::string& what = c.origin;
  ONYX_CHECK(c.unsupported_sigmas.empty(), what, ": UniPCMultistepScheduler with ",
             c.unsupported_sigmas.empty() ? "" : c.unsupported_sigmas.front(),
             " is not built (its default, Karras and exponential sigmas are)");
  ONYX_CHECK(c.solver_order >= 1 && c.solver_order <= 3, what,
             ": UniPCMultistepScheduler's solver_order must be 1, 2 or 3, got ", c.solver_order);
  ONYX_CHECK(c.solver_type == "bh1" || c.solver_type == "bh2", what, ": solver_type '",
             c.solver_type, "' is not one of bh1, bh2 (UniPCMultistepScheduler's)");
  ONYX_CHECK(c.final_sigmas_type == "zero" || c.final_sigmas_type == "sigma_min", what,
             ": final_sigmas_type '", c.final_sigmas_type, "' is not one of zero, sigma_min");
  // (diffusers runs these and its last step gives NaN: 0 · inf from the zero final sigma)
  ONYX_CHECK(c.final_sigmas_type != "zero" || (c.predict_x0 && c.solver_type == "bh2"), what,
             ": UniPCMultistepScheduler with final_sigmas_type zero and ",
             c.predict_x0 ? "solver_type bh1" : "predict_x0 false",
             " ends in NaN in diffusers (its last step multiplies infinity by zero): use "
             "final_sigmas_type sigma_min");
}

// x solving A x = b (k <= 3 unknowns) by Gaussian elimination with partial pivoting, in double.
std::vector<double> solve(std::vector<std::vector<double>> A, std::vector<double> b) {
  const size_t k = b.size();
  for (size_t col = 0; col < k; ++col) {
    size_t piv = col;
    for (size_t r = col + 1; r < k; ++r)
      if (std::fabs(A[r][col]) > std::fabs(A[piv][col])) piv = r;
    std::swap(A[col], A[piv]);
    std::swap(b[col], b[piv]);
    ONYX_CHECK(A[col][col] != 0.0,
               "UniPCMultistepScheduler: a singular system for the rhos "
               "(repeated sigmas)");
    for (size_t r = col + 1; r < k; ++r) {
      const double f = A[r][col] / A[col][col];
      for (size_t j = col; j < k; ++j) A[r][j] -= f * A[col][j];
      b[r] -= f * b[col];
    }
  }
  std::vector<double> x(k);
  for (size_t r = k; r-- > 0;) {
    double s = b[r];
    for (size_t j = r + 1; j < k; ++j) s -= A[r][j] * x[j];
    x[r] = s / A[r][r];
  }
  return x;
}

}  // namespace

UniPc::UniPc(const NoiseSchedule& s, int64_t steps) : c_(s.config()) {
  if (!c_.solver_type_given) c_.solver_type = "bh2";
  check_config(c_);
  MultistepSchedule m = multistep_schedule(s, steps, true);  // (linspace unless given)
  timesteps_ = std::move(m.timesteps);
  sigmas_ = std::move(m.sigmas);
}

// convert_model_output: the data prediction (predict_x0) or the noise prediction.
void UniPc::convert(const float* m, const float* x, float* out, int64_t n) const {
  convert_model_output(c_.prediction_type, c_.predict_x0, point(index_), m, x, out, n);
}

// From sigma index s0 to t; the older outputs at sigma indices first_older, first_older - 1, ...
// (order - 1 of them). The predictor's rhos solve the system without its last row and column
// (order 2: 0.5); the corrector's the whole system (order 1: 0.5).
UniPc::Coefficients UniPc::coefficients(int64_t t, int64_t s0, int64_t first_older, int64_t order,
                                        bool corrector) const {
  const Point pt = point(t), ps = point(s0);
  const float h = pt.lambda - ps.lambda;
  Coefficients k;
  for (int64_t i = 1; i < order; ++i)
    k.rks.push_back((point(first_older - (i - 1)).lambda - ps.lambda) / h);
  std::vector<float> rks = k.rks;
  rks.push_back(1.0f);
  const float hh = c_.predict_x0 ? -h : h;
  k.h_phi_1 = std::expm1(hh);
  float h_phi_k = k.h_phi_1 / hh - 1.0f;
  k.B_h = c_.solver_type == "bh1" ? hh : std::expm1(hh);
  int64_t factorial = 1;
  std::vector<std::vector<double>> R((size_t)order, std::vector<double>((size_t)order));
  std::vector<double> b((size_t)order);
  for (int64_t i = 1; i <= order; ++i) {
    for (int64_t j = 0; j < order; ++j) R[i - 1][j] = std::pow((double)rks[j], (double)(i - 1));
    b[i - 1] = (double)(h_phi_k * (float)factorial / k.B_h);
    factorial *= i + 1;
    h_phi_k = h_phi_k / hh - (float)(1.0 / (double)factorial);
  }
  const int64_t unknowns = corrector ? order : order - 1;
  if ((corrector && order == 1) || (!corrector && order == 2)) {
    k.rhos = {0.5f};
  } else if (unknowns > 0) {
    R.resize(unknowns);
    for (auto& row : R) row.resize(unknowns);
    b.resize(unknowns);
    for (double r : solve(R, b)) k.rhos.push_back((float)r);
  }
  return k;
}

void UniPc::update(const Coefficients& k, const Point& t, const Point& s0, const float* x,
                   const std::vector<const float*>& older, const float* m0, const float* model_t,
                   float* out, int64_t n) const {
  const bool data = c_.predict_x0;
  const float A = data ? t.sigma / s0.sigma : t.alpha / s0.alpha;
  const float B = (data ? t.alpha : t.sigma) * k.h_phi_1;
  const float C = (data ? t.alpha : t.sigma) * k.B_h;
  for (int64_t i = 0; i < n; ++i) {
    const float base = A * x[i] - B * m0[i];
    float res = 0.0f;
    for (size_t j = 0; j < older.size(); ++j) {
      const float d1 = (older[j][i] - m0[i]) / k.rks[j];
      res = j == 0 ? k.rhos[j] * d1 : res + k.rhos[j] * d1;
    }
    if (model_t) {
      const float d1t = model_t[i] - m0[i];
      res = older.empty() ? 0.0f + k.rhos.back() * d1t : res + k.rhos.back() * d1t;
    }
    out[i] = (older.empty() && !model_t) ? base : base - C * res;
  }
}

void UniPc::step(const float* model_output, float* x, int64_t n) {
  const int64_t K = (int64_t)timesteps_.size();
  ONYX_CHECK(index_ < K, "UniPCMultistepScheduler: step ", index_ + 1, " of ", K);
  std::vector<float> m(n);
  convert(model_output, x, m.data(), n);
  const bool corrector = index_ > 0 && !last_sample_.empty() &&
                         std::find(c_.disable_corrector.begin(), c_.disable_corrector.end(),
                                   index_ - 1) == c_.disable_corrector.end();
  if (corrector) {  // UniC: from the last sample to this one, with this step's output
    const int64_t order = this_order_;
    const Coefficients k = coefficients(index_, index_ - 1, index_ - 2, order, true);
    std::vector<const float*> older;
    for (int64_t i = 1; i < order; ++i) older.push_back(outputs_[outputs_.size() - 1 - i].data());
    update(k, point(index_), point(index_ - 1), last_sample_.data(), older, outputs_.back().data(),
           m.data(), x, n);
  }
  outputs_.push_back(std::move(m));
  if ((int64_t)outputs_.size() > c_.solver_order) outputs_.erase(outputs_.begin());
  const int64_t order =
      c_.lower_order_final ? std::min(c_.solver_order, K - index_) : c_.solver_order;
  this_order_ = std::min(order, lower_order_nums_ + 1);
  last_sample_.assign(x, x + n);
  // UniP: to the next timestep
  const Coefficients k = coefficients(index_ + 1, index_, index_ - 1, this_order_, false);
  std::vector<const float*> older;
  for (int64_t i = 1; i < this_order_; ++i)
    older.push_back(outputs_[outputs_.size() - 1 - i].data());
  update(k, point(index_ + 1), point(index_), last_sample_.data(), older, outputs_.back().data(),
         nullptr, x, n);
  if (lower_order_nums_ < c_.solver_order) ++lower_order_nums_;
  ++index_;
}

}  // namespace onyx::diffusion
