// diffusion/unipc.h — diffusers' UniPCMultistepScheduler (UniPC, Zhao et al. 2023: a unified
// predictor-corrector; each step first corrects the sample just reached with the new model
// output (UniC), then predicts the next one (UniP), both multistep of the orders the config
// gives), as its set_timesteps and step compute. Its defaults: solver_order 2, the data
// prediction (predict_x0), solver_type bh2, a first-order last step, linspace timesteps, final
// sigma zero; use_karras_sigmas / use_exponential_sigmas; disable_corrector. The timesteps and
// sigmas are DPM-Solver's (dpm_solver.h: multistep_schedule). solver_p, thresholding, the beta /
// flow sigmas are refused.
#pragma once
#include <cstdint>
#include <vector>

#include "diffusion/dpm_solver.h"
#include "diffusion/noise_schedule.h"

namespace onyx::diffusion {

class UniPc {
 public:
  UniPc(const NoiseSchedule& schedule, int64_t steps);
  const std::vector<int64_t>& timesteps() const { return timesteps_; }
  // One step on the sample x (n floats) given the model's output at timesteps()[index]: x
  // corrected with it (after the first step), then moved to the next timestep.
  void step(const float* model_output, float* x, int64_t n);

 private:
  using Point = SigmaPoint;
  // A step's scalars: B_h, h·phi_1 (expm1 of -h or h), the rk ratios, and the rhos (for the
  // differences D1 then, in the corrector, the new output's difference last)
  struct Coefficients {
    float B_h = 0, h_phi_1 = 0;
    std::vector<float> rks, rhos;
  };
  Point point(int64_t i) const { return sigma_point(sigmas_.at(i)); }
  Coefficients coefficients(int64_t t, int64_t s0, int64_t first_older, int64_t order,
                            bool corrector) const;
  void convert(const float* model_output, const float* x, float* out, int64_t n) const;
  // x_t = A·x − B·m0 − C·(Σ rho_k·D1_k [+ rho_last·(model_t − m0)]) from `x` into `out`
  void update(const Coefficients& k, const Point& t, const Point& s0, const float* x,
              const std::vector<const float*>& older, const float* m0, const float* model_t,
              float* out, int64_t n) const;

  ScheduleConfig c_;
  std::vector<int64_t> timesteps_;
  std::vector<float> sigmas_;                // one per timestep, and the final one
  std::vector<std::vector<float>> outputs_;  // the converted outputs, newest last
  std::vector<float> last_sample_;
  int64_t index_ = 0, lower_order_nums_ = 0, this_order_ = 0;
};

}  // namespace onyx::diffusion
