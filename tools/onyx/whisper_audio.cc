// whisper_audio.cc — see whisper_audio.h.
#include "whisper_audio.h"

#include <algorithm>
#include <cstring>

#include "data/whisper_features.h"
#include "onyx/error.h"

namespace onyx::cli {

WhisperAudio read_whisper_audio(const std::string& file, const models::HfConfig& c) {
  data::WhisperFeatureConfig fc;
  fc.feature_size = c.s2s.num_mel_bins;
  const int64_t window = 2 * c.s2s.max_source_positions;
  ONYX_CHECK(window % (fc.sampling_rate / fc.hop_length) == 0, "generate: --audio needs ",
             "max_source_positions a multiple of 50 (whole seconds of audio); the model has ",
             c.s2s.max_source_positions, "; give --encoder_inputs instead");
  fc.chunk_length = window / (fc.sampling_rate / fc.hop_length);
  const std::vector<float> samples = data::read_whole_recording(file, fc);
  WhisperAudio w;
  w.window = window;
  if ((int64_t)samples.size() <= fc.samples()) {
    w.features = data::whisper_input_features(samples, fc);
  } else {
    // (the pipeline's truncation=False: the whole recording, normalized to its own maximum)
    w.features = data::whisper_long_input_features(samples, fc);
  }
  w.frames = w.features.dim(1);
  w.sound_frames = ((int64_t)samples.size() + fc.hop_length - 1) / fc.hop_length;
  return w;
}

Tensor stack_whisper_windows(const std::vector<WhisperAudio>& audio) {
  ONYX_CHECK(!audio.empty(), "generate: no audio");
  const int64_t mel = audio[0].features.dim(0), window = audio[0].window;
  Tensor all = Tensor::zeros(DType::Float32, {(int64_t)audio.size(), mel, window});
  for (size_t i = 0; i < audio.size(); i++) {
    const Tensor& f = audio[i].features;
    const int64_t n = std::min(window, f.dim(1));
    for (int64_t m = 0; m < mel; m++)
      std::memcpy(all.data<float>() + ((int64_t)i * mel + m) * window,
                  f.data<float>() + m * f.dim(1), (size_t)n * sizeof(float));
  }
  return all;
}

namespace {

// Files [first, last) as one batch of whisper_transcribe: their features (frames padded to the
// longest) and frame counts.
std::vector<FileTranscript> transcribe_batch(generate::Generator& gen,
                                             generate::GenerationConfig cfg,
                                             const generate::WhisperPromptConfig& whisper,
                                             int64_t start, const std::vector<WhisperAudio>& audio,
                                             size_t first, size_t last, const TranscribeOptions& o,
                                             generate::GenerationStats* stats) {
  const int64_t B = (int64_t)(last - first), mel = audio[first].features.dim(0);
  int64_t longest = 0;
  bool long_form = false;
  for (size_t i = first; i < last; i++) {
    longest = std::max(longest, audio[i].frames);
    long_form |= audio[i].long_form();
  }
  Tensor features = Tensor::zeros(DType::Float32, {B, mel, longest});
  std::vector<int64_t> frames, rows, seek((size_t)B, 0), count;
  for (int64_t r = 0; r < B; r++) {
    const WhisperAudio& a = audio[first + (size_t)r];
    for (int64_t m = 0; m < mel; m++)
      std::memcpy(features.data<float>() + (r * mel + m) * longest,
                  a.features.data<float>() + m * a.frames, (size_t)a.frames * sizeof(float));
    frames.push_back(a.frames);
    rows.push_back(r);
    count.push_back(std::min(a.frames, a.window));
  }
  const bool timestamps = o.timestamps || long_form;
  const int64_t window = audio[first].window;
  auto prompts = generate::whisper_prompts(whisper, start, o.language, o.task, timestamps, B, [&] {
    // Transformers' detect_language reads the first window
    const Tensor first_window = generate::whisper_window(features, rows, seek, count, window);
    return generate::detect_whisper_languages(gen, whisper, start,
                                              {{"input_features", first_window}});
  });
  generate::WhisperWindows w;
  w.timestamp_begin = whisper.no_timestamps_token_id >= 0 ? whisper.no_timestamps_token_id + 1 : -1;
  w.prompt_ids = o.previous;
  w.condition_on_prev_tokens = o.condition_on_prev_tokens;
  w.fallback = o.fallback;
  w.token_timing = o.token_timing;
  for (size_t i = first; i < last && w.token_timing.enabled(); i++)
    if (audio[i].sound_frames >= 0) w.num_frames.push_back(audio[i].sound_frames);
  if ((int64_t)w.num_frames.size() != B) w.num_frames.clear();  // (features given: no crop)
  // <|startofprev|>: the config's, else (as Transformers) the second-last suppressed token
  w.prev_sot_token_id = whisper.prev_sot_token_id >= 0 ? whisper.prev_sot_token_id
                        : cfg.suppress_tokens.size() >= 2
                            ? cfg.suppress_tokens[cfg.suppress_tokens.size() - 2]
                            : -1;
  cfg.whisper_timestamp_begin = timestamps ? w.timestamp_begin : -1;
  cfg.max_initial_timestamp_index = whisper.max_initial_timestamp_index;
  const auto res = generate::whisper_transcribe(gen, features, frames, prompts, cfg, w, stats);
  std::vector<FileTranscript> out;
  for (int64_t r = 0; r < B; r++) {
    std::vector<int64_t> opening = o.previous;  // the first window's prompt
    opening.insert(opening.end(), prompts[(size_t)r].begin(), prompts[(size_t)r].end());
    out.push_back({opening, res[(size_t)r]});
  }
  return out;
}

}  // namespace

std::vector<FileTranscript> transcribe_files(generate::Generator& gen,
                                             const generate::GenerationConfig& cfg,
                                             const generate::WhisperPromptConfig& whisper,
                                             int64_t start, const std::vector<WhisperAudio>& audio,
                                             const TranscribeOptions& o,
                                             generate::GenerationStats* stats) {
  std::vector<FileTranscript> out;
  for (size_t first = 0; first < audio.size();) {
    size_t last = first + 1;  // a long file alone; else the run of short ones, batch_size at most
    if (!audio[first].long_form())
      while (last < audio.size() && !audio[last].long_form() &&
             (int64_t)(last - first) < o.batch_size)
        last++;
    auto part = transcribe_batch(gen, cfg, whisper, start, audio, first, last, o, stats);
    out.insert(out.end(), part.begin(), part.end());
    first = last;
  }
  return out;
}

}  // namespace onyx::cli
