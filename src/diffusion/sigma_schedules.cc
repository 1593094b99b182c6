// diffusion/sigma_schedules.cc — see sigma_schedules.h. Formulas from diffusers 0.42's
// scheduling_euler_discrete.py (_convert_to_karras, _convert_to_exponential, _sigma_to_t): numpy's
// float64 arithmetic on the float32 log-sigma table.
#include "diffusion/sigma_schedules.h"

#include <algorithm>
#include <cmath>

#include "onyx/error.h"

namespace onyx::diffusion {

std::vector<double> karras_sigmas(double sigma_min, double sigma_max, int64_t k) {
  const double rho = 7.0;
  const double lo = std::pow(sigma_min, 1 / rho), hi = std::pow(sigma_max, 1 / rho);
  std::vector<double> s;
  for (int64_t i = 0; i < k; ++i) {
    // np.linspace(0, 1, k): i * (1 / (k - 1)), the last exactly 1
    const double ramp = k == 1 ? 0.0 : i == k - 1 ? 1.0 : (double)i * (1.0 / (double)(k - 1));
    s.push_back(std::pow(hi + ramp * (lo - hi), rho));
  }
  return s;
}

std::vector<double> exponential_sigmas(double sigma_min, double sigma_max, int64_t k) {
  // np.exp(np.linspace(log(sigma_max), log(sigma_min), k))
  const double a = std::log(sigma_max), b = std::log(sigma_min);
  std::vector<double> s;
  for (int64_t i = 0; i < k; ++i) {
    const double step = k == 1 ? 0.0 : (b - a) / (double)(k - 1);
    s.push_back(std::exp(k > 1 && i == k - 1 ? b : (double)i * step + a));
  }
  return s;
}

std::vector<double> converted_sigmas(const ScheduleConfig& c, double sigma_min, double sigma_max,
                                     int64_t k) {
  ONYX_CHECK(!(c.karras_sigmas && c.exponential_sigmas), c.origin,
             ": use_karras_sigmas and use_exponential_sigmas are both set; choose one");
  if (c.karras_sigmas) return karras_sigmas(sigma_min, sigma_max, k);
  if (c.exponential_sigmas) return exponential_sigmas(sigma_min, sigma_max, k);
  return {};
}

std::vector<double> sigma_timesteps(const std::vector<double>& sigmas,
                                    const std::vector<float>& table_sigmas) {
  std::vector<float> log_sigmas;
  for (float s : table_sigmas) log_sigmas.push_back(std::log(s));
  std::vector<double> t;
  for (double s : sigmas) t.push_back(sigma_to_t(s, log_sigmas));
  return t;
}

double sigma_to_t(double sigma, const std::vector<float>& log_sigmas) {
  const double log_sigma = std::log(std::max(sigma, 1e-10));
  const int64_t n = (int64_t)log_sigmas.size();
  // the last index whose log-sigma is <= log_sigma (0 if none), at most n - 2
  int64_t low = 0;
  for (int64_t i = 0; i < n; ++i)
    if (log_sigma - (double)log_sigmas[i] >= 0) low = i;
  low = std::min(low, n - 2);
  const double lo = log_sigmas[low], hi = log_sigmas[low + 1];
  const double w = std::clamp((lo - log_sigma) / (lo - hi), 0.0, 1.0);
  return (1 - w) * (double)low + w * (double)(low + 1);
}

}  // namespace onyx::diffusion
