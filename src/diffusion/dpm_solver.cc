// diffusion/dpm_solver.cc — see dpm_solver.h. Formulas from diffusers 0.42's
// scheduling_dpmsolver_multistep.py; every per-step scalar is float32 in diffusers' order (its 0-d
// float32 tensors), every update an elementwise float32 expression evaluated as torch evaluates
// it (one rounding per operation). Each update has the form
//   x = ((A·x − B·D0) + C1·D1) + C2·D2
// (a subtraction in diffusers is the addition of the negated coefficient: the same float).
#include "diffusion/dpm_solver.h"

#include <cmath>

#include "diffusion/sigma_schedules.h"
#include "onyx/error.h"

namespace onyx::diffusion {
namespace {

// numpy's round (half to even) of a double, as an int64.
int64_t round_even(double v) { return (int64_t)std::nearbyint(v); }

// set_timesteps' integer timesteps, largest first, for `last` usable training steps.
std::vector<int64_t> dpm_timesteps(const ScheduleConfig& c, int64_t last, int64_t k) {
  const std::string spacing = c.timestep_spacing_given ? c.timestep_spacing : "linspace";
  std::vector<int64_t> ts;
  if (spacing == "linspace") {  // np.linspace(0, last - 1, k + 1).round()[::-1][:-1]
    const double step = (double)(last - 1) / (double)k;
    for (int64_t i = k; i >= 1; --i) ts.push_back(i == k ? last - 1 : round_even(i * step));
  } else if (spacing == "leading") {  // (arange(k + 1) * (last // (k + 1)))[::-1][:-1] + offset
    const int64_t ratio = last / (k + 1);
    for (int64_t i = k; i >= 1; --i) ts.push_back(i * ratio + c.steps_offset);
  } else {  // trailing: np.arange(last, 0, -T / k).round() - 1
    const double ratio = (double)c.num_train_timesteps / (double)k;
    const int64_t n = (int64_t)std::ceil((double)last / ratio);
    for (int64_t j = 0; j < n; ++j) ts.push_back(round_even((double)last - j * ratio) - 1);
  }
  return ts;
}

void check_config(const ScheduleConfig& c) {
  const std::string& what = c.origin;
  ONYX_CHECK(c.unsupported_sigmas.empty(), what, ": DPMSolverMultistepScheduler with ",
             c.unsupported_sigmas.empty() ? "" : c.unsupported_sigmas.front(),
             " is not built (its default sigmas are)");
  ONYX_CHECK(c.algorithm_type == "dpmsolver++" || c.algorithm_type == "dpmsolver" ||
                 c.algorithm_type == "sde-dpmsolver++" || c.algorithm_type == "sde-dpmsolver",
             what, ": DPMSolverMultistepScheduler's algorithm_type '", c.algorithm_type,
             "' is not one of dpmsolver++, dpmsolver, sde-dpmsolver++, sde-dpmsolver");
  ONYX_CHECK(c.algorithm_type != "sde-dpmsolver" || c.solver_order < 3, what,
             ": sde-dpmsolver has no third-order update (diffusers fails on it): solver_order 1 "
             "or 2");
  ONYX_CHECK(c.solver_order >= 1 && c.solver_order <= 3, what,
             ": solver_order must be 1, 2 or 3, got ", c.solver_order);
  ONYX_CHECK(c.solver_type == "midpoint" || c.solver_type == "heun", what, ": solver_type '",
             c.solver_type, "' is not one of midpoint, heun");
  ONYX_CHECK(c.final_sigmas_type == "zero" || c.final_sigmas_type == "sigma_min", what,
             ": final_sigmas_type '", c.final_sigmas_type, "' is not one of zero, sigma_min");
  ONYX_CHECK(c.algorithm_type.ends_with("dpmsolver++") || c.final_sigmas_type == "sigma_min", what,
             ": final_sigmas_type zero needs algorithm_type dpmsolver++ or sde-dpmsolver++ "
             "(diffusers refuses it for the others too: choose sigma_min)");
  ONYX_CHECK(!std::isnan(c.lambda_min_clipped), what, ": lambda_min_clipped is NaN");
}

// One update's coefficients: x = (((A·x − B·d0) + c1·d1) + c2·d2) + cn·noise, the terms present
// (cn: the SDE variants' fresh noise).
struct Update {
  float A = 0, B = 0, c1 = 0, c2 = 0, cn = 0;
};

void combine(float* x, int64_t n, const Update& u, const float* d0, const float* d1,
             const float* d2, const float* noise) {
  for (int64_t i = 0; i < n; ++i) {
    float v = u.A * x[i] - u.B * d0[i];
    if (d1) v = v + u.c1 * d1[i];
    if (d2) v = v + u.c2 * d2[i];
    if (noise) v = v + u.cn * noise[i];
    x[i] = v;
  }
}

// The terms every order shares: A (the sample's) and B (the first output's) and the noise's, for
// t from s0 with h = lambda_t − lambda_s0.
Update base_update(const std::string& algorithm, float alpha_t, float sigma_t, float alpha_s,
                   float sigma_s, float h) {
  Update u;
  if (algorithm == "dpmsolver++") {
    u.A = sigma_t / sigma_s;
    u.B = alpha_t * (std::exp(-h) - 1.0f);
  } else if (algorithm == "dpmsolver") {
    u.A = alpha_t / alpha_s;
    u.B = sigma_t * (std::exp(h) - 1.0f);
  } else if (algorithm == "sde-dpmsolver++") {
    u.A = sigma_t / sigma_s * std::exp(-h);
    u.B = -(alpha_t * (1.0f - std::exp(-2.0f * h)));
    u.cn = sigma_t * std::sqrt(1.0f - std::exp(-2.0f * h));
  } else {  // sde-dpmsolver
    u.A = alpha_t / alpha_s;
    u.B = 2.0f * (sigma_t * (std::exp(h) - 1.0f));
    u.cn = sigma_t * std::sqrt(std::exp(2.0f * h) - 1.0f);
  }
  return u;
}

}  // namespace

MultistepSchedule multistep_schedule(const NoiseSchedule& s, int64_t steps, bool unipc) {
  const ScheduleConfig& c = s.config();
  const char* who = unipc ? "UniPCMultistepScheduler" : "DPMSolverMultistepScheduler";
  const int64_t T = s.steps();
  ONYX_CHECK(steps >= 1 && steps <= T, "num_inference_steps ", steps, " must be in [1, ", T,
             "] (num_train_timesteps)");
  const std::vector<float>& ac = s.alphas_cumprod();
  const std::vector<float> sig = s.sigmas();
  MultistepSchedule m;
  if (c.karras_sigmas || c.exponential_sigmas) {
    // those sigmas between the table's ends (lambda_min_clipped unused, as in diffusers), each
    // sigma's timestep rounded half to even for Karras sigmas (DPM-Solver: but with
    // squaredcos_cap_v2), else truncated (diffusers' int64 cast: a timestep a hair under an
    // integer drops to the one below, so the table must be torch's bit for bit)
    const bool round = c.karras_sigmas && (unipc || c.beta_schedule != "squaredcos_cap_v2");
    const std::vector<double> sigmas = converted_sigmas(c, sig.front(), sig.back(), steps);
    for (double t : sigma_timesteps(sigmas, sig))
      m.timesteps.push_back(round ? round_even(t) : (int64_t)t);
    for (double v : sigmas) m.sigmas.push_back((float)v);
  } else {
    int64_t clipped = 0;  // searchsorted(flip(lambda_t), lambda_min_clipped): lambdas below it
    for (int64_t t = 0; t < T && !unipc; ++t) {
      const float lambda = std::log(std::sqrt(ac[t])) - std::log(std::sqrt(1.0f - ac[t]));
      clipped += lambda < c.lambda_min_clipped;
    }
    m.timesteps = dpm_timesteps(c, T - clipped, steps);
    for (int64_t t : m.timesteps) {
      ONYX_CHECK(t >= 0 && t < T, who, "'s timestep ", t, " is outside [0, ", T, ") (steps_offset ",
                 c.steps_offset, ")");
      m.sigmas.push_back(sig[t]);
    }
  }
  m.sigmas.push_back(c.final_sigmas_type == "zero" ? 0.0f : sig[0]);
  return m;
}

DpmSolver::DpmSolver(const NoiseSchedule& s, int64_t steps) : c_(s.config()) {
  check_config(c_);
  MultistepSchedule m = multistep_schedule(s, steps, false);
  timesteps_ = std::move(m.timesteps);
  sigmas_ = std::move(m.sigmas);
}

SigmaPoint sigma_point(float s) {
  SigmaPoint p;
  p.alpha = 1.0f / std::sqrt(s * s + 1.0f);
  p.sigma = s * p.alpha;
  p.lambda = std::log(p.alpha) - std::log(p.sigma);
  return p;
}

void convert_model_output(const std::string& pt, bool data, const SigmaPoint& p, const float* m,
                          const float* x, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if (pt == "sample")
      out[i] = data ? m[i] : (x[i] - p.alpha * m[i]) / p.sigma;
    else if (pt == "epsilon")
      out[i] = data ? (x[i] - p.sigma * m[i]) / p.alpha : m[i];
    else  // v_prediction
      out[i] = data ? p.alpha * x[i] - p.sigma * m[i] : p.alpha * m[i] + p.sigma * x[i];
  }
}

