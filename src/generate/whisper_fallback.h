// generate/whisper_fallback.h — Whisper's temperature fallback on one 30-s window, as
// Transformers' (5.x) WhisperForConditionalGeneration.generate_with_fallback runs it: the window's
// rows are decoded at the first temperature (0: greedy, or beam search), and each row whose
// result is too repetitive (compression_ratio_threshold: the zlib compression ratio of its
// tokens' bytes) or too unlikely (logprob_threshold: the average log-probability of its tokens,
// eos included, under the processed scores) is decoded again at the next temperature
// (sampling), up to the last temperature, whose result stays. A row that is unlikely and
// probably silent (no_speech_threshold: the probability of <|nospeech|> right after
// <|startoftranscript|>, from the raw logits) is skipped: no segment, the next window starts
// after this one.
//
// Where Transformers 5.24 indexes a batch by the wrong row onyx takes each row's own value: on a
// fallback pass over some of the rows, its should_skip and (with condition_on_prev_tokens) its
// per-row "low temperature" flag are written at the row's position among the retried rows, and
// its no-speech probability is read from the full batch at that position. A beam-search
// decoding is also left at num_beams = 1 after a sampled retry in Transformers (its generation
// config keeps it); here every window starts with the configured beams.
#pragma once
#include <cmath>
#include <cstdint>
#include <optional>
#include <vector>

#include "generate/generate.h"
#include "generate/whisper_token_times.h"

namespace onyx::generate {

struct WhisperFallback {
  std::vector<double> temperatures;  // empty: the generation config's own decoding, once
  std::optional<double> compression_ratio_threshold, logprob_threshold, no_speech_threshold;
  int64_t no_speech_token_id = -1;  // <|nospeech|>: no_timestamps_token_id - 1
  bool scores_needed() const {
    return compression_ratio_threshold || logprob_threshold || no_speech_threshold;
  }
};

// Errors as Transformers' generate would give them (or fail on): a negative or non-finite
// temperature or threshold, no_speech_threshold without logprob_threshold (it is read with it)
// or without a <|nospeech|> token.
void validate_whisper_fallback(const WhisperFallback& f, int64_t vocab_size);

// One row's accepted decoding of a window.
struct WindowDecoding {
  std::vector<int64_t> tokens;  // the new tokens, the eos included when one was emitted
  double temperature = 0;       // the temperature that decoded them (0: greedy / beams)
  // the values the thresholds compare (NaN where not computed: no_speech_prob without its
  // threshold); avg_logprob is beam search's sequences_score, as Transformers compares it
  double avg_logprob = NAN, compression_ratio = NAN, no_speech_prob = NAN;
  bool skip = false;  // unlikely and silent: no segment
  // with token timestamps: each new token's time, seconds from the window's start
  std::vector<double> token_times;
};

// Token timestamps for a window's rows (whisper_token_times.h): how, and each row's frames of
// audio from the window's start (whisper_token_times' num_frames).
struct WindowTiming {
  const WhisperTokenTiming& how;
  std::vector<int64_t> num_frames;
};

// Transformers' _retrieve_compression_ratio: the tokens as little-endian integers of
// floor(log2(vocab_size) / 8) + 1 bytes each, their length over zlib's (default level).
double whisper_compression_ratio(const std::vector<int64_t>& tokens, int64_t vocab_size);

// The rows of one window: `prompts` (each row's whole decoder prompt, <|startoftranscript|> at
// sot_index[i]), `features` (rows, mel, window). `draws` counts the sampled passes so far (each
// gets its own seed, cfg.seed + draws). With `timing`, each decoding's token times, computed on
// the batch of the generate() call that decoded it (its padding, as Transformers').
std::vector<WindowDecoding> decode_window(Generator& gen,
                                          const std::vector<std::vector<int64_t>>& prompts,
                                          const std::vector<int64_t>& sot_index,
                                          const Tensor& features, const GenerationConfig& cfg,
                                          const WhisperFallback& f, GenerationStats* stats,
                                          uint64_t& draws, const WindowTiming* timing = nullptr);

}  // namespace onyx::generate
