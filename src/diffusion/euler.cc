// diffusion/euler.cc — see euler.h. Formulas from diffusers 0.42's scheduling_euler_discrete.py and
// scheduling_euler_ancestral_discrete.py: the tables in numpy's float64 (linspace, interp) rounded
// to float32 where diffusers rounds them, every per-step scalar float32 as its 0-d tensors, every
// elementwise expression one rounding per operation as torch evaluates it.
#include "diffusion/euler.h"

#include <algorithm>
#include <cmath>

#include "diffusion/sigma_schedules.h"
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
             " are not built (their default, Karras and exponential sigmas are)");
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

// set_timesteps' float32 timesteps and float64 sigmas (one per timestep): the table's sigmas
// interpolated at the timesteps, or (`convert`) the Karras or exponential sigmas between their ends
// (`bounds`: the config's sigma_min / sigma_max where given, as EulerDiscreteScheduler takes
// them) and each one's fractional timestep.
void sigma_schedule(const NoiseSchedule& s, int64_t steps, bool convert, bool bounds,
                    std::vector<float>& timesteps, std::vector<double>& sigmas) {
  const ScheduleConfig& c = s.config();
  const int64_t T = s.steps();
  ONYX_CHECK(steps >= 1 && steps <= T, "num_inference_steps ", steps, " must be in [1, ", T,
             "] (num_train_timesteps)");
  const std::vector<float> sig = s.sigmas();
  timesteps = euler_timesteps(c, steps);
  sigmas.clear();
  for (float t : timesteps) {
    ONYX_CHECK(t >= 0 && t <= (float)(T - 1), c.origin, ": timestep ", t, " is outside [0, ", T - 1,
               "] (steps_offset ", c.steps_offset, ")");
    sigmas.push_back(interp((double)t, sig));
  }
  if (!convert || (!c.karras_sigmas && !c.exponential_sigmas)) return;
  sigmas =
      converted_sigmas(c, bounds && !std::isnan(c.sigma_min) ? c.sigma_min : sigmas.back(),
                       bounds && !std::isnan(c.sigma_max) ? c.sigma_max : sigmas.front(), steps);
  timesteps.clear();
  for (double t : sigma_timesteps(sigmas, sig)) timesteps.push_back((float)t);
}

// scale_model_input: x / sqrt(sigma² + 1).
void scale_by_sigma(float sigma, const float* x, float* out, int64_t n) {
  const float d = std::sqrt(sigma * sigma + 1.0f);
  for (int64_t k = 0; k < n; ++k) out[k] = x[k] / d;
}

// init_noise_sigma: the largest sigma, or sqrt(sigma_max² + 1) with leading spacing.
float noise_sigma(const ScheduleConfig& c, const std::vector<float>& sigmas) {
  const float mx = *std::max_element(sigmas.begin(), sigmas.end());
  const std::string spacing = c.timestep_spacing_given ? c.timestep_spacing : "linspace";
  return spacing == "linspace" || spacing == "trailing" ? mx : std::sqrt(mx * mx + 1.0f);
}

}  // namespace

EulerSampler::EulerSampler(const NoiseSchedule& s, int64_t steps, bool ancestral)
    : c_(s.config()), ancestral_(ancestral) {
  check_config(c_, ancestral);
  std::vector<double> sigmas;
  sigma_schedule(s, steps, !ancestral, true, timesteps_, sigmas);
  for (double v : sigmas) sigmas_.push_back((float)v);
  sigmas_.push_back(!ancestral && c_.final_sigmas_type == "sigma_min" ? s.sigmas()[0] : 0.0f);
}

float EulerSampler::init_noise_sigma() const { return noise_sigma(c_, sigmas_); }

