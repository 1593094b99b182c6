// diffusion/noise_schedule.cc — see noise_schedule.h. Formulas from diffusers 0.42's
// scheduling_ddpm.py / scheduling_ddim.py and training_utils.compute_snr; every per-step scalar
// is float32 arithmetic in diffusers' order (its 0-d float32 tensors).
#include "diffusion/noise_schedule.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "diffusion/config_reader.h"
#include "onyx/error.h"

namespace onyx::diffusion {
namespace {

// torch.linspace(start, end, n, dtype=float32) as its CPU kernel computes it: start + step·i up
// to the halfway point, end − step·(n − 1 − i) after it, each one fused multiply-add (the kernel
// is compiled for AVX2 / AVX-512 with FMA contraction, and for aarch64 likewise; unfused, a fifth
// of SD's 1,000 betas came out an ulp off torch's).
std::vector<float> linspace_f32(double start_d, double end_d, int64_t n) {
  const float start = (float)start_d, end = (float)end_d;
  const float step = n > 1 ? (end - start) / (float)(n - 1) : 0.0f;
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; i++)
    v[i] = i < n / 2 ? std::fma(step, (float)i, start) : std::fma(-step, (float)(n - i - 1), end);
  if (n == 1) v[0] = start;
  return v;
}

// diffusers' betas_for_alpha_bar (cosine alpha_bar, max_beta 0.999), computed in double.
std::vector<float> cosine_betas(int64_t n) {
  auto alpha_bar = [](double t) {
    double c = std::cos((t + 0.008) / 1.008 * M_PI / 2);
    return c * c;
  };
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; i++)
    v[i] = (float)std::min(1 - alpha_bar((double)(i + 1) / n) / alpha_bar((double)i / n), 0.999);
  return v;
}

// DPMSolverMultistepScheduler's and the Euler schedulers' keys (other schedulers' configs lack
// them: the defaults stay).
// Only their types are checked here: a pipeline's scheduler config also sets up training, which
// does not use them; dpm_solver.cc and euler.cc check the values when they sample.
void read_sampler_keys(const ConfigReader& r, ScheduleConfig& c) {
  r.integer("solver_order", c.solver_order);
  r.string("algorithm_type", c.algorithm_type);
  c.solver_type_given = r.find("solver_type") != nullptr;
  r.string("solver_type", c.solver_type);
  r.boolean("predict_x0", c.predict_x0);
  if (const nlohmann::json* d = r.find("disable_corrector"); d && !(d->is_array() && d->empty()))
    r.integers("disable_corrector", c.disable_corrector);
  r.boolean("lower_order_final", c.lower_order_final);
  r.boolean("euler_at_final", c.euler_at_final);
  r.string("final_sigmas_type", c.final_sigmas_type);
  r.number("lambda_min_clipped", c.lambda_min_clipped);
  r.string("interpolation_type", c.interpolation_type);
  r.string("timestep_type", c.timestep_type);
  r.boolean("use_karras_sigmas", c.karras_sigmas);
  r.boolean("use_exponential_sigmas", c.exponential_sigmas);
  r.number("sigma_min", c.sigma_min);
  r.number("sigma_max", c.sigma_max);
  for (const char* k :
       {"use_beta_sigmas", "use_lu_lambdas", "use_flow_sigmas", "use_dynamic_shifting"}) {
    bool on = false;
    r.boolean(k, on);
    if (on) c.unsupported_sigmas.push_back(k);
  }
}

}  // namespace

