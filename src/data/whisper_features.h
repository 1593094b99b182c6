// data/whisper_features.h — Whisper's log-mel input features as Transformers'
// WhisperFeatureExtractor computes them (issue #40): the audio zero-padded or cut to chunk_length
// seconds; a centered STFT (reflect padding of n_fft / 2, periodic Hann window of n_fft, hop
// hop_length) whose last frame is dropped; the power spectrum through a Slaney-style mel filter
// bank (Transformers' mel_filter_bank: norm and scale "slaney", 0 to sampling_rate / 2 Hz);
// log10 of max(mel, 1e-10); every value raised to at least the maximum minus 8; (x + 4) / 4.
// Computed in double precision (the FFT by FFTW: Debian's libfftw3, a well-kept FFT, instead of
// one of our own) and returned as float32: within ~1e-6 of Transformers' float32 torch path.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "onyx/tensor.h"

namespace onyx::data {

struct WhisperFeatureConfig {
  int64_t feature_size = 80;  // mel bins (80; 128 for large-v3)
  int64_t sampling_rate = 16000;
  int64_t hop_length = 160;
  int64_t n_fft = 400;
  int64_t chunk_length = 30;  // seconds
  int64_t samples() const { return chunk_length * sampling_rate; }
  int64_t frames() const { return samples() / hop_length; }
};

// The (feature_size, frames) features of `audio` (mono, at config.sampling_rate; longer audio is
// cut to chunk_length seconds, as the extractor's truncation).
Tensor whisper_input_features(const std::vector<float>& audio, const WhisperFeatureConfig& config);
// The features of all of `audio` (long-form transcription: the extractor's truncation=False,
// padding="longest" on one input): audio.size() / hop_length frames, clamped to the maximum of
// the whole recording less 8.
Tensor whisper_long_input_features(const std::vector<float>& audio,
                                   const WhisperFeatureConfig& config);

// Long-form input: a WAV file's mono samples at config.sampling_rate, all of them (resampled as
// data/resample.h does); a recording over kMaxRecordingSeconds (its features are held in memory)
// is an error saying to split it.
constexpr int64_t kMaxRecordingSeconds = 2 * 3600;
std::vector<float> read_whole_recording(const std::string& path,
                                        const WhisperFeatureConfig& config);

// The (n_fft / 2 + 1, feature_size) mel filter bank (Transformers' mel_filter_bank with Whisper's
// arguments), in double precision.
std::vector<double> whisper_mel_filters(const WhisperFeatureConfig& config);

}  // namespace onyx::data