void EulerSampler::scale_input(int64_t i, const float* x, float* out, int64_t n) const {
  scale_by_sigma(sigmas_.at(i), x, out, n);
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

HeunSampler::HeunSampler(const NoiseSchedule& s, int64_t steps) : c_(s.config()) {
  ONYX_CHECK(c_.unsupported_sigmas.empty(), c_.origin, ": HeunDiscreteScheduler with ",
             c_.unsupported_sigmas.empty() ? "" : c_.unsupported_sigmas.front(),
             " is not built (its default, Karras and exponential sigmas are)");
  ONYX_CHECK(c_.prediction_type == "epsilon" || c_.prediction_type == "v_prediction" ||
                 c_.prediction_type == "sample",
             c_.origin, ": prediction_type '", c_.prediction_type,
             "' is not one of epsilon, "
             "v_prediction, sample");
  std::vector<float> ts;
  std::vector<double> sigmas;
  sigma_schedule(s, steps, true, false, ts, sigmas);
  sigmas.push_back(0.0);
  // every timestep but the first twice, every sigma but the first and the last twice
  for (size_t k = 0; k < ts.size(); ++k)
    for (int rep = 0; rep < (k == 0 ? 1 : 2); ++rep) timesteps_.push_back(ts[k]);
  for (size_t k = 0; k < sigmas.size(); ++k)
    for (int rep = 0; rep < (k == 0 || k + 1 == sigmas.size() ? 1 : 2); ++rep)
      sigmas_.push_back((float)sigmas[k]);
}

float HeunSampler::init_noise_sigma() const { return noise_sigma(c_, sigmas_); }

void HeunSampler::scale_input(int64_t i, const float* x, float* out, int64_t n) const {
  scale_by_sigma(sigmas_.at(i), x, out, n);
}

void HeunSampler::step(int64_t i, const float* m, float* x, int64_t n) {
  const bool first = derivative_.empty();
  const float sigma = sigmas_.at(first ? i : i - 1), next = sigmas_.at(first ? i + 1 : i);
  const float sigma_hat = sigma * 1.0f, in = first ? sigma_hat : next;  // (gamma 0)
  const std::string& pt = c_.prediction_type;
  const float v_out = -in / std::sqrt(in * in + 1.0f), v_in = in * in + 1.0f;
  // clip_sample: HeunDiscreteScheduler's default is off (a DDPM file's key, when there, counts)
  const bool clip = c_.clip_sample_given && c_.clip_sample;
  const float r = (float)c_.clip_sample_range;
  if (first) {
    derivative_.resize(n);
    sample_.assign(x, x + n);
    dt_ = next - sigma_hat;
  }
  for (int64_t k = 0; k < n; ++k) {
    float x0 = pt == "sample"    ? m[k]
               : pt == "epsilon" ? x[k] - in * m[k]
                                 : m[k] * v_out + x[k] / v_in;
    if (clip) x0 = std::clamp(x0, -r, r);
    if (first) {
      derivative_[k] = (x[k] - x0) / sigma_hat;
      x[k] = x[k] + derivative_[k] * dt_;
    } else {
      const float d = (derivative_[k] + (x[k] - x0) / next) / 2.0f;
      x[k] = sample_[k] + d * dt_;
    }
  }
  if (!first) {
    derivative_.clear();
    sample_.clear();
  }
}

LmsSampler::LmsSampler(const NoiseSchedule& s, int64_t steps) : c_(s.config()) {
  ONYX_CHECK(c_.unsupported_sigmas.empty(), c_.origin, ": LMSDiscreteScheduler with ",
             c_.unsupported_sigmas.empty() ? "" : c_.unsupported_sigmas.front(),
             " is not built (its default, Karras and exponential sigmas are)");
  std::vector<double> sigmas;
  sigma_schedule(s, steps, true, false, timesteps_, sigmas);
  for (double v : sigmas) sigmas_.push_back((float)v);
  sigmas_.push_back(0.0f);
}

float LmsSampler::init_noise_sigma() const { return noise_sigma(c_, sigmas_); }

void LmsSampler::scale_input(int64_t i, const float* x, float* out, int64_t n) const {
  scale_by_sigma(sigmas_.at(i), x, out, n);
}

// ∫ from sigma_i to sigma_{i+1} of Π_{j != k, j < order} (tau − s_{i−j}) / (s_{i−k} − s_{i−j}):
// the product expanded into polynomial coefficients, integrated term by term (double).
double LmsSampler::coefficient(int64_t order, int64_t i, int64_t k) const {
  std::vector<double> poly = {1.0};  // poly[d]: the coefficient of tau^d
  for (int64_t j = 0; j < order; ++j) {
    if (j == k) continue;
    const double root = sigmas_.at(i - j), scale = 1.0 / ((double)sigmas_.at(i - k) - root);
    std::vector<double> next(poly.size() + 1, 0.0);
    for (size_t d = 0; d < poly.size(); ++d) {
      next[d + 1] += poly[d] * scale;
      next[d] -= poly[d] * root * scale;
    }
    poly = std::move(next);
  }
  const double a = sigmas_.at(i), b = sigmas_.at(i + 1);
  double sum = 0;
  for (size_t d = 0; d < poly.size(); ++d)
    sum += poly[d] * (std::pow(b, (double)d + 1) - std::pow(a, (double)d + 1)) / ((double)d + 1);
  return sum;
}

void LmsSampler::step(int64_t i, const float* m, float* x, int64_t n) {
  const float sigma = sigmas_.at(i);
  const std::string& pt = c_.prediction_type;
  const float v_out = -sigma / std::sqrt(sigma * sigma + 1.0f), v_in = sigma * sigma + 1.0f;
  std::vector<float> d(n);
  for (int64_t k = 0; k < n; ++k) {
    const float x0 = pt == "sample"    ? m[k]
                     : pt == "epsilon" ? x[k] - sigma * m[k]
                                       : m[k] * v_out + x[k] / v_in;
    d[k] = (x[k] - x0) / sigma;
  }
  derivatives_.push_back(std::move(d));
  if (derivatives_.size() > 4) derivatives_.erase(derivatives_.begin());
  const int64_t order = std::min<int64_t>(i + 1, 4);
  std::vector<float> coeffs;
  for (int64_t k = 0; k < order; ++k) coeffs.push_back((float)coefficient(order, i, k));
  const size_t newest = derivatives_.size() - 1;
  for (int64_t e = 0; e < n; ++e) {
    float sum = coeffs[0] * derivatives_[newest][e];  // (Python's sum: 0 + the first term)
    for (int64_t k = 1; k < order; ++k) sum = sum + coeffs[k] * derivatives_[newest - k][e];
    x[e] = x[e] + sum;
  }
}

}  // namespace onyx::diffusion
