// generate/generate.h — text generation from a causal LM with a key/value cache, as Transformers'
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
//
// An encoder–decoder (Whisper, BART, T5) also has its encoder graph (models::build_hf_encoder): run
// once per generate() call on the caller's encoder inputs, it gives each decoder layer's
// cross-attention keys and values, fed to every decoder step (the same for a prompt's beams, so
// beam search never reorders them). The prompts are then decoder prompts: the decoder start
// token, or a forced prefix such as Whisper's language and task tokens.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "generate/generation_config.h"
#include "models/hf_model.h"

namespace onyx::runtime {
class Session;
}

namespace onyx::generate {

struct GenerationStats {
  double prefill_seconds = 0;
  std::vector<double> step_seconds;  // one per decoded token after the first
  int64_t compiled_signatures = 0;   // optimized graphs built (prefill + one per cache block)
};

// What generate() can report besides the tokens (its `scores` argument), per prompt, for Whisper's
// temperature fallback (whisper_transcribe.h) as Transformers' output_scores gives it.
struct GenerationScores {
  // Greedy and sampling: the sum, over the new tokens (eos included), of each token's
  // log-probability under the processed scores (the logits processors, and when sampling top-k /
  // top-p, applied; the temperature undone), with `counted` tokens summed. Beam search: the best
  // hypothesis' score (Transformers' sequences_scores: summed log-probabilities / length ^
  // length_penalty), counted 0.
  std::vector<double> sum_logprobs;
  std::vector<int64_t> counted;
  // (prompts, V): the raw logits after each prompt's last token (empty when max_new_tokens is 0)
  Tensor first_logits;
};

class Generator {
 public:
  // `decoder` from build_hf_decoder_with_past, weights in its initializers; for an
  // encoder–decoder, `encoder` from build_hf_encoder.
  explicit Generator(models::BuiltModel decoder,
                     std::optional<models::BuiltModel> encoder = std::nullopt);
  ~Generator();
  // A Hugging Face folder or an onyx checkpoint of one (config.json + model.safetensors); a LoRA
  // checkpoint or adapter folder (adapter_config.json) gets its adapters merged.
  static Generator from_folder(const std::string& dir);

  // New tokens per prompt (ids, any lengths >= 1): up to max_new_tokens, ending with the eos token
  // when one was emitted. Throws naming the row for an empty prompt or an id out of the vocabulary.
  // An encoder–decoder needs `encoder_inputs` (the encoder graph's inputs, one row per prompt).
  std::vector<std::vector<int64_t>> generate(
      const std::vector<std::vector<int64_t>>& prompts, const GenerationConfig& cfg,
      GenerationStats* stats = nullptr, const std::map<std::string, Tensor>& encoder_inputs = {},
      GenerationScores* scores = nullptr);
  bool is_encoder_decoder() const { return encoder_graph_ != nullptr; }
  // An encoder–decoder's cross-attention probabilities of `heads` ((decoder layer, head) pairs),
  // (rows, heads, L + N - 1, S), as the decoder computes them while generating `tokens` after
  // `prompts`: each row's prompt left-padded to the longest (L) as generate() pads it, then its
  // tokens right-padded with `pad` to the longest (N >= 1), the last position left out (nothing
  // is generated from it) — what Transformers' output_attentions gives per step, stacked.
  // `encoder_inputs` as generate()'s (one row per prompt).
  Tensor cross_attentions(const std::vector<std::vector<int64_t>>& prompts,
                          const std::vector<std::vector<int64_t>>& tokens, int64_t pad,
                          const std::vector<std::pair<int64_t, int64_t>>& heads,
                          const std::map<std::string, Tensor>& encoder_inputs);
  // The encoder's graph (is_encoder_decoder() only).
  const ir::Graph& encoder_graph() const { return *encoder_graph_; }
  const models::HfConfig& config() const { return model_.config; }
  const ir::Graph& graph() const { return *graph_; }
  // Weights used instead of the graphs' initializers from now on (by initializer name, same
  // shapes; e.g. views of a Trainer's parameters; an encoder–decoder's split between its two
  // graphs). Nothing is copied.
  void set_weights(std::map<std::string, Tensor> weights);

 private:
  struct Compiled;
  Compiled& compiled_for(int64_t batch, int64_t new_tokens, int64_t past,
                         const std::map<std::string, Tensor>& cross);
  static Compiled& compiled_once(std::unique_ptr<Compiled>& slot, const ir::Graph& g,
                                 const std::map<std::string, TensorMeta>& sig,
                                 const std::set<std::string>& weights);
  // The encoder run on `inputs`: cross_keys.N / cross_values.N (and BART's
  // encoder_attention_mask), each row repeated `repeat` times (beams).
  std::map<std::string, Tensor> encode(const std::map<std::string, Tensor>& inputs, int64_t rows,
                                       int64_t repeat);
  models::BuiltModel model_;
  std::shared_ptr<const ir::Graph> graph_;
  std::set<std::string> weights_;
  std::map<std::string, Tensor> weight_feeds_;
  int64_t layers_ = 0, kv_heads_ = 0, head_dim_ = 0;
  bool uses_positions_ = true;  // the decoder reads position_ids
  void check_cache_fits(int64_t rows, int64_t tokens, int64_t vocab) const;
  int64_t checked_new_tokens(const GenerationConfig& cfg, int64_t prompt_length, int64_t rows,
                             bool has_encoder_inputs) const;
  std::vector<std::unique_ptr<Compiled>> compiled_;  // most recent last; a few kept
  int64_t compiled_count_ = 0;
  // encoder–decoders: the encoder, its weights and its last compiled form
  std::shared_ptr<const ir::Graph> encoder_graph_;
  std::set<std::string> encoder_weights_;
  std::map<std::string, Tensor> encoder_weight_feeds_;
  std::unique_ptr<Compiled> encoder_compiled_;
  // cross_attentions(): its graph (for cross_heads_) and last compiled form
  std::shared_ptr<const ir::Graph> cross_graph_;
  std::vector<std::pair<int64_t, int64_t>> cross_heads_;
  std::unique_ptr<Compiled> cross_compiled_;
};

// Picks the next token from one row of logits (V) as configured (greedy or sampled); `u` is a
// uniform draw in [0, 1) used when sampling. With `logprob`, also the token's log-probability
// under the logits as sampling masks them (top-k / top-p), at temperature 1. Exposed for tests.
int64_t pick_token(const float* logits, int64_t V, const GenerationConfig& cfg, double u,
                   double* logprob = nullptr);

// The token generate() pads rows with: pad_token_id, else the first eos token, else 0.
int64_t padding_token(const GenerationConfig& cfg);

// log_softmax(x * scale)[k] over the finite entries of x (V): -inf entries (masked tokens) take
// no share.
double log_softmax_at(const float* x, int64_t V, int64_t k, double scale = 1.0);

}  // namespace onyx::generate
