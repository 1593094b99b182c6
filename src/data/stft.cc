// data/stft.cc — see stft.h. The transform is FFTW's (Debian libfftw3-dev): exact to double
// precision for any length, which Whisper's 400-point frames need (not a power of two).
#include "data/stft.h"

#include <fftw3.h>

#include <memory>
#include <mutex>

#include "onyx/error.h"

namespace onyx::data {

namespace {
// FFTW plans are made under a lock (its planner is not thread-safe); executing one is.
std::mutex& planner_lock() {
  static std::mutex m;
  return m;
}
}  // namespace

std::vector<double> stft_power(const std::vector<double>& x, const std::vector<double>& window,
                               int64_t hop, int64_t frames) {
  const int64_t nfft = (int64_t)window.size(), bins = nfft / 2 + 1;
  ONYX_CHECK(nfft >= 2 && hop > 0 && frames >= 0 &&
                 (frames == 0 || (int64_t)x.size() >= (frames - 1) * hop + nfft),
             "STFT: ", x.size(), " samples do not hold ", frames, " frames of ", nfft, " by ", hop);
  std::vector<double> frame(nfft), power(frames * bins);
  std::unique_ptr<fftw_complex, decltype(&fftw_free)> spec(
      (fftw_complex*)fftw_malloc(sizeof(fftw_complex) * bins), &fftw_free);
  fftw_plan plan;
  {
    std::lock_guard<std::mutex> lock(planner_lock());
    plan = fftw_plan_dft_r2c_1d((int)nfft, frame.data(), spec.get(), FFTW_ESTIMATE);
  }
  ONYX_CHECK(plan, "STFT: FFTW could not plan a ", nfft, "-point transform");
  for (int64_t t = 0; t < frames; t++) {
    for (int64_t i = 0; i < nfft; i++) frame[i] = x[t * hop + i] * window[i];
    fftw_execute(plan);
    for (int64_t k = 0; k < bins; k++)
      power[t * bins + k] =
          spec.get()[k][0] * spec.get()[k][0] + spec.get()[k][1] * spec.get()[k][1];
  }
  {
    std::lock_guard<std::mutex> lock(planner_lock());
    fftw_destroy_plan(plan);
  }
  return power;
}

}  // namespace onyx::data
