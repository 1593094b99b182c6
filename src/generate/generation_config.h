// generate/generation_config.h — what generate() is asked to do: Transformers' GenerationConfig
// fields onyx implements, read from a model folder's generation_config.json (and config.json's
// token ids), and the checks Transformers' generate() makes on them, shared by those files and
// `onyx generate`'s flags.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace onyx::generate {

struct GenerationConfig {
  // New tokens per row; -1: up to max_length tokens in all (the left-padded prompt included, as
  // Transformers counts them; a prompt that long already is an error, as there).
  int64_t max_new_tokens = 20;
  int64_t max_length = -1;
  // max_new_tokens or max_length came from a file or a flag. Without: 20 new tokens, or for an
  // encoder–decoder Transformers' default max_length 20 (the decoder start token included).
  bool length_given = false;
  bool do_sample = false;    // false: greedy (argmax, first on ties, as torch.argmax)
  double temperature = 1.0;  // sampling: logits / temperature, then top-k, then top-p (HF's order)
  int64_t top_k = 50;        // 0: off
  double top_p = 1.0;        // 1: off
  uint64_t seed = 0;         // the sampling RNG (not torch's: sampled text differs from HF's)
  std::vector<int64_t> eos_token_ids;  // a row stops after emitting one of these
  int64_t pad_token_id = -1;           // fills finished rows (-1: the first eos id, else 0)
  // Transformers' logits processors, applied in its order before the temperature / top-k /
  // top-p warpers (and before greedy's argmax):
  //   repetition_penalty  RepetitionPenaltyLogitsProcessor: the logit of every token already in
  //                       the row (prompt and generated; left padding not) divided by it when
  //                       positive, multiplied when negative (1: off)
  //   no_repeat_ngram_size  NoRepeatNGramLogitsProcessor: a token that would repeat an n-gram of
  //                       the row (left padding included, as there) gets -inf (0: off)
  //   min_length          MinLengthLogitsProcessor: eos gets -inf while the row (padded prompt +
  //                       new tokens) is shorter
  //   min_new_tokens      MinNewTokensLengthLogitsProcessor: eos gets -inf before this many new
  //                       tokens
  //   forced_bos_token_id ForcedBOSTokenLogitsProcessor: the first token after a one-token
  //                       prompt is this one (-1: off)
  //   forced_eos_token_id ForcedEOSTokenLogitsProcessor: the token that reaches the maximum
  //                       length is one of these (BART's default)
  //   suppress_tokens     SuppressTokensLogitsProcessor: never generated
  //   begin_suppress_tokens  SuppressTokensAtBeginLogitsProcessor: not the first new token
  //                       (the second after a forced bos)
  // Beam search (num_beams > 1, deterministic: Transformers' _beam_search): the best of the
  // finished hypotheses, scored sum(log p) / new_tokens^length_penalty; early_stopping: "false"
  // (its heuristic: stop when the best running beam, at its current length, cannot beat the
  // worst finished one), "true" (stop once num_beams hypotheses finished) or "never".
  int64_t num_beams = 1;
  double length_penalty = 1.0;
  std::string early_stopping = "false";
  double repetition_penalty = 1.0;
  int64_t no_repeat_ngram_size = 0;
  int64_t min_length = 0;
  int64_t min_new_tokens = 0;
  int64_t forced_bos_token_id = -1;
  std::vector<int64_t> forced_eos_token_ids, suppress_tokens, begin_suppress_tokens;
  // Whisper's timestamps (WhisperTimeStampLogitsProcessor, after the processors above; -1: off):
  // <|notimestamps|> never; the first new token a timestamp, at most <|0.00|> +
  // max_initial_timestamp_index (-1: any); timestamps in pairs (after a lone one: a timestamp or
  // eos, after a pair: text), never decreasing, <|0.00|> only first; a timestamp whenever the
  // timestamps' summed probability beats every text token's. Ids >= whisper_timestamp_begin are
  // timestamps; ids below the first eos id are text.
  int64_t whisper_timestamp_begin = -1;
  int64_t max_initial_timestamp_index = -1;
  // An encoder–decoder's first decoder token (generation_config.json or config.json's
  // decoder_start_token_id; -1: none given).
  int64_t decoder_start_token_id = -1;
  int64_t cache_block = 64;  // the cache grows by this many slots at a time
};

// Reads generation_config.json (or config.json) of a model folder: eos_token_id (int or list),
// pad_token_id, do_sample, temperature, top_k, top_p, max_new_tokens, max_length,
// repetition_penalty, no_repeat_ngram_size, min_length, min_new_tokens. Keys absent keep `base`.
// A decoding option onyx does not implement (beam search, contrastive search, other logits
// processors), set to other than its default, gets a warning on stderr naming it: the text then
// differs from Transformers' generate.
GenerationConfig read_generation_config(const std::string& dir, GenerationConfig base = {});
// One generation_config.json object over `base` (`what` names it in errors; token_ids_only: a
// config.json, whose token ids only are read: eos, pad, decoder start, forced and suppressed).
// Values are typed as Transformers types them (an integer key given 1.5 or "7" is an error) and the
// result is validated.
GenerationConfig apply_generation_config_json(const nlohmann::json& j, GenerationConfig base,
                                              const std::string& what, bool token_ids_only = false);
// The checks Transformers' generate() makes on these values (strictly positive temperature when
// sampling, top_k >= 0, top_p in [0, 1], a strictly positive repetition_penalty, finite numbers,
// lengths and beams within the bounds below), shared by the files and the CLI's flags.
constexpr int64_t kMaxBeams = 1024;
constexpr int64_t kMaxGenerationLength = 1 << 20;
void validate_generation_config(const GenerationConfig& cfg, const std::string& what);
// eos / pad token ids inside the model's vocabulary.
void check_generation_token_ids(const GenerationConfig& cfg, int64_t vocab_size,
                                const std::string& what);

}  // namespace onyx::generate
