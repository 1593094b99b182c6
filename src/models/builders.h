// models/builders.h — internal to src/models: one builder per architecture family and the pieces
// they share (inputs, attention masks, heads, losses). The public entry is build_hf_model.
#pragma once
#include <string>

#include "models/graph_builder.h"
#include "models/hf_model.h"

namespace onyx::models {

BuiltModel build_bert(const HfConfig& c, Task task, int64_t seed);        // bert, roberta
BuiltModel build_distilbert(const HfConfig& c, Task task, int64_t seed);  // distilbert
BuiltModel build_gpt2(const HfConfig& c, Task task, int64_t seed);        // gpt2
BuiltModel build_vit(const HfConfig& c, Task task, int64_t seed);         // vit
BuiltModel build_llama(const HfConfig& c, Task task, int64_t seed);       // llama, mistral, qwen2
BuiltModel build_seq2seq(const HfConfig& c, Task task, int64_t seed);     // whisper, bart
BuiltModel build_t5(const HfConfig& c, Task task, int64_t seed);          // t5, mt5
BuiltModel build_clip_text(const HfConfig& c, Task task, int64_t seed);   // clip_text_model
// The decoders with a key/value cache (hf_model.h: build_hf_decoder_with_past).
BuiltModel build_gpt2_with_past(const HfConfig& c, int64_t seed);
BuiltModel build_llama_with_past(const HfConfig& c, int64_t seed);
BuiltModel build_seq2seq_with_past(const HfConfig& c, int64_t seed);
// Whisper's and BART's decoder-with-past through the last of `heads` ((layer, head) pairs), its
// output "cross_attentions" (B, heads, T, S) (hf_model.h: build_hf_cross_attentions).
BuiltModel build_seq2seq_cross_attentions(const HfConfig& c,
                                          const std::vector<std::pair<int64_t, int64_t>>& heads);
// An encoder–decoder's encoder for generation (hf_model.h: build_hf_encoder).
BuiltModel build_seq2seq_encoder(const HfConfig& c, int64_t seed);
BuiltModel build_t5_with_past(const HfConfig& c, int64_t seed);
BuiltModel build_t5_encoder(const HfConfig& c, int64_t seed);

// Throws naming the model type, the task and the heads it has when built_model_types() does not
// list `task` for c.model_type.
void require_task(const HfConfig& c, Task task);

// (B,T) int64 graph input named `name`.
std::string token_input(GraphBuilder& b, const std::string& name);
// attention_mask (B,T) int64, 1 keep / 0 pad -> (B,1,1,T) float: (1 - mask) * finfo(float32).min,
// as Transformers' get_extended_attention_mask.
std::string additive_attention_mask(GraphBuilder& b, const std::string& mask);
// (B,T,C) -> (B,C): the first token's hidden state.
std::string first_token(GraphBuilder& b, const std::string& h);
// Tied output projection: h (..., C) @ table (V, C)^T [+ bias (V)] -> (..., V), named `out`.
std::string tied_projection(GraphBuilder& b, const std::string& h, const std::string& table,
                            const std::string& bias, const std::string& out);

// The causal-LM head and loss: logits = h @ table^T (B,T,V) named "logits", input "labels" (B,T),
// "loss" = cross entropy of logits[:, :-1] against labels[:, 1:] (ignore_index -100, mean), as
// Transformers' causal LMs compute it; both graph outputs (loss first).
void causal_lm_head(GraphBuilder& b, const std::string& h, const std::string& table, int64_t V);

// The decoder-with-past interface (build_hf_decoder_with_past), one layer's attention: q
// (B,nh,S,hd) and the new tokens' k, v (B,nkv,S,hd) -> (B,nh,S,hd), over the inputs
// "past_keys.<layer>" (B,nkv,hd,P) — stored transposed — and "past_values.<layer>" (B,nkv,P,hd)
// followed by the new tokens, without copying the cache: scores against the past and the new
// keys are computed apart and concatenated (P+S per query), the softmax split back over the two
// value blocks; the nh/nkv query heads of a key/value head are one block of rows (no repeated
// keys). Also declares the outputs of new_kv_outputs. `divide`: scores / sqrt(hd) (GPT-2) rather
// than * (1/sqrt(hd)) (Llama), as each Transformers model computes it.
std::string cached_attention(GraphBuilder& b, int64_t layer, const std::string& q,
                             const std::string& k, const std::string& v, int64_t nh, int64_t nkv,
                             int64_t hd, bool divide, const std::string& causal,
                             const std::string& pad);
// (S, P+S) bool: key slot j (past slots 0..P-1, then the new tokens at cache_position) visible to
// new token i when slot(j) <= cache_position[i] and, with window > 0, cache_position[i] - slot(j)
// < window. Padding and unused cache slots are masked by attention_mask (B, P+S).
std::string cached_causal_mask(GraphBuilder& b, const std::string& past_value,
                               const std::string& cache_position, int64_t window);
// Graph outputs "new_keys.<layer>" / "new_values.<layer>": the S new tokens' keys and values.
void new_kv_outputs(GraphBuilder& b, int64_t layer, const std::string& k, const std::string& v,
                    int64_t kv_heads, int64_t head_dim);
// The LM head's table: the embedding's (tie_word_embeddings) or an "lm_head.weight" (V, C) of
// its own, initialized by head_init.
std::string lm_head_table(GraphBuilder& b, const HfConfig& c, const std::string& embed_table,
                          const Init& head_init);
// Finishes a ...ForCausalLM training graph: causal_lm_head over lm_head_table's table, then
// finish_model, with "lm_head.weight" recorded as tied to the embedding when it is.
BuiltModel finish_causal_lm(GraphBuilder& b, const HfConfig& c, const std::string& h,
                            const std::string& embed_table, const Init& head_init);
// The decoder's attention_mask input (B, P+S): cache slots, then the new tokens.
std::string cached_attention_mask_input(GraphBuilder& b);
// Finishes build_*_with_past: "logits" (B, V) of the last position of h (B, S, C) through the
// embedding table (tied) or an lm_head.weight of its own (head_init), no loss.
BuiltModel finish_decoder_with_past(GraphBuilder& b, const HfConfig& c, const std::string& h,
                                    const std::string& embed_table, const Init& head_init);

// An encoder–decoder's encoder for generation: graph outputs "cross_keys.<layer>" (B,H,D,S) and
// "cross_values.<layer>" (B,H,S,D) of kt / v, and the finished model (no loss, no predictions).
void cross_kv_outputs(GraphBuilder& b, int64_t layer, const std::string& kt, const std::string& v,
                      int64_t heads, int64_t head_dim);
BuiltModel finish_encoder(GraphBuilder& b, const HfConfig& c);

// An encoder–decoder's LM head and loss: "logits" = h @ table^T [+ bias (1,V)] (B,T,V), input
// "labels" (B,T), "loss" = mean cross entropy of every position against labels (-100 ignored),
// as Transformers' ...ForConditionalGeneration computes it; both graph outputs (loss first).
void seq2seq_lm_head(GraphBuilder& b, const HfConfig& c, const std::string& h,
                     const std::string& table, const std::string& bias);

// Finishes a BuiltModel: the graph into model.graph, input names, the loss for the task
// (CrossEntropy on "logits" with "labels"; MSE when a sequence classifier has one label; the
// graph's own "loss" output for CausalLM), predictions = "logits", Transformers' decay rule.
BuiltModel finish_model(GraphBuilder& b, const HfConfig& c, Task task);

}  // namespace onyx::models
