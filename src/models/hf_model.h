// models/hf_model.h — Hugging Face architectures (BERT, RoBERTa, DistilBERT, GPT-2, ViT) built
// as onyx graphs from a config.json, with Transformers' exact parameter names, so a checkpoint
// folder trains without Python.
//
// The graphs use standard ONNX opset-17 ops only (Gather, MatMul, LayerNormalization, Softmax,
// Erf, Dropout with training_mode, ...), have dynamic batch and sequence dimensions (shape-derived
// values fold at plan time, per input signature), and keep every weight as an initializer named as
// in Transformers' state_dict. Tied weights (GPT-2's lm_head, BERT's MLM decoder) are the embedding
// initializer itself, used twice.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "onyx/trainer.h"
#include "quant/bnb_config.h"

namespace onyx::models {

// config.json, parsed. Fields take the value of whichever key the model type uses
// (hidden_size / n_embd / dim, ...); unknown keys are ignored but kept in raw_json for saving.
struct HfConfig {
  std::string model_type;  // "bert" | "roberta" | "distilbert" | "gpt2" | "vit" | "llama" | ...
                           // | "clip_text_model" (initializer_range holds its initializer_factor)
  std::vector<std::string> architectures;
  int64_t hidden_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t intermediate_size = 0;    // GPT-2: n_inner, default 4 * n_embd
  std::string hidden_act = "gelu";  // "gelu" (erf), "gelu_new" / "gelu_pytorch_tanh" (tanh),
                                    // "relu", "silu", "quick_gelu" (x sigmoid(1.702 x), CLIP)
  double layer_norm_eps = 1e-12;
  double hidden_dropout_prob = 0.1;  // BERT hidden / GPT-2 resid_pdrop / DistilBERT dropout
  double attention_probs_dropout_prob = 0.1;  // GPT-2 attn_pdrop / DistilBERT attention_dropout
  double embd_pdrop = 0.1;                    // GPT-2 only (others: hidden_dropout_prob)
  std::optional<double>
      classifier_dropout;  // BERT/RoBERTa classifier_dropout, DistilBERT seq_classif_dropout
  int64_t max_position_embeddings = 0;  // GPT-2: n_positions
  int64_t vocab_size = 0;
  int64_t type_vocab_size = 2;
  int64_t pad_token_id = 0;
  // CLIP's pooler: the state at the first eos_token_id (the legacy 2: at the largest id)
  int64_t eos_token_id = -1;
  int64_t image_size = 224, patch_size = 16, num_channels = 3;  // ViT
  bool qkv_bias = true;                                         // ViT
  int64_t num_labels = 2;
  std::vector<std::string> id2label;  // index -> label name; size num_labels when given
  double initializer_range = 0.02;
  bool tie_word_embeddings = true;
  // Llama family (llama, mistral, qwen2): grouped-query attention, rotary embeddings, RMSNorm
  // (eps in layer_norm_eps), SwiGLU MLP.
  int64_t num_key_value_heads = 0;  // 0: num_attention_heads
  int64_t head_dim = 0;             // 0: hidden_size / num_attention_heads
  bool attention_bias = false;      // q/k/v/o projections (llama); qwen2: q/k/v only
  bool o_proj_bias = false;
  bool mlp_bias = false;
  struct Rope {
    std::string type = "default";  // default | linear | dynamic | llama3
    double theta = 10000;
    double factor = 1;
    double low_freq_factor = 1, high_freq_factor = 4;  // llama3
    int64_t original_max_position_embeddings = 0;      // llama3 (0: max_position_embeddings)
  } rope;
  // Per layer: "full_attention" or "sliding_attention" (keys at most sliding_window - 1 back).
  std::vector<std::string> layer_types;
  int64_t sliding_window = 0;  // 0: none
  std::string raw_json;        // the file as read ("" when built in code)
  // quantization_config of a folder Transformers saved quantized (bitsandbytes 4-bit): its weights
  // are read in that format (quant/store_4bit.h).
  std::optional<quant::BnbConfig> quantization;
  // model_init_kwargs.dtype bfloat16 with LoRA (a run option, not config.json's): the linear
  // weights, all frozen, made and read in bf16 (GraphBuilder::set_bf16_linears), so the model is
  // never whole in float32. Llama-family builders; the others convert after the build.
  bool bf16_linears = false;
  // Encoder–decoders (whisper, bart): the encoder's sizes are hidden_size (d_model),
  // num_hidden_layers, num_attention_heads and intermediate_size; the decoder's are here, and
  // max_position_embeddings is the decoder's (BART's for both stacks).
  struct Seq2Seq {
    int64_t decoder_layers = 0, decoder_attention_heads = 0, decoder_ffn_dim = 0;
    int64_t decoder_start_token_id = 0;  // the first decoder input (labels shifted right)
    double activation_dropout = 0;       // after fc1's activation
    bool scale_embedding = false;        // BART: token embeddings * sqrt(d_model)
    int64_t num_mel_bins = 0;            // Whisper: log-mel channels in
    int64_t max_source_positions = 0;    // Whisper: encoder positions (input frames / 2)
    // T5: relative position buckets, gated feed-forward (gated-gelu), and whether the decoder
    // output is scaled by d_model^-0.5 before the tied LM head
    int64_t relative_buckets = 32, relative_max_distance = 128;
    bool gated_ffn = false, scale_decoder_outputs = false;
  } s2s;
};

// Parses config.json text. Throws onyx::Error naming `what` (the file) and the key for a missing
// required key, a value of the wrong type, an unknown model_type or invalid JSON.
HfConfig parse_hf_config(const std::string& json_text, const std::string& what);
// config.json text: raw_json's keys kept, the parsed fields written back under the model type's
// own key names, plus architectures / id2label / label2id.
std::string hf_config_to_json(const HfConfig& c, const std::string& architecture);

enum class Task {
  SequenceClassification,
  TokenClassification,
  MaskedLM,
  CausalLM,
  ImageClassification,
  Seq2SeqLM,  // ...ForConditionalGeneration: encoder–decoder with an LM head (models/seq2seq.cc)
  Base
};

const char* task_name(Task t);  // "SequenceClassification", ...
// The Transformers class name: "BertForSequenceClassification", "GPT2LMHeadModel", "ViTModel", ...
std::string architecture_name(const std::string& model_type, Task t);
// The task of a Transformers class name ("BertForMaskedLM" -> MaskedLM); nullopt when unknown.
std::optional<Task> task_from_architecture(const std::string& arch);
// The model types onyx builds and the heads each has: the one list the builders check a task
// against (require_task) and the Python package reads (built_architectures), in order.
const std::vector<std::pair<std::string, std::vector<Task>>>& built_model_types();
// Every Transformers class onyx builds: architecture_name of each (model type, task) above.
std::vector<std::string> built_architectures();

struct BuiltModel {
  Model model;  // graph (initializers = the weights, HF names), loss, predictions = "logits"
  HfConfig config;
  Task task = Task::Base;
  std::vector<std::string> input_names;  // graph inputs in order (labels last when in the graph)
  // Tied names -> the parameter they share storage with ("lm_head.weight" ->
  // "transformer.wte.weight").
  std::vector<std::pair<std::string, std::string>> tied;
  // Filled by load_hf_folder: what the checkpoint lacked (randomly initialized) / had in excess.
  std::vector<std::string> missing_keys, unexpected_keys;
};

// Builds the graph for `task` with weights randomly initialized as Transformers' _init_weights
// does (normal(0, initializer_range) for Linear/Embedding weights, zero biases, LayerNorm 1/0,
// padding row zero, ViT cls_token/position_embeddings truncated normal), from a deterministic RNG
// keyed on (seed, parameter name). Throws onyx::Error for a task the model type has no head for.
//
// Outputs: "logits" (Base: "last_hidden_state" and, for BERT/RoBERTa/ViT, "pooler_output").
// Loss: CrossEntropy on "logits" with labels "labels" (ignore_index -100); num_labels == 1 for
// sequence classification is regression (MSE). CausalLM computes the shifted loss in the graph:
// input "labels", scalar output "loss" (first), then "logits".
BuiltModel build_hf_model(const HfConfig& config, Task task, int64_t seed = 0);

// The causal LM as a decoder with a key/value cache, for generation (models/generate.h): inputs
// input_ids (B,S), attention_mask (B,P+S) over cache slots then new tokens (1 keep, 0 padding or
// unused slot), position_ids (B,S), cache_position (S) (the cache slot of each new token, P.. for
// a filled cache), past_keys.N (B, kv_heads, head_dim, P) (transposed) / past_values.N
// (B, kv_heads, P, head_dim); outputs logits (B,V)
// of the last new token, new_keys.N / new_values.N (B, kv_heads, S, head_dim) — the new tokens'
// keys (after rotary) and values, which the caller writes into its cache. Same weight names and
// task prefix as build_hf_model(c, Task::CausalLM). gpt2, llama, mistral, qwen2, whisper, bart, t5,
// mt5.
BuiltModel build_hf_decoder_with_past(const HfConfig& config, int64_t seed = 0);

// Encoder–decoders (whisper, bart, t5, mt5): build_hf_decoder_with_past is their decoder, input_ids
// its tokens, with per layer the inputs cross_keys.N (B, heads, head_dim, S) (transposed) and
// cross_values.N (B, heads, S, head_dim) — and for BART and T5 encoder_attention_mask (B, S) — that
// build_hf_encoder's graph outputs from the encoder's inputs (input_features, or input_ids and
// attention_mask), once per input.
bool is_encoder_decoder(const std::string& model_type);
BuiltModel build_hf_encoder(const HfConfig& config, int64_t seed = 0);
// Whisper's and BART's decoder-with-past (its inputs) through the last layer `heads` names, whose
// output "cross_attentions" (B, heads.size(), T, S) holds the cross-attention probabilities of
// each (decoder layer, head) pair in order: Whisper's alignment heads, for token timestamps.
BuiltModel build_hf_cross_attentions(const HfConfig& config,
                                     const std::vector<std::pair<int64_t, int64_t>>& heads);

// The base model's prefix in Transformers ("bert", "roberta", "distilbert", "transformer", "vit",
// "model" for the Llama family).
std::string base_model_prefix(const std::string& model_type);

}  // namespace onyx::models
