// data/stft.h — the short-time power spectrum Whisper's input features are made of.
#pragma once
#include <cstdint>
#include <vector>

namespace onyx::data {

// |FFT(x[t·hop .. t·hop + n) · window)|² for t = 0 .. frames-1, n = window.size(): frames rows of
// n/2 + 1 bins, row-major. x must hold (frames - 1)·hop + n samples. FFTW (data/stft.cc); a build
// without it (-DONYX_MINIMAL=ON) has data/stft_absent.cc, which says so.
std::vector<double> stft_power(const std::vector<double>& x, const std::vector<double>& window,
                               int64_t hop, int64_t frames);

}  // namespace onyx::data