// the data prediction x0 ((sde-)dpmsolver++) or the noise prediction ((sde-)dpmsolver)
void DpmSolver::convert(const float* m, const float* x, float* out, int64_t n) const {
  convert_model_output(c_.prediction_type, c_.algorithm_type.ends_with("dpmsolver++"),
                       point(index_), m, x, out, n);
}

void DpmSolver::first_order(const float* m0, const float* noise, float* x, int64_t n) const {
  const Point t = point(index_ + 1), s = point(index_);
  const Update u =
      base_update(c_.algorithm_type, t.alpha, t.sigma, s.alpha, s.sigma, t.lambda - s.lambda);
  combine(x, n, u, m0, nullptr, nullptr, noise);
}

void DpmSolver::second_order(const float* noise, float* x, int64_t n) const {
  const Point t = point(index_ + 1), s0 = point(index_), s1 = point(index_ - 1);
  const std::vector<float>&m0 = outputs_.back(), &m1 = outputs_[outputs_.size() - 2];
  const float h = t.lambda - s0.lambda, h0 = s0.lambda - s1.lambda;
  const float r0 = h0 / h, inv_r0 = 1.0f / r0;
  std::vector<float> d1(n);
  for (int64_t i = 0; i < n; ++i) d1[i] = inv_r0 * (m0[i] - m1[i]);
  const std::string& a = c_.algorithm_type;
  Update u = base_update(a, t.alpha, t.sigma, s0.alpha, s0.sigma, h);
  const bool midpoint = c_.solver_type == "midpoint";
  if (a == "dpmsolver++" || a == "dpmsolver")
    u.c1 = midpoint             ? -(0.5f * u.B)
           : a == "dpmsolver++" ? t.alpha * ((std::exp(-h) - 1.0f) / h + 1.0f)
                                : -(t.sigma * ((std::exp(h) - 1.0f) / h - 1.0f));
  else if (a == "sde-dpmsolver++")
    u.c1 = midpoint ? 0.5f * (t.alpha * (1.0f - std::exp(-2.0f * h)))
                    : t.alpha * ((1.0f - std::exp(-2.0f * h)) / (-2.0f * h) + 1.0f);
  else  // sde-dpmsolver
    u.c1 = midpoint ? -(t.sigma * (std::exp(h) - 1.0f))
                    : -(2.0f * (t.sigma * ((std::exp(h) - 1.0f) / h - 1.0f)));
  combine(x, n, u, m0.data(), d1.data(), nullptr, noise);
}

