// train/generate.h — text generation from a causal LM with a key/value cache, as Transformers'
// generate(): greedy decoding, sampling (temperature, top-k, top-p) or beam search, with its
// logits processors (repetition penalty, no-repeat n-grams, minimum lengths), batched prompts
// padded on the left, stopping at the end-of-sequence tokens. Beam search reorders the cache's
// rows after each step, as Transformers' reorder_cache does.
//
// The model runs as the decoder-with-past graph (models::build_hf_decoder_with_past): the prompt
// once (prefill), then one token per step whose keys and values are appended to the cache, so a
// step never re-runs the prefix. The cache is held here, per layer, as keys (B, kv_heads,
// head_dim, capacity) — transposed, as the graph multiplies by them — and values (B, kv_heads,
// capacity, head_dim), grown in blocks of `cache_block` slots; each step feeds the whole buffers
// with their unused slots masked, so the graph's input signature (and its optimized graph and
// memory plan) changes only once per block, not once per token.
#pragma once
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "models/hf_model.h"

namespace onyx::runtime {
class Session;
}

namespace onyx::train {

struct GenerationConfig {
  // New tokens per row; -1: up to max_length tokens in all (the left-padded prompt included, as
  // Transformers counts them; a prompt that long already is an error, as there).
  int64_t max_new_tokens = 20;
  int64_t max_length = -1;
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
// config.json, whose eos/pad token ids only are read). Values are typed as Transformers types
// them (an integer key given 1.5 or "7" is an error) and the result is validated.
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

struct GenerationStats {
  double prefill_seconds = 0;
  std::vector<double> step_seconds;  // one per decoded token after the first
  int64_t compiled_signatures = 0;   // optimized graphs built (prefill + one per cache block)
};

class Generator {
 public:
  // `decoder` from build_hf_decoder_with_past, weights in its initializers.
  explicit Generator(models::BuiltModel decoder);
  ~Generator();
  // A Hugging Face folder or an onyx checkpoint of one (config.json + model.safetensors); a LoRA
  // checkpoint or adapter folder (adapter_config.json) gets its adapters merged.
  static Generator from_folder(const std::string& dir);

  // New tokens per prompt (ids, any lengths >= 1): up to max_new_tokens, ending with the eos token
  // when one was emitted. Throws naming the row for an empty prompt or an id out of the vocabulary.
  std::vector<std::vector<int64_t>> generate(const std::vector<std::vector<int64_t>>& prompts,
                                             const GenerationConfig& cfg,
                                             GenerationStats* stats = nullptr);
  const models::HfConfig& config() const { return model_.config; }
  const ir::Graph& graph() const { return *graph_; }
  // Weights used instead of the graph's initializers from now on (by initializer name, same
  // shapes; e.g. views of a Trainer's parameters). Nothing is copied.
  void set_weights(std::map<std::string, Tensor> weights);

 private:
  struct Compiled;
  Compiled& compiled_for(int64_t batch, int64_t new_tokens, int64_t past);
  models::BuiltModel model_;
  std::shared_ptr<const ir::Graph> graph_;
  std::set<std::string> weights_;
  std::map<std::string, Tensor> weight_feeds_;
  int64_t layers_ = 0, kv_heads_ = 0, head_dim_ = 0;
  void check_cache_fits(int64_t rows, int64_t tokens, int64_t vocab) const;
  std::vector<std::unique_ptr<Compiled>> compiled_;  // most recent last; a few kept
  int64_t compiled_count_ = 0;
};

// Picks the next token from one row of logits (V) as configured (greedy or sampled); `u` is a
// uniform draw in [0, 1) used when sampling. Exposed for tests.
int64_t pick_token(const float* logits, int64_t V, const GenerationConfig& cfg, double u);

}  // namespace onyx::train
