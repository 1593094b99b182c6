// diffusion/karras.cc — see karras.h. Formulas from diffusers 0.42's scheduling_euler_discrete.py
// (_convert_to_karras, _sigma_to_t): numpy's float64 arithmetic on the float32 log-sigma table.
#include "diffusion/karras.h"

#include <algorithm>
#include <cmath>

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
