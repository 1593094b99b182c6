// generate/whisper_token_times.h — Whisper's token-level timestamps, as Transformers' (5.x)
// WhisperForConditionalGeneration._extract_token_timestamps computes them (the method of OpenAI's
// whisper): the cross-attention probabilities of the model's alignment heads
// (generation_config.json's alignment_heads) over the window's encoder positions, for every
// generated token but the last, cropped to the row's audio (num_frames / 2 positions), each head
// normalized over the tokens (mean 0, standard deviation 1 per position), smoothed along the
// positions by a median filter (config.json's median_filter_width), averaged over the heads; a
// dynamic time warping of the tokens onto the positions then gives each token the position where
// the path first reaches it, times 0.02 s. The last token takes the time of the one before it.
//
// Transformers gathers the probabilities step by step while generating; here the decoder runs
// once more over the prompt and the generated tokens (Generator::cross_attentions), which gives
// the same probabilities. Rows of a batch are padded as Transformers pads them (after a row's
// eos, the pad token), and the padding counts in each row's normalization, as there. (Beam
// search: Transformers fills a hypothesis' steps after its end with the first beam's weights; here
// they are the pad token's — they differ only for hypotheses shorter than the longest.)
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "generate/generate.h"

namespace onyx::generate {

constexpr int64_t kWholeWindow = INT64_MAX;

struct WhisperTokenTiming {
  std::vector<std::pair<int64_t, int64_t>> alignment_heads;  // (decoder layer, head); none: off
  int64_t median_filter_width = 7;                           // odd
  bool enabled() const { return !alignment_heads.empty(); }
};

// The rows of one window as generate() decoded them: `prompts`, their new `tokens` (eos
// included when emitted), `features` (rows, mel, window) and per row the frames of audio from
// the window's start (`num_frames`: Transformers' num_frames - seek, negative where the window
// starts after the audio's end, cropping as Python's [..., :num_frames // 2] does — twice
// where every row has the same count, as Transformers; kWholeWindow: no crop). Each row's times
// of its new tokens, in seconds from the window's start.
std::vector<std::vector<double>> whisper_token_times(
    Generator& gen, const std::vector<std::vector<int64_t>>& prompts,
    const std::vector<std::vector<int64_t>>& tokens, const Tensor& features,
    const std::vector<int64_t>& num_frames, int64_t pad, const WhisperTokenTiming& timing);

// The steps above on one row's probabilities `w` (heads, n, S) of its n generated tokens but the
// last, cropped to the first `frames` positions (0 <= frames <= S): each token's time (n of
// them). Exposed for tests.
std::vector<double> alignment_times(const std::vector<float>& w, int64_t heads, int64_t n,
                                    int64_t S, int64_t frames, int64_t median_filter_width);

// Transformers' _dynamic_time_warping on `cost` (n, m) (float32 path costs, as numpy computes
// them): the text and time indices of the path from (0, 0) to (n - 1, m - 1).
std::pair<std::vector<int64_t>, std::vector<int64_t>> dynamic_time_warping(
    const std::vector<double>& cost, int64_t n, int64_t m);

}  // namespace onyx::generate
