// diffusion/euler.h — diffusers' EulerDiscreteScheduler and EulerAncestralDiscreteScheduler (Karras
// et al. 2022's Euler step on sigma = sqrt((1 − ᾱ) / ᾱ); the ancestral one adds fresh noise each
// step) as their set_timesteps, init_noise_sigma, scale_model_input and step compute. Their
// timesteps are float32 — fractional with linspace spacing, their default — so the UNet is fed a
// float timestep (sampler.cc: the sampling graph's timestep input only ever feeds a cast to float).
// Karras and exponential sigmas (use_karras_sigmas / use_exponential_sigmas, with sigma_min /
// sigma_max; the ancestral scheduler has no such keys) are taken; beta sigmas, log-linear
// interpolation, continuous timesteps and s_churn are refused when sampling.
#pragma once
#include <cstdint>
#include <vector>

#include "diffusion/noise_schedule.h"

namespace onyx::diffusion {

class EulerSampler {
 public:
  EulerSampler(const NoiseSchedule& schedule, int64_t steps, bool ancestral);
  const std::vector<float>& timesteps() const { return timesteps_; }
  // The initial noise's scale: the largest sigma, or sqrt(sigma_max² + 1) with leading spacing.
  float init_noise_sigma() const;
  // scale_model_input: x / sqrt(sigma² + 1) at step i, into out (n floats).
  void scale_input(int64_t i, const float* x, float* out, int64_t n) const;
  // One step i on x given the model's output on the scaled input; `noise` (n floats) is the
  // ancestral step's fresh noise (unread by the plain Euler step).
  void step(int64_t i, const float* model_output, const float* noise, float* x, int64_t n) const;

 private:
  ScheduleConfig c_;
  bool ancestral_;
  std::vector<float> timesteps_, sigmas_;  // sigmas_: one per timestep, and the final one
};

// diffusers' HeunDiscreteScheduler (Karras et al. 2022's second-order Heun step): every step but
// the last calls the denoiser twice — at sigma (an Euler step) and at the next sigma (the
// derivatives averaged) —, so its timesteps are 2k - 1 (every one after the first twice), float32
// as Euler's; Karras and exponential sigmas taken, beta sigmas refused; clip_sample only where the
// config says so.
class HeunSampler {
 public:
  HeunSampler(const NoiseSchedule& schedule, int64_t steps);
  const std::vector<float>& timesteps() const { return timesteps_; }
  float init_noise_sigma() const;
  void scale_input(int64_t i, const float* x, float* out, int64_t n) const;
  // Denoiser call i's step on x: the first-order half keeps the derivative and the sample, the
  // second-order half finishes from them.
  void step(int64_t i, const float* model_output, float* x, int64_t n);

 private:
  ScheduleConfig c_;
  std::vector<float> timesteps_, sigmas_;   // sigmas_: 2k, the last 0
  std::vector<float> derivative_, sample_;  // between the two halves of a step
  float dt_ = 0;
};

// diffusers' LMSDiscreteScheduler (the linear multistep method on Euler's sigmas): each step
// moves x by the last four derivatives (x − x0) / sigma, weighted by the integrals over
// [sigma_i, sigma_{i+1}] of their Lagrange basis polynomials (diffusers integrates them with
// scipy's quad; here exactly, they are polynomials of degree <= 3). Euler's timesteps and
// scaling; Karras and exponential sigmas taken, beta sigmas refused.
class LmsSampler {
 public:
  LmsSampler(const NoiseSchedule& schedule, int64_t steps);
  const std::vector<float>& timesteps() const { return timesteps_; }
  float init_noise_sigma() const;
  void scale_input(int64_t i, const float* x, float* out, int64_t n) const;
  void step(int64_t i, const float* model_output, float* x, int64_t n);

 private:
  // get_lms_coefficient(order, i, k)
  double coefficient(int64_t order, int64_t i, int64_t k) const;
  ScheduleConfig c_;
  std::vector<float> timesteps_, sigmas_;        // sigmas_: one per timestep, and 0
  std::vector<std::vector<float>> derivatives_;  // the last four, newest last
};

}  // namespace onyx::diffusion