void DpmSolver::third_order(const float* noise, float* x, int64_t n) const {
  const Point t = point(index_ + 1), s0 = point(index_), s1 = point(index_ - 1),
              s2 = point(index_ - 2);
  const size_t k = outputs_.size();
  const std::vector<float>&m0 = outputs_[k - 1], &m1 = outputs_[k - 2], &m2 = outputs_[k - 3];
  const float h = t.lambda - s0.lambda, h0 = s0.lambda - s1.lambda, h1 = s1.lambda - s2.lambda;
  const float r0 = h0 / h, r1 = h1 / h;
  const float inv_r0 = 1.0f / r0, inv_r1 = 1.0f / r1, w = r0 / (r0 + r1),
              inv_sum = 1.0f / (r0 + r1);
  std::vector<float> d1(n), d2(n);
  for (int64_t i = 0; i < n; ++i) {
    const float d10 = inv_r0 * (m0[i] - m1[i]), d11 = inv_r1 * (m1[i] - m2[i]);
    d1[i] = d10 + w * (d10 - d11);
    d2[i] = inv_sum * (d10 - d11);
  }
  const std::string& a = c_.algorithm_type;
  Update u = base_update(a, t.alpha, t.sigma, s0.alpha, s0.sigma, h);
  if (a == "sde-dpmsolver++") {
    const float e2 = 1.0f - std::exp(-2.0f * h), q = 2.0f * h;
    u.c1 = t.alpha * (e2 / (-2.0f * h) + 1.0f);
    u.c2 = t.alpha * ((e2 - 2.0f * h) / (q * q) - 0.5f);
  } else {
    const bool data = a == "dpmsolver++";
    const float e = data ? std::exp(-h) : std::exp(h);
    u.c1 = data ? t.alpha * ((e - 1.0f) / h + 1.0f) : -(t.sigma * ((e - 1.0f) / h - 1.0f));
    u.c2 = data ? -(t.alpha * ((e - 1.0f + h) / (h * h) - 0.5f))
                : -(t.sigma * ((e - 1.0f - h) / (h * h) - 0.5f));
  }
  combine(x, n, u, m0.data(), d1.data(), d2.data(), noise);
}

