// diffusion/sigma_schedules.h — the sigma schedules DPMSolverMultistepScheduler,
// EulerDiscreteScheduler and HeunDiscreteScheduler take instead of their table's: Karras et al.
// (2022)'s (`use_karras_sigmas`, diffusers' _convert_to_karras) and the exponential one
// (`use_exponential_sigmas`, _convert_to_exponential), and the fractional training timestep of a
// sigma (_sigma_to_t), in numpy's float64.
#pragma once
#include <cstdint>
#include <vector>

#include "diffusion/noise_schedule.h"

namespace onyx::diffusion {

// k sigmas from sigma_max down to sigma_min, evenly spaced in sigma^(1/7).
std::vector<double> karras_sigmas(double sigma_min, double sigma_max, int64_t k);
// k sigmas from sigma_max down to sigma_min, evenly spaced in log(sigma).
std::vector<double> exponential_sigmas(double sigma_min, double sigma_max, int64_t k);

// The k sigmas from sigma_max down to sigma_min of the config's use_karras_sigmas or
// use_exponential_sigmas; empty when it sets neither. Both set is an error, as diffusers has it.
std::vector<double> converted_sigmas(const ScheduleConfig& c, double sigma_min, double sigma_max,
                                     int64_t k);

// Each of `sigmas`' fractional timestep in the table `table_sigmas` (sigma_to_t over its logs).
std::vector<double> sigma_timesteps(const std::vector<double>& sigmas,
                                    const std::vector<float>& table_sigmas);

// The timestep whose log-sigma `sigma` is, interpolated linearly between the two neighbouring
// entries of `log_sigmas` (ascending, one per training timestep; at least two) and clamped to
// them.
double sigma_to_t(double sigma, const std::vector<float>& log_sigmas);

}  // namespace onyx::diffusion
