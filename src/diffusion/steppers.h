// diffusion/steppers.h — the sampling schedulers (DDPM, DDIM, DPM-Solver, Euler, Heun, PNDM's PLMS)
// behind one interface, for sampler.cc's loop: their timesteps, what the denoiser is fed at each
// (the timestep as int64, or float32 for the Euler schedulers' fractional ones; the sample, scaled
// by Euler's scale_model_input), the initial noise's scale, and the step. One Stepper per batch of
// images (DPM-Solver and PLMS keep the batch's last outputs).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "diffusion/noise_schedule.h"
#include "onyx/tensor.h"

namespace onyx::diffusion {

class Stepper {
 public:
  // `name`: ddpm | ddim | dpmsolver | euler | euler_ancestral | heun | lms | pndm | unipc;
  // `steps`:
  // num_inference_steps
  // (0: the pipelines' default: DDPM 1000, the others 50); `eta`: DDIM's. Errors name what is not
  // supported.
  static std::unique_ptr<Stepper> make(const std::string& name, const NoiseSchedule& schedule,
                                       int64_t steps, double eta);
  static const std::vector<std::string>& names();
  // The scheduler a pipeline folder's scheduler config names (_class_name: DDPMScheduler -> ddpm,
  // DDIMScheduler -> ddim, DPMSolverMultistepScheduler -> dpmsolver, EulerDiscreteScheduler ->
  // euler, EulerAncestralDiscreteScheduler -> euler_ancestral, HeunDiscreteScheduler -> heun,
  // LMSDiscreteScheduler -> lms, PNDMScheduler -> pndm, UniPCMultistepScheduler -> unipc; none
  // named: ddpm), as diffusers'
  // pipelines step with the folder's scheduler; one onyx does not step is an error naming it.
  static std::string of_config(const ScheduleConfig& c);
  virtual ~Stepper() = default;
  virtual int64_t steps() const = 0;
  virtual bool float_timesteps() const { return false; }
  virtual bool draws_noise() const { return false; }  // step i reads noise
  virtual float init_noise_sigma() const { return 1.0f; }
  // The denoiser's timestep input for B images at step i: int64 (B), or float32 (B).
  virtual Tensor timestep(int64_t i, int64_t B) const = 0;
  // The denoiser's sample input at step i from x (the same tensor unless the scheduler scales it).
  virtual Tensor model_input(int64_t i, const Tensor& x) const { return x; }
  // x (n floats) moved from step i's timestep to the next, given the model's output there.
  virtual void step(int64_t i, const float* model_output, const float* noise, float* x,
                    int64_t n) = 0;
};

}  // namespace onyx::diffusion