void DpmSolver::step(const float* model_output, const float* noise, float* x, int64_t n) {
  ONYX_CHECK(!sde() || noise, "DPMSolverMultistepScheduler ", c_.algorithm_type,
             ": each step needs its noise");
  const int64_t K = (int64_t)timesteps_.size();
  ONYX_CHECK(index_ < K, "DPMSolverMultistepScheduler: step ", index_ + 1, " of ", K);
  const bool lower_final =
      index_ == K - 1 &&
      (c_.euler_at_final || (c_.lower_order_final && K < 15) || c_.final_sigmas_type == "zero");
  const bool lower_second = index_ == K - 2 && c_.lower_order_final && K < 15;
  std::vector<float> m(n);
  convert(model_output, x, m.data(), n);
  outputs_.push_back(std::move(m));
  if ((int64_t)outputs_.size() > c_.solver_order) outputs_.erase(outputs_.begin());
  if (!sde()) noise = nullptr;
  if (c_.solver_order == 1 || lower_order_nums_ < 1 || lower_final)
    first_order(outputs_.back().data(), noise, x, n);
  else if (c_.solver_order == 2 || lower_order_nums_ < 2 || lower_second)
    second_order(noise, x, n);
  else
    third_order(noise, x, n);
  if (lower_order_nums_ < c_.solver_order) ++lower_order_nums_;
  ++index_;
}

}  // namespace onyx::diffusion
