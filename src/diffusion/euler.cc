// diffusion/euler.cc — see euler.h. Formulas from diffusers 0.42's scheduling_euler_discrete.py and
// scheduling_euler_ancestral_discrete.py: the tables in numpy's float64 (linspace, interp) rounded
// to float32 where diffusers rounds them, every per-step scalar float32 as its 0-d tensors, every
// elementwise expression one rounding per operation as torch evaluates it.
#include "diffusion/euler.h"

#include <algorithm>
#include <cmath>

#include "diffusion/karras.h"
#include "onyx/error.h"

namespace onyx::diffusion {
namespace {

// set_timesteps' float32 timesteps, largest first.
std::vector<float> euler_timesteps(const ScheduleConfig& c, int64_t k) {
  const int64_t T = c.num_train_timesteps;
  const std::string spacing = c.timestep_spacing_given ? c.timestep_spacing : "linspace";
  std::vector<float> ts;
  if (spacing == "linspace") {  // np.linspace(0, T - 1, k, dtype=float32)[::-1]
    const double step = k > 1 ? (double)(T - 1) / (double)(k - 1) : 0.0;
    for (int64_t i = k - 1; i >= 0; --i)
      ts.push_back(i == k - 1 && k > 1 ? (float)(T - 1) : (float)(i * step));
  } else if (spacing == "leading") {  // (arange(k) * (T // k)).round()[::-1] + steps_offset
    const int64_t ratio = T / k;
    for (int64_t i = k - 1; i >= 0; --i) ts.push_back((float)(i * ratio) + (float)c.steps_offset);
  } else {  // trailing: np.arange(T, 0, -T / k).round() - 1
    const double ratio = (double)T / (double)k;
    const int64_t n = (int64_t)std::ceil((double)T / ratio);
    for (int64_t j = 0; j < n; ++j)
      ts.push_back((float)std::nearbyint((double)T - j * ratio) - 1.0f);
  }
  return ts;
}

// np.interp(x, arange(len(fp)), fp) in float64.
double interp(double x, const std::vector<float>& fp) {
  const int64_t last = (int64_t)fp.size() - 1;
  if (x <= 0) return fp[0];
  if (x >= (double)last) return fp[last];
  const int64_t j = (int64_t)std::floor(x);
  if ((double)j == x) return fp[j];
  const double slope = (double)fp[j + 1] - (double)fp[j];
  return slope * (x - (double)j) + (double)fp[j];
}

void check_config(const ScheduleConfig& c, bool ancestral) {
  const std::string& what = c.origin;
  ONYX_CHECK(c.unsupported_sigmas.empty(), what, ": the Euler schedulers with ",
             c.unsupported_sigmas.empty() ? "" : c.unsupported_sigmas.front(),
             " are not built (their default sigmas are)");
  ONYX_CHECK(c.interpolation_type == "linear", what, ": interpolation_type '", c.interpolation_type,
             "' is not built (linear)");
  ONYX_CHECK(c.timestep_type == "discrete", what, ": timestep_type '", c.timestep_type,
             "' is not built (discrete)");
  ONYX_CHECK(!ancestral || c.prediction_type != "sample", what,
             ": EulerAncestralDiscreteScheduler does not take prediction_type sample (diffusers "
             "refuses it too)");
  ONYX_CHECK(ancestral || c.final_sigmas_type == "zero" || c.final_sigmas_type == "sigma_min", what,
             ": final_sigmas_type '", c.final_sigmas_type, "' is not one of zero, sigma_min");
}

}  // namespace

EulerSampler::EulerSampler(const NoiseSchedule& s, int64_t steps, bool ancestral)
    : c_(s.config()), ancestral_(ancestral) {
  check_config(c_, ancestral);
  const int64_t T = s.steps();
  ONYX_CHECK(steps >= 1 && steps <= T, "num_inference_steps ", steps, " must be in [1, ", T,
             "] (num_train_timesteps)");
  const std::vector<float>& ac = s.alphas_cumprod();
  std::vector<float> sig(T);
  for (int64_t t = 0; t < T; ++t) sig[t] = std::sqrt((1.0f - ac[t]) / ac[t]);
  timesteps_ = euler_timesteps(c_, steps);
  std::vector<double> sigmas;  // float64, as numpy's interp gives them
  for (float t : timesteps_) {
    ONYX_CHECK(t >= 0 && t <= (float)(T - 1), "the Euler scheduler's timestep ", t,
               " is outside [0, ", T - 1, "] (steps_offset ", c_.steps_offset, ")");
    sigmas.push_back(interp((double)t, sig));
  }
  if (c_.karras_sigmas && !ancestral) {  // between the interpolated ends, or the config's
    sigmas = karras_sigmas(std::isnan(c_.sigma_min) ? sigmas.back() : c_.sigma_min,
                           std::isnan(c_.sigma_max) ? sigmas.front() : c_.sigma_max, steps);
    std::vector<float> log_sigmas;
    for (float s : sig) log_sigmas.push_back(std::log(s));
    timesteps_.clear();
    for (double s : sigmas) timesteps_.push_back((float)sigma_to_t(s, log_sigmas));
  }
  for (double s : sigmas) sigmas_.push_back((float)s);
  sigmas_.push_back(!ancestral && c_.final_sigmas_type == "sigma_min" ? sig[0] : 0.0f);
}

float EulerSampler::init_noise_sigma() const {
  const float mx = *std::max_element(sigmas_.begin(), sigmas_.end());
  const std::string spacing = c_.timestep_spacing_given ? c_.timestep_spacing : "linspace";
  return spacing == "linspace" || spacing == "trailing" ? mx : std::sqrt(mx * mx + 1.0f);
}

void EulerSampler::scale_input(int64_t i, const float* x, float* out, int64_t n) const {
  const float s = sigmas_.at(i), d = std::sqrt(s * s + 1.0f);
  for (int64_t k = 0; k < n; ++k) out[k] = x[k] / d;
}

void EulerSampler::step(int64_t i, const float* m, const float* noise, float* x, int64_t n) const {
  const float sigma = sigmas_.at(i), next = sigmas_.at(i + 1);
  const float sigma_hat = sigma * 1.0f;  // (gamma 0: s_churn is not taken)
  const std::string& pt = c_.prediction_type;
  const float v_out = -sigma / std::sqrt(sigma * sigma + 1.0f), v_in = sigma * sigma + 1.0f;
  float dt, up = 0;
  if (ancestral_) {
    up = std::sqrt(next * next * (sigma * sigma - next * next) / (sigma * sigma));
    dt = std::sqrt(next * next - up * up) - sigma;
  } else {
    dt = next - sigma_hat;
  }
  for (int64_t k = 0; k < n; ++k) {
    const float x0 = pt == "sample"    ? m[k]
                     : pt == "epsilon" ? x[k] - sigma_hat * m[k]
                                       : m[k] * v_out + x[k] / v_in;
    const float derivative = (x[k] - x0) / sigma_hat;
    float prev = x[k] + derivative * dt;
    if (ancestral_) prev = prev + noise[k] * up;
    x[k] = prev;
  }
}

}  // namespace onyx::diffusion
