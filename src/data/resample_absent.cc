// data/resample_absent.cc — resample in a build without FFmpeg's headers (-DONYX_MINIMAL=ON,
// CMakeLists.txt): audio at another rate than the model's is an error that says so.
#include "data/resample.h"
#include "onyx/error.h"

namespace onyx::data {

std::vector<float> resample(const std::vector<float>& x, int64_t from_hz, int64_t to_hz,
                            const std::string& what) {
  if (from_hz == to_hz) return x;
  throw Error(cat(what, " is sampled at ", from_hz, " Hz, the model needs ", to_hz,
                  " Hz, and this minimal build (-DONYX_MINIMAL=ON) does not resample; resample "
                  "it first, e.g. `ffmpeg -i in.wav -ar ",
                  to_hz, " out.wav`"));
}

}  // namespace onyx::data