ScheduleConfig parse_schedule_config(const std::string& text, const std::string& what) {
  ConfigReader r(text, what);
  ScheduleConfig c;
  c.origin = what;
  r.string("_class_name", c.class_name);
  r.integer("num_train_timesteps", c.num_train_timesteps);
  r.string("beta_schedule", c.beta_schedule);
  r.number("beta_start", c.beta_start);
  r.number("beta_end", c.beta_end);
  r.string("prediction_type", c.prediction_type);
  r.string("variance_type", c.variance_type);
  c.clip_sample_given = r.find("clip_sample") != nullptr;
  r.boolean("clip_sample", c.clip_sample);
  r.number("clip_sample_range", c.clip_sample_range);
  c.set_alpha_to_one_given = r.find("set_alpha_to_one") != nullptr;
  r.boolean("set_alpha_to_one", c.set_alpha_to_one);
  r.boolean("skip_prk_steps", c.skip_prk_steps);
  r.integer("steps_offset", c.steps_offset);
  c.timestep_spacing_given = r.find("timestep_spacing") != nullptr;
  r.string("timestep_spacing", c.timestep_spacing);
  r.only("trained_betas", {"null"});            // (give beta_schedule)
  r.only("thresholding", {"false"});            // dynamic thresholding is not built
  r.only("rescale_betas_zero_snr", {"false"});  // (the zero-terminal-SNR betas are not built)
  read_sampler_keys(r, c);
  ONYX_CHECK(c.num_train_timesteps >= 2 && c.num_train_timesteps <= 100000, what,
             ": num_train_timesteps must be in [2, 100000], got ", c.num_train_timesteps);
  r.one_of("beta_schedule", c.beta_schedule, {"linear", "scaled_linear", "squaredcos_cap_v2"});
  r.one_of("prediction_type", c.prediction_type, {"epsilon", "v_prediction", "sample"});
  r.one_of("variance_type", c.variance_type, {"fixed_small", "fixed_small_log"});
  r.one_of("timestep_spacing", c.timestep_spacing, {"leading", "trailing", "linspace"});
  ONYX_CHECK(c.beta_start > 0 && c.beta_end > c.beta_start && c.beta_end < 1, what,
             ": need 0 < beta_start < beta_end < 1, got ", c.beta_start, ", ", c.beta_end);
  return c;
}

std::string schedule_config_json(const ScheduleConfig& c) {
  nlohmann::ordered_json j;
  j["_class_name"] = "DDPMScheduler";
  j["_diffusers_version"] = "0.42.1";
  j["num_train_timesteps"] = c.num_train_timesteps;
  j["beta_start"] = c.beta_start;
  j["beta_end"] = c.beta_end;
  j["beta_schedule"] = c.beta_schedule;
  j["trained_betas"] = nullptr;
  j["variance_type"] = c.variance_type;
  j["clip_sample"] = c.clip_sample;
  j["clip_sample_range"] = c.clip_sample_range;
  j["prediction_type"] = c.prediction_type;
  j["thresholding"] = false;
  j["timestep_spacing"] = c.timestep_spacing;
  j["steps_offset"] = c.steps_offset;
  return j.dump(2) + "\n";
}

NoiseSchedule::NoiseSchedule(const ScheduleConfig& c) : c_(c) {
  const int64_t n = c.num_train_timesteps;
  if (c.beta_schedule == "linear") {
    betas_ = linspace_f32(c.beta_start, c.beta_end, n);
  } else if (c.beta_schedule == "scaled_linear") {
    betas_ = linspace_f32(std::sqrt(c.beta_start), std::sqrt(c.beta_end), n);
    for (float& b : betas_) b = b * b;
  } else {
    betas_ = cosine_betas(n);
  }
  alphas_.resize(n);
  alphas_cumprod_.resize(n);
  double prod = 1;  // torch.cumprod accumulates in double on the CPU
  for (int64_t i = 0; i < n; i++) {
    alphas_[i] = 1.0f - betas_[i];
    prod *= (double)alphas_[i];
    alphas_cumprod_[i] = (float)prod;
  }
}

std::vector<float> NoiseSchedule::sqrt_alphas_cumprod() const {
  std::vector<float> v(alphas_cumprod_.size());
  for (size_t i = 0; i < v.size(); i++) v[i] = std::sqrt(alphas_cumprod_[i]);
  return v;
}

std::vector<float> NoiseSchedule::sqrt_one_minus_alphas_cumprod() const {
  std::vector<float> v(alphas_cumprod_.size());
  for (size_t i = 0; i < v.size(); i++) v[i] = std::sqrt(1.0f - alphas_cumprod_[i]);
  return v;
}

std::vector<float> NoiseSchedule::sigmas() const {
  std::vector<float> v(alphas_cumprod_.size());
  for (size_t i = 0; i < v.size(); i++)
    v[i] = std::sqrt((1.0f - alphas_cumprod_[i]) / alphas_cumprod_[i]);
  return v;
}

std::vector<float> NoiseSchedule::min_snr_weights(double gamma) const {
  auto a = sqrt_alphas_cumprod(), s = sqrt_one_minus_alphas_cumprod();
  const float g = (float)gamma;
  std::vector<float> w(a.size());
  for (size_t i = 0; i < w.size(); i++) {
    const float r = a[i] / s[i], snr = r * r, m = std::min(snr, g);
    w[i] = c_.prediction_type == "epsilon"        ? m / snr
           : c_.prediction_type == "v_prediction" ? m / (snr + 1.0f)
                                                  : m;
  }
  return w;
}

