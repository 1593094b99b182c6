// whisper_fallback.cc — see whisper_fallback.h.
#include "generate/whisper_fallback.h"

#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <numeric>

#include "onyx/error.h"

namespace onyx::generate {
namespace {

// Rows `rows` of `t` (rows, ...) as one tensor.
Tensor take_rows(const Tensor& t, const std::vector<size_t>& rows) {
  Shape shape = t.shape();
  const int64_t row = t.numel() / shape[0];
  shape[0] = (int64_t)rows.size();
  Tensor out(DType::Float32, shape);
  for (size_t i = 0; i < rows.size(); i++)
    std::memcpy(out.data<float>() + (int64_t)i * row, t.data<float>() + (int64_t)rows[i] * row,
                (size_t)row * sizeof(float));
  return out;
}

template <class T>
std::vector<T> take(const std::vector<T>& v, const std::vector<size_t>& rows) {
  std::vector<T> out;
  for (size_t r : rows) out.push_back(v[r]);
  return out;
}

// Transformers' WhisperNoSpeechDetection: each row's probability of <|nospeech|> from the raw
// logits right after its <|startoftranscript|> — the first pass's prefill logits where that token
// ends the prompt, else one more prefill over the prompt up to it.
std::vector<double> no_speech_probs(Generator& gen,
                                    const std::vector<std::vector<int64_t>>& prompts,
                                    const std::vector<int64_t>& sot_index, const Tensor& features,
                                    const GenerationConfig& cfg, const GenerationScores& first,
                                    int64_t token) {
  const int64_t V = gen.config().vocab_size;
  std::vector<double> out(prompts.size());
  std::vector<size_t> inner;  // rows whose prompt goes on after <|startoftranscript|>
  for (size_t i = 0; i < prompts.size(); i++) {
    if (sot_index[i] + 1 < (int64_t)prompts[i].size())
      inner.push_back(i);
    else
      out[i] =
          std::exp(log_softmax_at(first.first_logits.data<float>() + (int64_t)i * V, V, token));
  }
  if (inner.empty()) return out;
  std::vector<std::vector<int64_t>> heads;
  for (size_t i : inner)
    heads.emplace_back(prompts[i].begin(), prompts[i].begin() + sot_index[i] + 1);
  GenerationConfig one = cfg;
  one.max_new_tokens = 1;
  one.num_beams = 1;
  one.do_sample = false;
  GenerationScores sc;
  gen.generate(heads, one, nullptr, {{"input_features", take_rows(features, inner)}}, &sc);
  for (size_t j = 0; j < inner.size(); j++)
    out[inner[j]] =
        std::exp(log_softmax_at(sc.first_logits.data<float>() + (int64_t)j * V, V, token));
  return out;
}

// The configuration of pass `k`: Transformers sets do_sample (temperature > 0), the temperature
// (1 when greedy) and, when sampling, one beam.
GenerationConfig pass_config(const GenerationConfig& cfg, const WhisperFallback& f, size_t k,
                             uint64_t& draws) {
  GenerationConfig c = cfg;
  if (!f.temperatures.empty()) {
    const double t = f.temperatures[k];
    c.do_sample = t > 0;
    c.temperature = c.do_sample ? t : 1.0;
    if (c.do_sample) c.num_beams = 1;
  }
  if (c.do_sample) c.seed = cfg.seed + draws++;
  return c;
}

}  // namespace

void validate_whisper_fallback(const WhisperFallback& f, int64_t vocab_size) {
  for (double t : f.temperatures)
    ONYX_CHECK(std::isfinite(t) && t >= 0, "whisper: every temperature must be >= 0, got ", t);
  auto finite = [](const std::optional<double>& v, const char* name) {
    ONYX_CHECK(!v || std::isfinite(*v), "whisper: ", name, " must be a finite number, got ", *v);
  };
  finite(f.compression_ratio_threshold, "compression_ratio_threshold");
  finite(f.logprob_threshold, "logprob_threshold");
  finite(f.no_speech_threshold, "no_speech_threshold");
  if (f.no_speech_threshold) {
    ONYX_CHECK(f.logprob_threshold.has_value(),
               "whisper: no_speech_threshold skips a window only when its average log-probability "
               "is also below logprob_threshold: give logprob_threshold too (-1.0 is usual)");
    ONYX_CHECK(f.no_speech_token_id >= 0 && f.no_speech_token_id < vocab_size,
               "whisper: no_speech_threshold needs the model's <|nospeech|> token "
               "(no_timestamps_token_id - 1 of generation_config.json), and it has none");
  }
}

double whisper_compression_ratio(const std::vector<int64_t>& tokens, int64_t vocab_size) {
  const int width = (int)(std::log2((double)vocab_size) / 8) + 1;
  std::vector<unsigned char> raw;
  raw.reserve(tokens.size() * (size_t)width);
  for (int64_t t : tokens)
    for (int b = 0; b < width; b++) raw.push_back((unsigned char)((uint64_t)t >> (8 * b)));
  uLongf packed_len = compressBound((uLong)raw.size());
  std::vector<unsigned char> packed(packed_len);
  ONYX_CHECK(compress2(packed.data(), &packed_len, raw.data(), (uLong)raw.size(),
                       Z_DEFAULT_COMPRESSION) == Z_OK,
             "whisper: zlib could not compress ", raw.size(), " bytes");
  return (double)raw.size() / (double)packed_len;
}

std::vector<WindowDecoding> decode_window(Generator& gen,
                                          const std::vector<std::vector<int64_t>>& prompts,
                                          const std::vector<int64_t>& sot_index,
                                          const Tensor& features, const GenerationConfig& cfg,
                                          const WhisperFallback& f, GenerationStats* stats,
                                          uint64_t& draws, const WindowTiming* timing) {
  const int64_t V = gen.config().vocab_size;
  std::vector<WindowDecoding> out(prompts.size());
  std::vector<size_t> pending(prompts.size());
  std::iota(pending.begin(), pending.end(), 0);
  std::vector<double> no_speech(prompts.size(), NAN);
  const size_t passes = std::max<size_t>(1, f.temperatures.size());
  for (size_t k = 0; k < passes && !pending.empty(); k++) {
    const GenerationConfig c = pass_config(cfg, f, k, draws);
    GenerationScores sc;
    // (the first pass decodes every row: the window's features as they are)
    const Tensor rows = k == 0 ? features : take_rows(features, pending);
    const auto res =
        gen.generate(take(prompts, pending), c, stats, {{"input_features", rows}}, &sc);
    if (k == 0 && f.no_speech_threshold && sc.first_logits.defined())
      no_speech = no_speech_probs(gen, prompts, sot_index, features, c, sc, f.no_speech_token_id);
    std::vector<std::vector<double>> times;
    if (timing)
      times = whisper_token_times(gen, take(prompts, pending), res, rows,
                                  take(timing->num_frames, pending), padding_token(c), timing->how);
    std::vector<size_t> retry;
    for (size_t j = 0; j < pending.size(); j++) {
      WindowDecoding& d = out[pending[j]];
      d.tokens = res[j];
      d.temperature = c.do_sample ? c.temperature : 0.0;
      d.compression_ratio = whisper_compression_ratio(d.tokens, V);
      d.avg_logprob = c.num_beams > 1 ? sc.sum_logprobs[j]
                      : sc.counted[j] ? sc.sum_logprobs[j] / (double)sc.counted[j]
                                      : NAN;
      d.no_speech_prob = no_speech[pending[j]];
      if (timing) d.token_times = times[j];
      const bool unlikely = f.logprob_threshold && d.avg_logprob < *f.logprob_threshold;
      d.skip = f.no_speech_threshold && unlikely && d.no_speech_prob > *f.no_speech_threshold;
      const bool repetitive =
          f.compression_ratio_threshold && d.compression_ratio > *f.compression_ratio_threshold;
      if (!d.skip && (repetitive || unlikely)) retry.push_back(pending[j]);
    }
    pending = std::move(retry);
  }
  return out;
}

}  // namespace onyx::generate
