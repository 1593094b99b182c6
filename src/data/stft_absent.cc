// data/stft_absent.cc — stft_power in a build without FFTW (-DONYX_MINIMAL=ON, CMakeLists.txt):
// audio input (Whisper's features) is an error that says so.
#include "data/stft.h"
#include "onyx/error.h"

namespace onyx::data {

std::vector<double> stft_power(const std::vector<double>&, const std::vector<double>&, int64_t,
                               int64_t) {
  throw Error(
      "audio features need FFTW, which this minimal build (-DONYX_MINIMAL=ON) leaves out; "
      "use a full build for speech models");
}

}  // namespace onyx::data
