// diffusion/dpm_solver.h — diffusers' DPMSolverMultistepScheduler (DPM-Solver++ and DPM-Solver,
// Lu et al. 2022: multistep solvers of orders 1-3, midpoint or Heun second-order terms) as its
// set_timesteps and step compute, for sampling in 20-25 steps what DDIM needs 50 for. Its
// defaults are Stable Diffusion's usual "DPM++ 2M": dpmsolver++, order 2, midpoint, a first-order
// last step (final_sigmas_type zero), linspace timesteps; use_karras_sigmas gives "DPM++ 2M
// Karras" (diffusion/sigma_schedules.h); the stochastic variants sde-dpmsolver++ ("DPM++ 2M SDE")
// and sde-dpmsolver add fresh noise each step. The exponential / beta / Lu sigma schedules are
// refused when sampling.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "diffusion/noise_schedule.h"

namespace onyx::diffusion {

// The timesteps and sigmas (one per timestep, then the final one) set_timesteps gives in
// DPMSolverMultistepScheduler and (`unipc`) UniPCMultistepScheduler, which differ only in that
// UniPC has no lambda_min_clipped and always rounds Karras sigmas' timesteps.
struct MultistepSchedule {
  std::vector<int64_t> timesteps;
  std::vector<float> sigmas;
};
MultistepSchedule multistep_schedule(const NoiseSchedule& schedule, int64_t steps, bool unipc);

// One sigma's (alpha_t, sigma_t, lambda_t) as both schedulers' _sigma_to_alpha_sigma_t and
// log(alpha_t) - log(sigma_t) give them: float32, as diffusers' 0-d tensors.
struct SigmaPoint {
  float alpha, sigma, lambda;
};
SigmaPoint sigma_point(float sigma);
// convert_model_output of both: the model's output m at point p turned into the data prediction
// x0 (`data`) or the noise prediction, for prediction_type epsilon, sample or v_prediction.
void convert_model_output(const std::string& prediction_type, bool data, const SigmaPoint& p,
                          const float* m, const float* x, float* out, int64_t n);

class DpmSolver {
 public:
  // The scheduler of `schedule`'s config after set_timesteps(steps); errors name what is not
  // built.
  DpmSolver(const NoiseSchedule& schedule, int64_t steps);
  const std::vector<int64_t>& timesteps() const { return timesteps_; }
  // One step on the sample x (n floats) given the model's output at timesteps()[step_index()]:
  // the output converted to the data (dpmsolver++) or noise (dpmsolver) prediction, kept for the
  // next steps' higher-order terms, and x moved to the next timestep.
  // The SDE variants (sde-dpmsolver++, sde-dpmsolver) add `noise` (n standard normal draws, one
  // set per step) with the step's weight; the others take nullptr.
  void step(const float* model_output, const float* noise, float* x, int64_t n);
  int64_t step_index() const { return index_; }
  bool sde() const { return c_.algorithm_type.starts_with("sde-"); }

 private:
  using Point = SigmaPoint;
  Point point(int64_t i) const { return sigma_point(sigmas_.at(i)); }
  void convert(const float* model_output, const float* x, float* out, int64_t n) const;
  void first_order(const float* m0, const float* noise, float* x, int64_t n) const;
  void second_order(const float* noise, float* x, int64_t n) const;
  void third_order(const float* noise, float* x, int64_t n) const;

  ScheduleConfig c_;
  std::vector<int64_t> timesteps_;
  std::vector<float> sigmas_;                // one per timestep, and the final one
  std::vector<std::vector<float>> outputs_;  // the converted outputs, newest last
  int64_t index_ = 0, lower_order_nums_ = 0;
};

}  // namespace onyx::diffusion
