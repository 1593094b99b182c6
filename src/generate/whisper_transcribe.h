// generate/whisper_transcribe.h — Whisper's transcription with timestamps and of audio longer
// than 30 s, as Transformers' (5.x) WhisperForConditionalGeneration.generate runs it: the input
// features are decoded 30-s window by window (seek), each window's tokens split into segments at
// its timestamp pairs (<|t0|> text <|t1|><|t1|> ...); the next window starts at the last
// complete segment's end, or after the window when it ended with a lone timestamp (no speech
// after it) or had no timestamp pair. Without timestamps a window is one segment and the next
// starts after it. Every window's decoder prompt is the row's prompt, after prompt_ids when given
// — or, with condition_on_prev_tokens, after <|startofprev|> and the last max_target_positions /
// 2 - 1 tokens decoded so far (prompt_ids' text first), rows left-padded. Each window is decoded
// with the temperature fallback and its compression-ratio / log-probability / no-speech
// thresholds when they are given (whisper_fallback.h); a row decoded at a temperature of 0.5 or
// more is not conditioned on its history at the next window, and a skipped window leaves no
// segment.
#pragma once
#include <cstdint>
#include <vector>

#include "generate/generate.h"
#include "generate/whisper_fallback.h"

namespace onyx::generate {

struct WhisperSegment {
  double start = 0, end = 0;    // seconds from the start of the audio
  std::vector<int64_t> tokens;  // timestamps included
  // its window's decoding (whisper_fallback.h): the temperature that decoded it and the values
  // the thresholds compare (no_speech_prob NaN unless no_speech_threshold is set)
  double temperature = 0, avg_logprob = NAN, compression_ratio = NAN, no_speech_prob = NAN;
  // with token timestamps: each token's time, seconds from the start of the audio
  std::vector<double> token_times;
};

struct WhisperTranscript {
  std::vector<int64_t> tokens;  // the segments' tokens in order: generate()'s sequence (no eos)
  std::vector<WhisperSegment> segments;
  std::vector<double> token_times;  // the segments' token_times in order (token timestamps)
};

struct WhisperWindows {
  // the first timestamp token's id, which splits the windows' tokens into segments whether or
  // not timestamps were asked for, as in Transformers (-1: a model without timestamp tokens; a
  // window is then one segment)
  int64_t timestamp_begin = -1;
  std::vector<int64_t> prompt_ids;  // generate(prompt_ids=): <|startofprev|> and text tokens
  bool condition_on_prev_tokens = false;
  int64_t prev_sot_token_id = -1;  // <|startofprev|> (-1: none put before the history)
  WhisperFallback fallback;
  // token timestamps (off without alignment heads), and each row's frames of audio for them
  // (Transformers' num_frames: the attention mask's sum; empty: every window whole)
  WhisperTokenTiming token_timing;
  std::vector<int64_t> num_frames;
};

// `features` (B, mel, frames): rows of Whisper input features, row r's audio in its first
// frames[r] frames (the rest padding); `prompts`: each row's decoder prompt (whisper_prompts);
// `cfg` with whisper_timestamp_begin set for timestamps (else -1). The window is
// 2 * max_source_positions frames; one shorter than that is padded with zeros, as Transformers
// pads it.
std::vector<WhisperTranscript> whisper_transcribe(Generator& gen, const Tensor& features,
                                                  const std::vector<int64_t>& frames,
                                                  const std::vector<std::vector<int64_t>>& prompts,
                                                  GenerationConfig cfg, const WhisperWindows& w,
                                                  GenerationStats* stats = nullptr);

// Rows `rows` of `features` (B, mel, frames), frames [seek[i], seek[i] + count[i]) of each,
// zero-padded to `window` frames: (rows.size(), mel, window).
Tensor whisper_window(const Tensor& features, const std::vector<int64_t>& rows,
                      const std::vector<int64_t>& seek, const std::vector<int64_t>& count,
                      int64_t window);

}  // namespace onyx::generate
