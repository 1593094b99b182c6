// diffusion/noise_schedule.h — diffusers' DDPMScheduler / DDIMScheduler arithmetic: the beta
// schedules, alphas_cumprod, what training adds to an image at timestep t and what it predicts,
// min-SNR loss weights, and one reverse step of each sampler.
//
// The tables are computed as diffusers computes them in float32 (torch.linspace's float32
// formula with its fused multiply-adds, 1 - beta in float32, torch.cumprod accumulating in double
// and rounding each entry), so sqrt(1 - alphas_cumprod[t]) — a small difference of numbers near 1
// at small t — is the same float as diffusers'.
#pragma once
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace onyx::diffusion {

struct ScheduleConfig {    // scheduler_config.json (DDPMScheduler / DDIMScheduler keys)
  std::string class_name;  // _class_name: the scheduler a pipeline steps with ("": none named)
  int64_t num_train_timesteps = 1000;
  std::string beta_schedule = "linear";  // linear | scaled_linear | squaredcos_cap_v2
  double beta_start = 0.0001, beta_end = 0.02;
  std::string prediction_type = "epsilon";    // epsilon | v_prediction | sample
  std::string variance_type = "fixed_small";  // DDPM: fixed_small | fixed_small_log
  bool clip_sample = true;
  bool clip_sample_given = false;  // (HeunDiscreteScheduler's default is false)
  double clip_sample_range = 1.0;
  bool set_alpha_to_one = true;         // DDIM: alpha_prod of the step before t = 0
  bool set_alpha_to_one_given = false;  // (PNDMScheduler's default is false)
  bool skip_prk_steps = false;          // PNDMScheduler: PLMS steps only (Stable Diffusion's)
  int64_t steps_offset = 0;
  std::string timestep_spacing = "leading";  // leading | trailing | linspace
  bool timestep_spacing_given = false;       // (DPMSolverMultistepScheduler's default: linspace)
  // DPMSolverMultistepScheduler (diffusion/dpm_solver.h)
  int64_t solver_order = 2;                    // 1, 2 or 3
  std::string algorithm_type = "dpmsolver++";  // dpmsolver++ | dpmsolver
  std::string solver_type = "midpoint";        // midpoint | heun (UniPC: bh1 | bh2)
  bool solver_type_given = false;              // (UniPCMultistepScheduler's default: bh2)
  // UniPCMultistepScheduler (diffusion/unipc.h): the data prediction (else the noise's), and the
  // steps whose corrector is skipped
  bool predict_x0 = true;
  std::vector<int64_t> disable_corrector;
  bool lower_order_final = true, euler_at_final = false;
  std::string final_sigmas_type = "zero";  // zero | sigma_min
  double lambda_min_clipped = -INFINITY;
  // Euler(Ancestral)DiscreteScheduler (diffusion/euler.h)
  std::string interpolation_type = "linear", timestep_type = "discrete";
  // DPM-Solver's, Euler's and Heun's use_karras_sigmas / use_exponential_sigmas
  // (diffusion/sigma_schedules.h), and Euler's sigma_min / sigma_max for them (NaN: null, the
  // table's)
  bool karras_sigmas = false, exponential_sigmas = false;
  double sigma_min = NAN, sigma_max = NAN;
  // DPM-Solver's and Euler's other sigma schedules that are set: refused when sampling
  std::vector<std::string> unsupported_sigmas;
  std::string origin = "the scheduler config";  // where it was read (for messages)
};

// Parses scheduler_config.json text (any diffusers scheduler's keys; those listed above are read,
// others ignored). Throws naming `what` and the key for a wrong type or an unsupported value.
ScheduleConfig parse_schedule_config(const std::string& json_text, const std::string& what);

// scheduler_config.json of a DDPMScheduler with these settings (what a trained model's folder
// carries, so DDPMScheduler.from_pretrained opens it).
std::string schedule_config_json(const ScheduleConfig& c);

class NoiseSchedule {
 public:
  explicit NoiseSchedule(const ScheduleConfig& c);
  const ScheduleConfig& config() const { return c_; }
  int64_t steps() const { return c_.num_train_timesteps; }
  const std::vector<float>& betas() const { return betas_; }
  const std::vector<float>& alphas_cumprod() const { return alphas_cumprod_; }
  // Per timestep, float32 as diffusers' add_noise / get_velocity / compute_snr index them:
  std::vector<float> sqrt_alphas_cumprod() const;            // alphas_cumprod ** 0.5
  std::vector<float> sqrt_one_minus_alphas_cumprod() const;  // (1 - alphas_cumprod) ** 0.5
  // ((1 - alphas_cumprod) / alphas_cumprod) ** 0.5: the sigma table of DPM-Solver, Euler and Heun
  std::vector<float> sigmas() const;
  // diffusers' training examples' min-SNR weights: min(snr, gamma) / snr (epsilon),
  // min(snr, gamma) / (snr + 1) (v_prediction), min(snr, gamma) (sample), snr = (a / s)^2.
  std::vector<float> min_snr_weights(double gamma) const;
  // The timesteps a sampler visits for `inference_steps` (set_timesteps), largest first.
  std::vector<int64_t> inference_timesteps(int64_t inference_steps) const;

  // One reverse step on x_t (n floats) given the model output at t; `prev_t` is the next timestep
  // of inference_timesteps (or -1 after the last). DDPM adds sigma_t * noise (n floats; unused at
  // t = 0); DDIM adds eta * sigma_t * noise (DDIMScheduler.step's variance_noise; unread when
  // eta is 0, which is deterministic).
  void ddpm_step(const float* model_output, int64_t t, int64_t prev_t, const float* noise,
                 float* sample, int64_t n) const;
  void ddim_step(const float* model_output, int64_t t, int64_t prev_t, float eta,
                 const float* noise, float* sample, int64_t n) const;

 private:
  // x0 predicted from x_t and the model output, then clipped (clip_sample).
  float predict_x0(float model_output, float sample, float alpha_t, float beta_t) const;
  ScheduleConfig c_;
  std::vector<float> betas_, alphas_, alphas_cumprod_;
};

}  // namespace onyx::diffusion