std::vector<int64_t> NoiseSchedule::inference_timesteps(int64_t k) const {
  const int64_t T = c_.num_train_timesteps;
  ONYX_CHECK(k >= 1 && k <= T, "num_inference_steps ", k, " must be in [1, ", T,
             "] (num_train_timesteps)");
  std::vector<int64_t> ts;
  if (c_.timestep_spacing == "linspace") {
    for (int64_t i = k - 1; i >= 0; i--)
      ts.push_back((int64_t)std::nearbyint(k == 1 ? 0.0 : (double)i * (T - 1) / (double)(k - 1)));
  } else if (c_.timestep_spacing == "leading") {
    const int64_t ratio = T / k;
    for (int64_t i = k - 1; i >= 0; i--) ts.push_back(i * ratio + c_.steps_offset);
  } else {  // trailing: np.round(np.arange(T, 0, -T / k)) - 1
    const double ratio = (double)T / (double)k;
    for (double t = T; t > 0; t -= ratio) ts.push_back((int64_t)std::nearbyint(t) - 1);
  }
  return ts;
}

float NoiseSchedule::predict_x0(float out, float x, float alpha_t, float beta_t) const {
  float x0 =
      c_.prediction_type == "epsilon" ? (x - std::pow(beta_t, 0.5f) * out) / std::pow(alpha_t, 0.5f)
      : c_.prediction_type == "sample" ? out
                                       : std::pow(alpha_t, 0.5f) * x - std::pow(beta_t, 0.5f) * out;
  if (c_.clip_sample) {
    const float r = (float)c_.clip_sample_range;
    x0 = std::clamp(x0, -r, r);
  }
  return x0;
}

void NoiseSchedule::ddpm_step(const float* out, int64_t t, int64_t prev_t, const float* noise,
                              float* x, int64_t n) const {
  const float a_t = alphas_cumprod_.at(t);
  const float a_prev = prev_t >= 0 ? alphas_cumprod_.at(prev_t) : 1.0f;
  const float b_t = 1 - a_t, b_prev = 1 - a_prev;
  const float cur_alpha = a_t / a_prev, cur_beta = 1 - cur_alpha;
  const float x0_coeff = (std::pow(a_prev, 0.5f) * cur_beta) / b_t;
  const float x_coeff = std::pow(cur_alpha, 0.5f) * b_prev / b_t;
  float sigma = 0;
  if (t > 0) {
    const float var = std::max(b_prev / b_t * cur_beta, 1e-20f);
    sigma = c_.variance_type == "fixed_small_log" ? std::exp(0.5f * std::log(var))
                                                  : std::pow(var, 0.5f);
  }
  for (int64_t i = 0; i < n; i++) {
    const float x0 = predict_x0(out[i], x[i], a_t, b_t);
    float prev = x0_coeff * x0 + x_coeff * x[i];
    if (t > 0) prev = prev + sigma * noise[i];
    x[i] = prev;
  }
}

void NoiseSchedule::ddim_step(const float* out, int64_t t, int64_t prev_t, float eta,
                              const float* noise, float* x, int64_t n) const {
  const float a_t = alphas_cumprod_.at(t);
  const float a_prev = prev_t >= 0           ? alphas_cumprod_.at(prev_t)
                       : c_.set_alpha_to_one ? 1.0f
                                             : alphas_cumprod_.at(0);
  const float b_t = 1 - a_t, b_prev = 1 - a_prev;
  // DDIMScheduler._get_variance, and std_dev_t = eta * variance ** 0.5 (float32, as there)
  const float variance = (b_prev / b_t) * (1 - a_t / a_prev);
  const float std_dev = eta * std::pow(variance, 0.5f);
  const float dir = std::pow(1 - a_prev - std_dev * std_dev, 0.5f);
  for (int64_t i = 0; i < n; i++) {
    const float x0 = predict_x0(out[i], x[i], a_t, b_t);
    const float eps = c_.prediction_type == "epsilon" ? out[i]
                      : c_.prediction_type == "sample"  // (from the unclipped x0, as diffusers)
                          ? (x[i] - std::pow(a_t, 0.5f) * out[i]) / std::pow(b_t, 0.5f)
                          : std::pow(a_t, 0.5f) * out[i] + std::pow(b_t, 0.5f) * x[i];
    x[i] = std::pow(a_prev, 0.5f) * x0 + dir * eps;
    if (eta > 0) x[i] = x[i] + std_dev * noise[i];
  }
}

}  // namespace onyx::diffusion
