// data/resample.h — audio at another sample rate, resampled by FFmpeg's libswresample with its
// default settings: what Transformers' speech-recognition pipeline does to an audio file
// (`ffmpeg -ac 1 -ar 16000`, its ffmpeg_read) and what datasets 5's Audio(sampling_rate=...)
// does (torchcodec, which resamples with the same library). onyx's output equals the ffmpeg
// command's sample for sample on mono files (tests/parity/test_whisper_features.py).
//
// libswresample is loaded on first use (dlopen of libswresample.so.5 / .so.4, FFmpeg 5.1 to 7)
// rather than linked: it pulls in libavutil, which on Debian links X11, VA-API, VDPAU and OpenCL,
// and every onyx binary and the Python wheel would carry those for an optional input conversion.
// A machine without it gets an error saying which package to install.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace onyx::data {

// `x` (mono) sampled at `from_hz`, resampled to `to_hz` (both in [100, 1,000,000]); the output
// has the length ffmpeg gives, about x.size() * to_hz / from_hz. Errors name `what`.
std::vector<float> resample(const std::vector<float>& x, int64_t from_hz, int64_t to_hz,
                            const std::string& what);

}  // namespace onyx::data
