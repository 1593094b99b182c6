// generate/whisper_prompt.h — Whisper's decoder prompt as Transformers' (5.x)
// WhisperForConditionalGeneration.generate builds it (_retrieve_init_tokens): the decoder start
// token (<|startoftranscript|>), then the language token — given, from the generation config's
// forced_decoder_ids, or detected per row as the most likely language token after the start
// token —, the task token (<|transcribe|> / <|translate|>), and <|notimestamps|> (not with
// timestamps).
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "generate/generate.h"

namespace onyx::generate {

// generation_config.json's Whisper keys (config.json's forced_decoder_ids as the fallback).
struct WhisperPromptConfig {
  bool has_lang_to_id = false, has_task_to_id = false;
  std::map<std::string, int64_t> lang_to_id, task_to_id;  // "<|en|>" -> id, "transcribe" -> id
  std::optional<bool> is_multilingual;
  int64_t no_timestamps_token_id = -1;  // -1: the key is absent
  // (position, token or null): the old way of giving language and task
  std::vector<std::pair<int64_t, std::optional<int64_t>>> forced_decoder_ids;
  bool return_timestamps = false;
  int64_t max_initial_timestamp_index = -1;  // -1: the key is absent (no limit)
  int64_t prev_sot_token_id = -1;            // <|startofprev|> (-1: absent)
  bool condition_on_prev_tokens = false;
  // the temperature fallback's thresholds (whisper_fallback.h), when the file sets them
  std::optional<double> compression_ratio_threshold, logprob_threshold, no_speech_threshold;
  std::string language, task;  // the config's own ("": none)
  // token timestamps (whisper_token_times.h): generation_config.json's alignment_heads [[layer,
  // head], ...] and config.json's median_filter_width
  std::vector<std::pair<int64_t, int64_t>> alignment_heads;
  int64_t median_filter_width = 7;
  // The first timestamp token (<|0.00|>, after <|notimestamps|>), or -1 when a vocabulary of
  // `vocab_size` tokens has none.
  int64_t timestamp_begin(int64_t vocab_size) const {
    return no_timestamps_token_id >= 0 && no_timestamps_token_id + 1 < vocab_size
               ? no_timestamps_token_id + 1
               : -1;
  }
};

WhisperPromptConfig read_whisper_prompt_config(const std::string& folder);

// The token of `language`: a lang_to_id key ("<|de|>"), a code ("de") or an English name
// ("german"), case-insensitive; an error naming the accepted ones otherwise.
int64_t whisper_language_id(const WhisperPromptConfig& c, const std::string& language);

// Each of `rows` rows' decoder prompt. `language` / `task` ("": not given) override the config's,
// as generate(language=, task=) does; `timestamps`: return_timestamps (no <|notimestamps|>).
// `detect()` gives each row's language token when the prompt has none (called at most once).
// Errors as Transformers': a language or task for an English-only model or a config without
// lang_to_id / task_to_id, an unknown task, forced_decoder_ids that skip a position,
// timestamps without no_timestamps_token_id.
std::vector<std::vector<int64_t>> whisper_prompts(
    const WhisperPromptConfig& c, int64_t decoder_start_token_id, const std::string& language,
    const std::string& task, bool timestamps, int64_t rows,
    const std::function<std::vector<int64_t>()>& detect);

// Transformers' detect_language: each row's most likely language token (of lang_to_id's) after
// the start token alone — one greedy step, every other token masked, no other logits processor.
// `encoder_inputs`: one row per prompt, as Generator::generate takes them.
std::vector<int64_t> detect_whisper_languages(Generator& gen, const WhisperPromptConfig& c,
                                              int64_t decoder_start_token_id,
                                              const std::map<std::string, Tensor>& encoder_inputs);

}  // namespace onyx::generate
