// whisper_transcribe.cc — see whisper_transcribe.h.
#include "generate/whisper_transcribe.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "onyx/error.h"

namespace onyx::generate {
namespace {

constexpr int64_t kInputStride = 2;         // the encoder's two convolutions' strides
constexpr double kTimePrecision = 0.02;     // seconds per timestamp step
constexpr float kFeaturePrecision = 0.01f;  // seconds per feature frame (hop / rate)

// One window's new tokens (no eos) split into segments as Transformers' _retrieve_segment
// splits them; returns how many frames the next window starts after this one's.
int64_t split_segments(const std::vector<int64_t>& seq, int64_t tb, int64_t window_frames,
                       double offset, std::vector<WhisperSegment>& out) {
  const int64_t n = (int64_t)seq.size();
  auto is_ts = [&](int64_t i) { return seq[(size_t)i] >= tb; };
  const bool single_ending = n >= 2 && !is_ts(n - 2) && is_ts(n - 1);
  std::vector<int64_t> slices;  // ends of the segments: after each timestamp pair
  for (int64_t i = 0; i + 1 < n; i++)
    if (is_ts(i) && is_ts(i + 1)) slices.push_back(i + 1);
  if (slices.empty()) {  // one segment: the whole window (its last timestamp, if any, ends it)
    double end_pos = (int64_t)((float)window_frames * kFeaturePrecision / (float)kTimePrecision);
    for (int64_t i = n - 1; i >= 0; i--)
      if (is_ts(i)) {
        if (seq[(size_t)i] != tb) end_pos = (double)(seq[(size_t)i] - tb);
        break;
      }
    out.push_back({offset, offset + end_pos * kTimePrecision, seq});
    return window_frames;
  }
  if (single_ending)
    slices.push_back(n);
  else
    slices.back() += 1;  // the last pair's second timestamp stays in the last segment
  int64_t last = 0;
  for (size_t k = 0; k < slices.size(); k++) {
    std::vector<int64_t> toks(seq.begin() + last, seq.begin() + slices[k]);
    const bool is_last = k + 1 == slices.size();
    const int64_t end_tok = toks[toks.size() - (!is_last || single_ending ? 1 : 2)];
    out.push_back({offset + (double)(toks[0] - tb) * kTimePrecision,
                   offset + (double)(end_tok - tb) * kTimePrecision, std::move(toks)});
    last = slices[k];
  }
  // a lone timestamp at the end: nothing is said after it; else the unfinished speech after the
  // last pair is decoded again from that pair's time
  return single_ending ? window_frames : (seq[(size_t)last - 2] - tb) * kInputStride;
}

// The decoder prompts of one window's rows: prompt_ids then the row's prompt, or when a row is
// conditioned on its history (`conditioned`: condition_on_prev_tokens and its last decoding at a
// low temperature) and row 0 has history, as Transformers checks it, <|startofprev|>, the last
// max_target_positions / 2 - 1 tokens of the conditioned rows' history — each segment without
// the second timestamp of a closing pair — and the row's prompt.
std::vector<std::vector<int64_t>> window_prompts(
    const std::vector<int64_t>& rows, const std::vector<std::vector<int64_t>>& prompts,
    const std::vector<std::vector<std::vector<int64_t>>>& history,
    const std::vector<char>& conditioned, const WhisperWindows& w, int64_t max_pos) {
  std::vector<std::vector<int64_t>> out;
  const bool condition =
      std::find(conditioned.begin(), conditioned.end(), 1) != conditioned.end() &&
      !history[0].empty();
  for (int64_t r : rows) {
    std::vector<int64_t> p;
    if (!condition) {
      p = w.prompt_ids;
    } else {
      std::vector<int64_t> prev;
      static const std::vector<std::vector<int64_t>> kNone;
      for (const auto& toks : conditioned[(size_t)r] ? history[(size_t)r] : kNone) {
        const bool pair_end =
            w.timestamp_begin >= 0 && toks.size() > 2 && toks[toks.size() - 2] >= w.timestamp_begin;
        prev.insert(prev.end(), toks.begin(), toks.end() - (pair_end ? 1 : 0));
      }
      const size_t keep = (size_t)(max_pos / 2 - 1);
      if (prev.size() > keep) prev.erase(prev.begin(), prev.end() - (ptrdiff_t)keep);
      if (w.prev_sot_token_id >= 0) p.push_back(w.prev_sot_token_id);
      p.insert(p.end(), prev.begin(), prev.end());
    }
    p.insert(p.end(), prompts[(size_t)r].begin(), prompts[(size_t)r].end());
    out.push_back(std::move(p));
  }
  return out;
}

}  // namespace

Tensor whisper_window(const Tensor& features, const std::vector<int64_t>& rows,
                      const std::vector<int64_t>& seek, const std::vector<int64_t>& count,
                      int64_t window) {
  const int64_t mel = features.dim(1), frames = features.dim(2);
  Tensor out = Tensor::zeros(DType::Float32, {(int64_t)rows.size(), mel, window});
  for (size_t i = 0; i < rows.size(); i++) {
    const int64_t n = std::min({count[i], window, frames - seek[i]});
    for (int64_t m = 0; m < mel && n > 0; m++) {
      const float* src = features.data<float>() + (rows[i] * mel + m) * frames + seek[i];
      std::memcpy(out.data<float>() + ((int64_t)i * mel + m) * window, src,
                  (size_t)n * sizeof(float));
    }
  }
  return out;
}

std::vector<WhisperTranscript> whisper_transcribe(Generator& gen, const Tensor& features,
                                                  const std::vector<int64_t>& frames,
                                                  const std::vector<std::vector<int64_t>>& prompts,
                                                  GenerationConfig cfg, const WhisperWindows& w,
                                                  GenerationStats* stats) {
  const models::HfConfig& c = gen.config();
  const int64_t B = features.rank() == 3 ? features.dim(0) : -1;
  ONYX_CHECK(B >= 1 && (int64_t)frames.size() == B && (int64_t)prompts.size() == B,
             "whisper_transcribe: features (B, mel, frames) with B frame counts and prompts");
  for (int64_t f : frames)
    ONYX_CHECK(f >= 1 && f <= features.dim(2), "whisper_transcribe: a row of ", f,
               " frames in features of ", features.dim(2));
  ONYX_CHECK(w.num_frames.empty() || (int64_t)w.num_frames.size() == B,
             "whisper_transcribe: ", w.num_frames.size(), " token-timestamp frame counts for ", B,
             " rows");
  validate_whisper_fallback(w.fallback, c.vocab_size);
  const int64_t window = 2 * c.s2s.max_source_positions, tb = w.timestamp_begin;
  const int64_t max_pos = c.max_position_embeddings;  // max_target_positions
  std::vector<WhisperTranscript> out((size_t)B);
  std::vector<int64_t> seek((size_t)B, 0);
  const std::set<int64_t> eos(cfg.eos_token_ids.begin(), cfg.eos_token_ids.end());
  // each row's decoded tokens per segment, for condition_on_prev_tokens: prompt_ids' text first
  // (without <|startofprev|>), as Transformers' "first-segment" prompt
  std::vector<std::vector<std::vector<int64_t>>> history((size_t)B);
  std::vector<char> conditioned((size_t)B, w.condition_on_prev_tokens ? 1 : 0);
  uint64_t draws = 0;  // sampled passes so far
  if (!w.prompt_ids.empty())
    for (auto& h : history)
      h.push_back(std::vector<int64_t>(
          w.prompt_ids.begin() + (w.prompt_ids[0] == w.prev_sot_token_id ? 1 : 0),
          w.prompt_ids.end()));
  for (;;) {
    std::vector<int64_t> rows, at, count;  // the rows still being decoded, in order
    for (int64_t r = 0; r < B; r++)
      if (seek[r] < frames[r]) {
        rows.push_back(r);
        at.push_back(seek[r]);
        count.push_back(std::min(frames[r] - seek[r], window));
      }
    if (rows.empty()) break;
    const auto row_prompts = window_prompts(rows, prompts, history, conditioned, w, max_pos);
    std::vector<int64_t> sot_index;  // where each row's own prompt starts
    for (size_t i = 0; i < rows.size(); i++)
      sot_index.push_back((int64_t)(row_prompts[i].size() - prompts[(size_t)rows[i]].size()));
    WindowTiming timing{w.token_timing, {}};
    for (int64_t r : rows)  // (Transformers' num_frames - seek)
      timing.num_frames.push_back(w.num_frames.empty() ? kWholeWindow : w.num_frames[r] - seek[r]);
    const auto res = decode_window(
        gen, row_prompts, sot_index, whisper_window(features, rows, at, count, window), cfg,
        w.fallback, stats, draws, w.token_timing.enabled() ? &timing : nullptr);
    // Transformers raises max_length by the prompt's length (up to max_target_positions / 2 - 1)
    // at every window, so later windows may run longer (each window: Generator's own adjustment)
    if (cfg.max_new_tokens < 0) {
      size_t L = 0;
      for (const auto& p : row_prompts) L = std::max(L, p.size());
      cfg.max_length = std::min(cfg.max_length + std::min(max_pos / 2 - 1, (int64_t)L), max_pos);
    }
    for (size_t i = 0; i < rows.size(); i++) {
      conditioned[(size_t)rows[i]] = w.condition_on_prev_tokens && res[i].temperature < 0.5;
      if (res[i].skip) {  // unlikely and silent: the next window after this one
        seek[rows[i]] += count[i];
        continue;
      }
      std::vector<int64_t> seq = res[i].tokens;
      if (!seq.empty() && eos.count(seq.back())) seq.pop_back();
      const double offset = (double)seek[rows[i]] * kTimePrecision / kInputStride;
      std::vector<WhisperSegment>& segs = out[(size_t)rows[i]].segments;
      const size_t before = segs.size();
      if (tb >= 0) {
        // (a window whose segments end at 0.00 would be decoded again forever; the timestamp
        // rules never produce that, a model decoding without them might: it moves on)
        const int64_t advance = split_segments(seq, tb, count[i], offset, segs);
        seek[rows[i]] += advance > 0 ? advance : count[i];
      } else {
        segs.push_back({offset, offset + (double)count[i] * (double)kFeaturePrecision, seq});
        seek[rows[i]] += count[i];
      }
      size_t at_token = 0;  // the segments cover the window's tokens from its first
      for (size_t k = before; k < segs.size(); ++k) {
        if (!res[i].token_times.empty())
          for (size_t j = 0; j < segs[k].tokens.size(); j++)
            segs[k].token_times.push_back(res[i].token_times[at_token++] + offset);
        segs[k].temperature = res[i].temperature;
        segs[k].avg_logprob = res[i].avg_logprob;
        segs[k].compression_ratio = res[i].compression_ratio;
        segs[k].no_speech_prob = res[i].no_speech_prob;
        history[(size_t)rows[i]].push_back(segs[k].tokens);
      }
    }
  }
  for (WhisperTranscript& t : out)
    for (const WhisperSegment& s : t.segments) {
      t.tokens.insert(t.tokens.end(), s.tokens.begin(), s.tokens.end());
      t.token_times.insert(t.token_times.end(), s.token_times.begin(), s.token_times.end());
    }
  return out;
}

}  // namespace onyx::generate
