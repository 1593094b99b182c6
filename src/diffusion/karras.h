// diffusion/karras.h — Karras et al. (2022)'s sigma schedule, as DPMSolverMultistepScheduler and
// EulerDiscreteScheduler take it with `use_karras_sigmas` (diffusers' _convert_to_karras), and the
// fractional training timestep of a sigma (diffusers' _sigma_to_t), in numpy's float64.
#pragma once
#include <cstdint>
#include <vector>

namespace onyx::diffusion {

// k sigmas from sigma_max down to sigma_min, evenly spaced in sigma^(1/7).
std::vector<double> karras_sigmas(double sigma_min, double sigma_max, int64_t k);

// The timestep whose log-sigma `sigma` is, interpolated linearly between the two neighbouring
// entries of `log_sigmas` (ascending, one per training timestep; at least two) and clamped to
// them.
double sigma_to_t(double sigma, const std::vector<float>& log_sigmas);

}  // namespace onyx::diffusion
