// data/whisper_features.cc — see whisper_features.h.
#include "data/whisper_features.h"

#include <algorithm>
#include <cmath>

#include "data/stft.h"
#include "data/wav.h"
#include "onyx/error.h"

namespace onyx::data {
namespace {

// Slaney's mel scale (linear below 1 kHz, logarithmic above), as Transformers' hertz_to_mel /
// mel_to_hertz with mel_scale "slaney".
constexpr double kMinLogHz = 1000.0, kMinLogMel = 15.0;
double hz_to_mel(double hz) {
  return hz >= kMinLogHz ? kMinLogMel + std::log(hz / kMinLogHz) * (27.0 / std::log(6.4))
                         : 3.0 * hz / 200.0;
}
double mel_to_hz(double mel) {
  return mel >= kMinLogMel ? kMinLogHz * std::exp(std::log(6.4) / 27.0 * (mel - kMinLogMel))
                           : 200.0 * mel / 3.0;
}

// numpy.linspace(start, stop, n)[i]: start + i * step, the last exactly stop.
double linspace(double start, double stop, int64_t n, int64_t i) {
  return i == n - 1 ? stop : start + (double)i * ((stop - start) / (double)(n - 1));
}

void check_config(const WhisperFeatureConfig& c) {
  ONYX_CHECK(c.feature_size > 0 && c.sampling_rate > 0 && c.hop_length > 0 && c.n_fft >= 2 &&
                 c.chunk_length > 0 && c.samples() > c.n_fft / 2,
             "Whisper features: invalid configuration (feature_size ", c.feature_size,
             ", sampling_rate ", c.sampling_rate, ", hop_length ", c.hop_length, ", n_fft ",
             c.n_fft, ", chunk_length ", c.chunk_length, ")");
}

}  // namespace

std::vector<double> whisper_mel_filters(const WhisperFeatureConfig& c) {
  check_config(c);
  const int64_t bins = c.n_fft / 2 + 1, M = c.feature_size;
  const double mel_max = hz_to_mel(c.sampling_rate / 2.0);
  std::vector<double> edges(M + 2);  // the filters' corner frequencies in Hz
  for (int64_t i = 0; i < M + 2; i++) edges[i] = mel_to_hz(linspace(0.0, mel_max, M + 2, i));
  std::vector<double> f(bins * M);
  for (int64_t k = 0; k < bins; k++) {
    const double hz = linspace(0.0, (double)(c.sampling_rate / 2), bins, k);
    for (int64_t m = 0; m < M; m++) {
      const double down = (hz - edges[m]) / (edges[m + 1] - edges[m]);
      const double up = (edges[m + 2] - hz) / (edges[m + 2] - edges[m + 1]);
      // (Slaney normalization: about constant energy per filter)
      f[k * M + m] = std::max(0.0, std::min(down, up)) * (2.0 / (edges[m + 2] - edges[m]));
    }
  }
  return f;
}

namespace {

// The log10 mel spectrogram (M, frames) of x, the audio reflect-padded by n_fft / 2 on both
// sides. The STFT runs over blocks of frames, so long audio never holds all its spectra at once.
std::vector<double> log_mel(const std::vector<double>& x, const WhisperFeatureConfig& c,
                            int64_t frames) {
  const int64_t nfft = c.n_fft, bins = nfft / 2 + 1, M = c.feature_size, block = 1000;
  std::vector<double> window(nfft);
  for (int64_t i = 0; i < nfft; i++)
    window[i] = 0.5 - 0.5 * std::cos(2.0 * M_PI * (double)i / (double)nfft);  // periodic Hann
  const std::vector<double> filters = whisper_mel_filters(c);
  std::vector<double> logmel(M * frames);
  for (int64_t t0 = 0; t0 < frames; t0 += block) {
    const int64_t T = std::min(block, frames - t0);
    const auto first = x.begin() + t0 * c.hop_length;
    const std::vector<double> part(first, first + (T - 1) * c.hop_length + nfft);
    const std::vector<double> power = stft_power(part, window, c.hop_length, T);
    for (int64_t t = 0; t < T; t++) {
      const double* p = power.data() + t * bins;
      for (int64_t m = 0; m < M; m++) {
        double s = 0;
        for (int64_t k = 0; k < bins; k++) s += filters[k * M + m] * p[k];
        logmel[m * frames + t0 + t] = std::log10(std::max(s, 1e-10));
      }
    }
  }
  return logmel;
}

// The features of `audio` zero-padded or cut to n samples: n / hop_length frames.
Tensor features_of_length(const std::vector<float>& audio, const WhisperFeatureConfig& c,
                          int64_t n) {
  check_config(c);
  const int64_t pad = c.n_fft / 2, frames = n / c.hop_length, M = c.feature_size;
  ONYX_CHECK(frames >= 1 && n > pad, "Whisper features: ", n, " samples are too few (more than ",
             pad, " needed)");
  // the audio, reflect-padded by n_fft / 2 on both sides (torch.stft's center=True)
  std::vector<double> x(n + 2 * pad, 0.0);
  const int64_t len = std::min<int64_t>(n, (int64_t)audio.size());
  for (int64_t i = 0; i < len; i++) x[pad + i] = audio[i];
  for (int64_t i = 0; i < pad; i++) {
    x[pad - 1 - i] = x[pad + 1 + i];
    x[pad + n + i] = x[pad + n - 2 - i];
  }
  // (the STFT's last frame, t = frames, is dropped)
  const std::vector<double> logmel = log_mel(x, c, frames);
  const double floor = *std::max_element(logmel.begin(), logmel.end()) - 8.0;
  Tensor out(DType::Float32, {M, frames});
  float* o = out.data<float>();
  for (int64_t i = 0; i < M * frames; i++) o[i] = (float)((std::max(logmel[i], floor) + 4.0) / 4.0);
  return out;
}

}  // namespace

Tensor whisper_input_features(const std::vector<float>& audio, const WhisperFeatureConfig& c) {
  return features_of_length(audio, c, c.samples());
}

std::vector<float> read_whole_recording(const std::string& path, const WhisperFeatureConfig& c) {
  const int64_t limit = kMaxRecordingSeconds * c.sampling_rate;
  std::vector<float> samples = read_wav_at(path, c.sampling_rate, limit + 1).samples;
  ONYX_CHECK((int64_t)samples.size() <= limit, "WAV file '", path, "' is longer than ",
             kMaxRecordingSeconds / 3600, " hours: split it");
  return samples;
}

Tensor whisper_long_input_features(const std::vector<float>& audio, const WhisperFeatureConfig& c) {
  return features_of_length(audio, c, (int64_t)audio.size());
}

}  // namespace onyx::data
