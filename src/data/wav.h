// data/wav.h — WAV files (RIFF/WAVE) as float samples, for speech data (Whisper's input features,
// data/whisper_features.h). Hand-written: the format is a few fixed headers (RIFF, fmt, data), and
// the libraries that read it (libsndfile, ...) would be a dependency for one parser.
//
// Read: PCM 8 (unsigned), 16, 24 and 32 bits, IEEE float 32 and 64 bits, WAVE_FORMAT_EXTENSIBLE
// with those subformats; any channel count, mixed to mono by averaging the channels (librosa's
// to_mono, which Transformers' audio loading uses); integer samples scaled to [-1, 1) by 2^(bits-1)
// (8-bit: (x - 128) / 128), as soundfile and librosa read them. Other encodings (A-law, mu-law,
// ADPCM), truncated or inconsistent headers: an error naming the file and what is wrong.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace onyx::data {

struct WavAudio {
  int64_t sample_rate = 0;
  int channels = 0;            // in the file (the samples are mixed to mono)
  std::vector<float> samples;  // mono, at most max_samples of them
};

// Reads `path`; at most `max_samples` frames (the rest of the file is not read); < 0: all.
WavAudio read_wav(const std::string& path, int64_t max_samples = -1);
// Reads `path` as mono samples at `rate` Hz: resampled (data/resample.h) when the file has
// another rate. At most `max_samples` of them (< 0: all): the first max_samples equal those of
// the whole file resampled; only as much of the file is read as they depend on.
WavAudio read_wav_at(const std::string& path, int64_t rate, int64_t max_samples = -1);
// The same from a file's bytes (errors name `what`): the fuzz target's way in.
WavAudio parse_wav(const std::string& bytes, const std::string& what, int64_t max_samples = -1);

}  // namespace onyx::data
