// hf_config.cc — config.json for the supported model types: key aliases per model type
// (hidden_size / n_embd / dim, ...), Transformers' defaults, strict types, errors that name the key
// and the file; and writing a config back.
#include <cmath>
#include <nlohmann/json.hpp>

#include "models/hf_model.h"

namespace onyx::models {
namespace {

using json = nlohmann::json;

// Reads keys from the config object, naming the file and key in every error.
struct Reader {
  const json& j;
  std::string what;
  std::string model_type;

  const json* find(std::initializer_list<const char*> keys) const {
    for (const char* k : keys) {
      auto it = j.find(k);
      if (it != j.end() && !it->is_null()) return &*it;
    }
    return nullptr;
  }
  std::string names(std::initializer_list<const char*> keys) const {
    std::string s;
    for (const char* k : keys) s += std::string(s.empty() ? "'" : " / '") + k + "'";
    return s;
  }
  [[noreturn]] void missing(std::initializer_list<const char*> keys) const {
    throw Error(
        cat(what, ": missing required key ", names(keys), " (model_type '", model_type, "')"));
  }
  int64_t integer(std::initializer_list<const char*> keys, std::optional<int64_t> def = {}) const {
    const json* v = find(keys);
    if (!v) {
      if (!def) missing(keys);
      return *def;
    }
    if (v->is_number_unsigned() && v->get<uint64_t>() <= (uint64_t)INT64_MAX)
      return v->get<int64_t>();
    if (v->is_number_integer() && !v->is_number_unsigned()) return v->get<int64_t>();
    if (v->is_number_float()) {  // 64.0 reads as 64; 1e124 (past int64: the cast's UB) does not
      const double d = v->get<double>();
      if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.2e18) return (int64_t)d;
    }
    throw Error(cat(what, ": key ", names(keys), " must be an integer, got ", v->dump()));
  }
  double number(std::initializer_list<const char*> keys, double def) const {
    const json* v = find(keys);
    if (!v) return def;
    ONYX_CHECK(v->is_number(), what, ": key ", names(keys), " must be a number, got ", v->dump());
    return v->get<double>();
  }
  std::string string(std::initializer_list<const char*> keys, const std::string& def) const {
    const json* v = find(keys);
    if (!v) return def;
    ONYX_CHECK(v->is_string(), what, ": key ", names(keys), " must be a string, got ", v->dump());
    return v->get<std::string>();
  }
  bool boolean(std::initializer_list<const char*> keys, bool def) const {
    const json* v = find(keys);
    if (!v) return def;
    ONYX_CHECK(v->is_boolean(), what, ": key ", names(keys), " must be true or false, got ",
               v->dump());
    return v->get<bool>();
  }
};

void check_positive(const Reader& r, int64_t v, const char* key) {
  ONYX_CHECK(v > 0, r.what, ": key '", key, "' must be positive, got ", v);
}

// Layers are built (and listed in layer_types) one by one: a count past any real model's (the
// largest have a few hundred) is refused before anything is sized by it.
constexpr int64_t kMaxLayers = 1 << 16;
void check_layer_count(const Reader& r, int64_t n) {
  check_positive(r, n, "num_hidden_layers");
  ONYX_CHECK(n <= kMaxLayers, r.what, ": key 'num_hidden_layers' is ", n, ", past the ", kMaxLayers,
             " layers onyx builds");
}

// The keys of each family, under Transformers' names for it (and their aliases).
void read_bert_keys(Reader& r, HfConfig& c) {  // bert, roberta, vit
  const std::string& t = c.model_type;
  const std::string& what = r.what;
  c.hidden_size = r.integer({"hidden_size"});
  c.num_hidden_layers = r.integer({"num_hidden_layers"});
  c.num_attention_heads = r.integer({"num_attention_heads"});
  c.intermediate_size = r.integer({"intermediate_size"});
  c.hidden_act = r.string({"hidden_act"}, "gelu");
  c.layer_norm_eps = r.number({"layer_norm_eps"}, 1e-12);
  c.hidden_dropout_prob = r.number({"hidden_dropout_prob"}, t == "vit" ? 0.0 : 0.1);
  c.attention_probs_dropout_prob =
      r.number({"attention_probs_dropout_prob"}, t == "vit" ? 0.0 : 0.1);
  c.embd_pdrop = c.hidden_dropout_prob;
  if (r.find({"classifier_dropout"})) c.classifier_dropout = r.number({"classifier_dropout"}, 0);
  c.initializer_range = r.number({"initializer_range"}, 0.02);
  if (t == "vit") {
    c.image_size = r.integer({"image_size"});
    c.patch_size = r.integer({"patch_size"});
    c.num_channels = r.integer({"num_channels"}, 3);
    c.qkv_bias = r.boolean({"qkv_bias"}, true);
    check_positive(r, c.image_size, "image_size");
    check_positive(r, c.patch_size, "patch_size");
    check_positive(r, c.num_channels, "num_channels");
    ONYX_CHECK(c.image_size % c.patch_size == 0, what, ": image_size ", c.image_size,
               " is not a multiple of patch_size ", c.patch_size);
  } else {
    c.vocab_size = r.integer({"vocab_size"});
    c.max_position_embeddings = r.integer({"max_position_embeddings"});
    c.type_vocab_size = r.integer({"type_vocab_size"}, 2);
    c.pad_token_id = r.integer({"pad_token_id"}, t == "roberta" ? 1 : 0);
    std::string pe = r.string({"position_embedding_type"}, "absolute");
    ONYX_CHECK(pe == "absolute", what, ": position_embedding_type '", pe,
               "' is not supported (only 'absolute')");
  }
}

void read_distilbert_keys(Reader& r, HfConfig& c) {
  const std::string& what = r.what;
  c.hidden_size = r.integer({"dim", "hidden_size"});
  c.num_hidden_layers = r.integer({"n_layers", "num_hidden_layers"});
  c.num_attention_heads = r.integer({"n_heads", "num_attention_heads"});
  c.intermediate_size = r.integer({"hidden_dim"});
  c.hidden_act = r.string({"activation"}, "gelu");
  c.layer_norm_eps = 1e-12;  // fixed in DistilBERT
  c.hidden_dropout_prob = r.number({"dropout"}, 0.1);
  c.embd_pdrop = c.hidden_dropout_prob;
  c.attention_probs_dropout_prob = r.number({"attention_dropout"}, 0.1);
  c.classifier_dropout = r.number({"seq_classif_dropout"}, 0.2);
  c.vocab_size = r.integer({"vocab_size"});
  c.max_position_embeddings = r.integer({"max_position_embeddings"});
  c.pad_token_id = r.integer({"pad_token_id"}, 0);
  c.initializer_range = r.number({"initializer_range"}, 0.02);
  ONYX_CHECK(!r.boolean({"sinusoidal_pos_embds"}, false), what,
             ": sinusoidal_pos_embds = true is not supported");
}

void read_gpt2_keys(Reader& r, HfConfig& c) {
  const std::string& what = r.what;
  c.hidden_size = r.integer({"n_embd", "hidden_size"});
  c.num_hidden_layers = r.integer({"n_layer", "num_hidden_layers"});
  c.num_attention_heads = r.integer({"n_head", "num_attention_heads"});
  c.intermediate_size = r.integer({"n_inner"}, 4 * c.hidden_size);
  c.hidden_act = r.string({"activation_function"}, "gelu_new");
  c.layer_norm_eps = r.number({"layer_norm_epsilon"}, 1e-5);
  c.hidden_dropout_prob = r.number({"resid_pdrop"}, 0.1);
  c.embd_pdrop = r.number({"embd_pdrop"}, 0.1);
  c.attention_probs_dropout_prob = r.number({"attn_pdrop"}, 0.1);
  if (r.find({"summary_first_dropout"}))
    c.classifier_dropout = r.number({"summary_first_dropout"}, 0.1);
  c.vocab_size = r.integer({"vocab_size"});
  c.max_position_embeddings = r.integer({"n_positions", "max_position_embeddings"});
  c.pad_token_id = r.integer({"pad_token_id"}, -1);
  c.initializer_range = r.number({"initializer_range"}, 0.02);
  ONYX_CHECK(r.boolean({"scale_attn_weights"}, true), what,
             ": scale_attn_weights = false is not supported");
  ONYX_CHECK(!r.boolean({"scale_attn_by_inverse_layer_idx"}, false), what,
             ": scale_attn_by_inverse_layer_idx = true is not supported");
}

void read_clip_text_keys(Reader& r, HfConfig& c) {  // clip_text_model (CLIPTextConfig)
  c.hidden_size = r.integer({"hidden_size"}, 512);
  c.num_hidden_layers = r.integer({"num_hidden_layers"}, 12);
  c.num_attention_heads = r.integer({"num_attention_heads"}, 8);
  c.intermediate_size = r.integer({"intermediate_size"}, 2048);
  c.hidden_act = r.string({"hidden_act"}, "quick_gelu");
  c.layer_norm_eps = r.number({"layer_norm_eps"}, 1e-5);
  c.attention_probs_dropout_prob = r.number({"attention_dropout"}, 0.0);
  c.hidden_dropout_prob = c.embd_pdrop = 0;  // (CLIP has no other dropout)
  c.vocab_size = r.integer({"vocab_size"}, 49408);
  c.max_position_embeddings = r.integer({"max_position_embeddings"}, 77);
  c.pad_token_id = r.integer({"pad_token_id"}, 1);
  c.eos_token_id = r.integer({"eos_token_id"}, 49407);
  c.initializer_range = r.number({"initializer_factor"}, 1.0);
}

void read_llama_keys(Reader& r, HfConfig& c) {  // llama, mistral, qwen2
  const std::string& t = c.model_type;
  const std::string& what = r.what;
  c.hidden_size = r.integer({"hidden_size"});
  c.num_hidden_layers = r.integer({"num_hidden_layers"});
  c.num_attention_heads = r.integer({"num_attention_heads"});
  c.num_key_value_heads = r.integer({"num_key_value_heads"}, c.num_attention_heads);
  c.intermediate_size = r.integer({"intermediate_size"});
  c.head_dim = r.integer({"head_dim"}, 0);
  c.hidden_act = r.string({"hidden_act"}, "silu");
  c.layer_norm_eps = r.number({"rms_norm_eps"}, 1e-6);
  c.attention_probs_dropout_prob = r.number({"attention_dropout"}, 0.0);
  c.hidden_dropout_prob = c.embd_pdrop = 0.0;
  c.vocab_size = r.integer({"vocab_size"});
  c.max_position_embeddings = r.integer({"max_position_embeddings"});
  c.pad_token_id = r.integer({"pad_token_id"}, -1);
  c.initializer_range = r.number({"initializer_range"}, 0.02);
  if (t == "qwen2") {  // q/k/v biases, none on o_proj or the MLP
    c.attention_bias = true;
  } else {
    c.attention_bias = c.o_proj_bias = r.boolean({"attention_bias"}, false);
    c.mlp_bias = t == "llama" && r.boolean({"mlp_bias"}, false);
  }
  ONYX_CHECK(r.integer({"pretraining_tp"}, 1) == 1, what,
             ": pretraining_tp other than 1 is not supported");
  // Rotary embeddings: Transformers 5's rope_parameters, or the older rope_theta + rope_scaling.
  const json* rp = r.find({"rope_parameters"});
  const json* rs = r.find({"rope_scaling"});
  c.rope.theta = r.number({"rope_theta"}, 10000.0);
  for (const json* o : {rs, rp}) {
    if (!o) continue;
    ONYX_CHECK(o->is_object(), what, ": key 'rope_parameters' / 'rope_scaling' must be an object");
    Reader ro{*o, what + " (rope parameters)", t};
    c.rope.type = ro.string({"rope_type", "type"}, c.rope.type);
    c.rope.theta = ro.number({"rope_theta"}, c.rope.theta);
    c.rope.factor = ro.number({"factor"}, c.rope.factor);
    c.rope.low_freq_factor = ro.number({"low_freq_factor"}, c.rope.low_freq_factor);
    c.rope.high_freq_factor = ro.number({"high_freq_factor"}, c.rope.high_freq_factor);
    c.rope.original_max_position_embeddings =
        ro.integer({"original_max_position_embeddings"}, c.rope.original_max_position_embeddings);
    ONYX_CHECK(ro.number({"partial_rotary_factor"}, 1.0) == 1.0, what,
               ": partial_rotary_factor other than 1 is not supported");
  }
  const std::string& rt = c.rope.type;
  ONYX_CHECK(rt == "default" || rt == "linear" || rt == "dynamic" || rt == "llama3", what,
             ": rope type '", rt,
             "' is not supported (default, linear, dynamic, llama3; Transformers also has "
             "yarn and longrope)");
  ONYX_CHECK(c.rope.factor > 0, what, ": rope factor must be positive");
  // Sliding-window attention: Mistral on every layer when sliding_window is set; Qwen2 per
  // layer_types (use_sliding_window, from max_window_layers on).
  if (const json* sw = r.find({"sliding_window"})) {
    ONYX_CHECK(sw->is_number_integer(), what, ": key 'sliding_window' must be an integer or null");
    c.sliding_window = sw->get<int64_t>();
  }
  if (t == "qwen2" && !r.boolean({"use_sliding_window"}, false)) c.sliding_window = 0;
  check_layer_count(r, c.num_hidden_layers);
  if (const json* lt = r.find({"layer_types"})) {
    ONYX_CHECK(lt->is_array() && (int64_t)lt->size() == c.num_hidden_layers, what,
               ": key 'layer_types' must list one type per layer");
    for (auto& x : *lt) {
      ONYX_CHECK(x.is_string() && (x == "full_attention" || x == "sliding_attention"), what,
                 ": layer_types entries must be 'full_attention' or 'sliding_attention'");
      c.layer_types.push_back(x.get<std::string>());
    }
  } else {
    int64_t from = t == "qwen2" ? r.integer({"max_window_layers"}, 28) : 0;
    for (int64_t i = 0; i < c.num_hidden_layers; i++)
      c.layer_types.push_back(c.sliding_window > 0 && i >= from ? "sliding_attention"
                                                                : "full_attention");
  }
  if (c.sliding_window <= 0)
    for (auto& l : c.layer_types) l = "full_attention";
  check_positive(r, c.num_key_value_heads, "num_key_value_heads");
  ONYX_CHECK(c.num_attention_heads % c.num_key_value_heads == 0, what, ": num_attention_heads ",
             c.num_attention_heads, " is not a multiple of num_key_value_heads ",
             c.num_key_value_heads);
}

// T5 and mT5 (T5Config / MT5Config): encoder sizes in the shared fields (d_kv as head_dim), the
// decoder's layer count in c.s2s, feed_forward_proj split as Transformers splits it.
void read_t5_keys(Reader& r, HfConfig& c) {
  const bool mt5 = c.model_type == "mt5";
  const std::string& what = r.what;
  c.hidden_size = r.integer({"d_model"}, 512);
  c.head_dim = r.integer({"d_kv"}, 64);
  c.intermediate_size = r.integer({"d_ff"}, mt5 ? 1024 : 2048);
  c.num_hidden_layers = r.integer({"num_layers"}, mt5 ? 8 : 6);
  c.s2s.decoder_layers = r.integer({"num_decoder_layers"}, c.num_hidden_layers);
  c.num_attention_heads = c.s2s.decoder_attention_heads = r.integer({"num_heads"}, mt5 ? 6 : 8);
  c.s2s.decoder_ffn_dim = c.intermediate_size;
  c.s2s.relative_buckets = r.integer({"relative_attention_num_buckets"}, 32);
  c.s2s.relative_max_distance = r.integer({"relative_attention_max_distance"}, 128);
  c.hidden_dropout_prob = c.attention_probs_dropout_prob = c.embd_pdrop =
      r.number({"dropout_rate"}, 0.1);
  c.layer_norm_eps = r.number({"layer_norm_epsilon"}, 1e-6);
  c.initializer_range = r.number({"initializer_factor"}, 1.0);
  c.vocab_size = r.integer({"vocab_size"}, mt5 ? 250112 : 32128);
  c.pad_token_id = r.integer({"pad_token_id"}, 0);
  c.s2s.decoder_start_token_id = r.integer({"decoder_start_token_id"}, c.pad_token_id);
  c.max_position_embeddings = 1 << 30;  // no learned positions: any length
  const std::string ff = r.string({"feed_forward_proj"}, mt5 ? "gated-gelu" : "relu");
  const size_t dash = ff.find('-');
  ONYX_CHECK(dash == std::string::npos ||
                 (ff.substr(0, dash) == "gated" && ff.find('-', dash + 1) == std::string::npos),
             what, ": feed_forward_proj '", ff, "' is not ACT or gated-ACT");
  c.s2s.gated_ffn = dash != std::string::npos;
  c.hidden_act =
      ff == "gated-gelu" ? "gelu_new" : ff.substr(dash == std::string::npos ? 0 : dash + 1);
  // Transformers 5 ties the LM head to shared.weight always; T5 (not mT5) scales the decoder
  // output unless the config says not to (scale_decoder_outputs, else tie_word_embeddings false)
  c.s2s.scale_decoder_outputs =
      !mt5 && r.boolean({"scale_decoder_outputs"}, r.boolean({"tie_word_embeddings"}, true));
  check_positive(r, c.head_dim, "d_kv");
  check_positive(r, c.s2s.relative_buckets, "relative_attention_num_buckets");
  ONYX_CHECK(
      c.s2s.relative_buckets >= 4 && c.s2s.relative_max_distance > c.s2s.relative_buckets / 4, what,
      ": relative_attention_num_buckets ", c.s2s.relative_buckets,
      " / relative_attention_max_distance ", c.s2s.relative_max_distance,
      " leave no log-spaced buckets");
  check_layer_count(r, c.s2s.decoder_layers);
  ONYX_CHECK(c.s2s.decoder_start_token_id >= 0 && c.s2s.decoder_start_token_id < c.vocab_size, what,
             ": decoder_start_token_id ", c.s2s.decoder_start_token_id,
             " is not a token id below vocab_size ", c.vocab_size);
}

// Encoder–decoders with BART's layer (whisper, bart): encoder sizes in the shared fields, the
// decoder's in c.s2s. Whisper's SpecAugment and either model's LayerDrop are training-time
// randomness onyx does not draw: refused rather than silently left out.
void read_seq2seq_keys(Reader& r, HfConfig& c) {
  const bool whisper = c.model_type == "whisper";
  const std::string& what = r.what;
  c.hidden_size = r.integer({"d_model"}, whisper ? 384 : 1024);
  c.num_hidden_layers = r.integer({"encoder_layers"}, whisper ? 4 : 12);
  c.num_attention_heads = r.integer({"encoder_attention_heads"}, whisper ? 6 : 16);
  c.intermediate_size = r.integer({"encoder_ffn_dim"}, whisper ? 1536 : 4096);
  c.s2s.decoder_layers = r.integer({"decoder_layers"}, whisper ? 4 : 12);
  c.s2s.decoder_attention_heads = r.integer({"decoder_attention_heads"}, whisper ? 6 : 16);
  c.s2s.decoder_ffn_dim = r.integer({"decoder_ffn_dim"}, whisper ? 1536 : 4096);
  c.s2s.decoder_start_token_id = r.integer({"decoder_start_token_id"}, whisper ? 50257 : 2);
  c.s2s.activation_dropout = r.number({"activation_dropout"}, 0.0);
  c.s2s.scale_embedding = r.boolean({"scale_embedding"}, false);
  c.hidden_act = r.string({"activation_function"}, "gelu");
  c.layer_norm_eps = 1e-5;  // nn.LayerNorm's default, fixed in both
  c.hidden_dropout_prob = c.embd_pdrop = r.number({"dropout"}, whisper ? 0.0 : 0.1);
  c.attention_probs_dropout_prob = r.number({"attention_dropout"}, 0.0);
  c.initializer_range = r.number({"init_std"}, 0.02);
  c.vocab_size = r.integer({"vocab_size"}, whisper ? 51865 : 50265);
  c.pad_token_id = r.integer({"pad_token_id"}, whisper ? 50256 : 1);
  if (whisper) {
    c.s2s.num_mel_bins = r.integer({"num_mel_bins"}, 80);
    c.s2s.max_source_positions = r.integer({"max_source_positions"}, 1500);
    c.max_position_embeddings = r.integer({"max_target_positions"}, 448);
    check_positive(r, c.s2s.num_mel_bins, "num_mel_bins");
    check_positive(r, c.s2s.max_source_positions, "max_source_positions");
    ONYX_CHECK(!r.boolean({"apply_spec_augment"}, false), what,
               ": apply_spec_augment = true (SpecAugment's random masking) is not supported");
  } else {
    c.max_position_embeddings = r.integer({"max_position_embeddings"}, 1024);
  }
  for (const char* k : {"encoder_layerdrop", "decoder_layerdrop"})
    ONYX_CHECK(r.number({k}, 0.0) == 0.0, what, ": key '", k, "' > 0 (LayerDrop) is not supported");
  check_layer_count(r, c.s2s.decoder_layers);
  check_positive(r, c.s2s.decoder_attention_heads, "decoder_attention_heads");
  check_positive(r, c.s2s.decoder_ffn_dim, "decoder_ffn_dim");
  ONYX_CHECK(c.hidden_size % c.s2s.decoder_attention_heads == 0, what, ": d_model ", c.hidden_size,
             " is not a multiple of decoder_attention_heads ", c.s2s.decoder_attention_heads);
  ONYX_CHECK(c.s2s.decoder_start_token_id >= 0 && c.s2s.decoder_start_token_id < c.vocab_size &&
                 c.pad_token_id >= 0 && c.pad_token_id < c.vocab_size,
             what, ": decoder_start_token_id ", c.s2s.decoder_start_token_id, " and pad_token_id ",
             c.pad_token_id, " must be token ids below vocab_size ", c.vocab_size);
}

}  // namespace

HfConfig parse_hf_config(const std::string& text, const std::string& what) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw Error(cat(what, ": invalid JSON: ", e.what()));
  }
  ONYX_CHECK(j.is_object(), what, ": expected a JSON object at the top level");
  Reader r{j, what, ""};
  HfConfig c;
  c.raw_json = text;
  const json* mt = r.find({"model_type"});
  ONYX_CHECK(mt, what, ": missing required key 'model_type'");
  ONYX_CHECK(mt->is_string(), what, ": key 'model_type' must be a string, got ", mt->dump());
  c.model_type = r.model_type = mt->get<std::string>();
  if (const json* a = r.find({"architectures"})) {
    ONYX_CHECK(a->is_array(), what, ": key 'architectures' must be a list of strings");
    for (auto& s : *a) {
      ONYX_CHECK(s.is_string(), what, ": key 'architectures' must be a list of strings");
      c.architectures.push_back(s.get<std::string>());
    }
  }
  const std::string& t = c.model_type;
  if (t == "bert" || t == "roberta" || t == "vit") {
    read_bert_keys(r, c);
  } else if (t == "distilbert") {
    read_distilbert_keys(r, c);
  } else if (t == "gpt2") {
    read_gpt2_keys(r, c);
  } else if (t == "llama" || t == "mistral" || t == "qwen2") {
    read_llama_keys(r, c);
  } else if (t == "whisper" || t == "bart") {
    read_seq2seq_keys(r, c);
  } else if (t == "t5" || t == "mt5") {
    read_t5_keys(r, c);
  } else if (t == "clip_text_model") {
    read_clip_text_keys(r, c);
  } else {
    throw Error(cat(what, ": model_type '", t,
                    "' is not supported (bert, roberta, distilbert, gpt2, vit, llama, mistral, "
                    "qwen2, whisper, bart, t5, mt5, clip_text_model)"));
  }
  if (const json* q = r.find({"quantization_config"}))
    c.quantization = quant::parse_bnb_config(*q, what, /*strict=*/false);
  const bool llama_family = t == "llama" || t == "mistral" || t == "qwen2";
  c.tie_word_embeddings = r.boolean({"tie_word_embeddings"}, !llama_family);
  if (t == "t5" || t == "mt5") c.tie_word_embeddings = true;  // (Transformers 5 ties always)
  check_positive(r, c.hidden_size, "hidden_size");
  check_layer_count(r, c.num_hidden_layers);
  check_positive(r, c.num_attention_heads, "num_attention_heads");
  check_positive(r, c.intermediate_size, "intermediate_size");
  ONYX_CHECK(c.head_dim > 0 || c.hidden_size % c.num_attention_heads == 0, what, ": hidden size ",
             c.hidden_size, " is not a multiple of the number of attention heads ",
             c.num_attention_heads);
  if (t != "vit") {
    check_positive(r, c.vocab_size, "vocab_size");
    check_positive(r, c.max_position_embeddings, "max_position_embeddings");
  }
  static const char* acts[] = {"gelu", "gelu_new", "gelu_pytorch_tanh", "gelu_fast",
                               "relu", "silu",     "quick_gelu"};
  bool act_ok = false;
  for (const char* a : acts) act_ok |= c.hidden_act == a;
  ONYX_CHECK(act_ok, what, ": activation '", c.hidden_act,
             "' (key 'hidden_act' / 'activation_function' / 'activation') is not supported "
             "(gelu, gelu_new, gelu_pytorch_tanh, gelu_fast, relu, silu, quick_gelu)");

  // Labels: id2label's size (keys "0".."n-1"), overridden by an explicit num_labels.
  if (const json* m = r.find({"id2label"})) {
    ONYX_CHECK(m->is_object(), what,
               ": key 'id2label' must be an object {\"0\": \"LABEL_0\", ...}");
    c.id2label.assign(m->size(), "");
    for (auto& [k, v] : m->items()) {
      int64_t id = -1;
      try {
        size_t used = 0;
        id = std::stoll(k, &used);
        if (used != k.size()) id = -1;
      } catch (...) {
      }
      ONYX_CHECK(id >= 0 && id < (int64_t)m->size(), what, ": id2label key '", k,
                 "' is not an index in [0, ", m->size(), ")");
      ONYX_CHECK(v.is_string(), what, ": id2label['", k, "'] must be a string");
      c.id2label[id] = v.get<std::string>();
    }
    c.num_labels = (int64_t)c.id2label.size();
  }
  if (r.find({"num_labels"})) {
    c.num_labels = r.integer({"num_labels"});
    if ((int64_t)c.id2label.size() != c.num_labels) c.id2label.clear();
  }
  check_positive(r, c.num_labels, "num_labels");
  return c;
}

namespace {
// The sizes most model types keep under Transformers' standard key names.
void write_standard_sizes(json& j, const HfConfig& c) {
  j["hidden_size"] = c.hidden_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["intermediate_size"] = c.intermediate_size;
  j["hidden_act"] = c.hidden_act;
}
}  // namespace

std::string hf_config_to_json(const HfConfig& c, const std::string& architecture) {
  json j = json::object();
  if (!c.raw_json.empty()) {
    try {
      j = json::parse(c.raw_json);
    } catch (const json::exception&) {
      j = json::object();
    }
  }
  const std::string& t = c.model_type;
  j["model_type"] = t;
  j["architectures"] = json::array({architecture});
  if (t == "bert" || t == "roberta" || t == "vit") {
    write_standard_sizes(j, c);
    j["layer_norm_eps"] = c.layer_norm_eps;
    j["hidden_dropout_prob"] = c.hidden_dropout_prob;
    j["attention_probs_dropout_prob"] = c.attention_probs_dropout_prob;
    if (c.classifier_dropout) j["classifier_dropout"] = *c.classifier_dropout;
    j["initializer_range"] = c.initializer_range;
    if (t == "vit") {
      j["image_size"] = c.image_size;
      j["patch_size"] = c.patch_size;
      j["num_channels"] = c.num_channels;
      j["qkv_bias"] = c.qkv_bias;
    } else {
      j["vocab_size"] = c.vocab_size;
      j["max_position_embeddings"] = c.max_position_embeddings;
      j["type_vocab_size"] = c.type_vocab_size;
      j["pad_token_id"] = c.pad_token_id;
    }
  } else if (t == "distilbert") {
    j["dim"] = c.hidden_size;
    j["n_layers"] = c.num_hidden_layers;
    j["n_heads"] = c.num_attention_heads;
    j["hidden_dim"] = c.intermediate_size;
    j["activation"] = c.hidden_act;
    j["dropout"] = c.hidden_dropout_prob;
    j["attention_dropout"] = c.attention_probs_dropout_prob;
    if (c.classifier_dropout) j["seq_classif_dropout"] = *c.classifier_dropout;
    j["vocab_size"] = c.vocab_size;
    j["max_position_embeddings"] = c.max_position_embeddings;
    j["pad_token_id"] = c.pad_token_id;
    j["initializer_range"] = c.initializer_range;
  } else if (t == "gpt2") {
    j["n_embd"] = c.hidden_size;
    j["n_layer"] = c.num_hidden_layers;
    j["n_head"] = c.num_attention_heads;
    if (c.intermediate_size != 4 * c.hidden_size || j.contains("n_inner"))
      j["n_inner"] = c.intermediate_size;
    j["activation_function"] = c.hidden_act;
    j["layer_norm_epsilon"] = c.layer_norm_eps;
    j["resid_pdrop"] = c.hidden_dropout_prob;
    j["embd_pdrop"] = c.embd_pdrop;
    j["attn_pdrop"] = c.attention_probs_dropout_prob;
    j["vocab_size"] = c.vocab_size;
    j["n_positions"] = c.max_position_embeddings;
    j["initializer_range"] = c.initializer_range;
  } else if (t == "llama" || t == "mistral" || t == "qwen2") {
    write_standard_sizes(j, c);
    j["num_key_value_heads"] = c.num_key_value_heads;
    if (c.head_dim) j["head_dim"] = c.head_dim;
    j["rms_norm_eps"] = c.layer_norm_eps;
    j["attention_dropout"] = c.attention_probs_dropout_prob;
    j["vocab_size"] = c.vocab_size;
    j["max_position_embeddings"] = c.max_position_embeddings;
    j["initializer_range"] = c.initializer_range;
    if (!j.contains("rope_parameters") && !j.contains("rope_theta") && !j.contains("rope_scaling"))
      j["rope_parameters"] = {{"rope_type", c.rope.type}, {"rope_theta", c.rope.theta}};
  } else if (t == "t5" || t == "mt5") {
    j["d_model"] = c.hidden_size;
    j["d_kv"] = c.head_dim;
    j["d_ff"] = c.intermediate_size;
    j["num_layers"] = c.num_hidden_layers;
    j["num_decoder_layers"] = c.s2s.decoder_layers;
    j["num_heads"] = c.num_attention_heads;
    j["relative_attention_num_buckets"] = c.s2s.relative_buckets;
    j["relative_attention_max_distance"] = c.s2s.relative_max_distance;
    j["dropout_rate"] = c.hidden_dropout_prob;
    j["layer_norm_epsilon"] = c.layer_norm_eps;
    j["initializer_factor"] = c.initializer_range;
    j["vocab_size"] = c.vocab_size;
    j["pad_token_id"] = c.pad_token_id;
    j["decoder_start_token_id"] = c.s2s.decoder_start_token_id;
    j["is_encoder_decoder"] = true;
    if (t == "t5") j["scale_decoder_outputs"] = c.s2s.scale_decoder_outputs;
  } else if (t == "clip_text_model") {
    write_standard_sizes(j, c);
    j["layer_norm_eps"] = c.layer_norm_eps;
    j["attention_dropout"] = c.attention_probs_dropout_prob;
    j["vocab_size"] = c.vocab_size;
    j["max_position_embeddings"] = c.max_position_embeddings;
    j["pad_token_id"] = c.pad_token_id;
    j["eos_token_id"] = c.eos_token_id;
    j["initializer_factor"] = c.initializer_range;
  } else if (t == "whisper" || t == "bart") {
    j["d_model"] = c.hidden_size;
    j["encoder_layers"] = c.num_hidden_layers;
    j["encoder_attention_heads"] = c.num_attention_heads;
    j["encoder_ffn_dim"] = c.intermediate_size;
    j["decoder_layers"] = c.s2s.decoder_layers;
    j["decoder_attention_heads"] = c.s2s.decoder_attention_heads;
    j["decoder_ffn_dim"] = c.s2s.decoder_ffn_dim;
    j["decoder_start_token_id"] = c.s2s.decoder_start_token_id;
    j["activation_function"] = c.hidden_act;
    j["dropout"] = c.hidden_dropout_prob;
    j["attention_dropout"] = c.attention_probs_dropout_prob;
    j["activation_dropout"] = c.s2s.activation_dropout;
    j["scale_embedding"] = c.s2s.scale_embedding;
    j["init_std"] = c.initializer_range;
    j["vocab_size"] = c.vocab_size;
    j["pad_token_id"] = c.pad_token_id;
    j["is_encoder_decoder"] = true;
    if (t == "whisper") {
      j["num_mel_bins"] = c.s2s.num_mel_bins;
      j["max_source_positions"] = c.s2s.max_source_positions;
      j["max_target_positions"] = c.max_position_embeddings;
    } else {
      j["max_position_embeddings"] = c.max_position_embeddings;
    }
  }
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  // Labels as Transformers writes them: id2label / label2id (num_labels is derived from them).
  json id2label = json::object(), label2id = json::object();
  for (int64_t i = 0; i < c.num_labels; i++) {
    std::string name = i < (int64_t)c.id2label.size() && !c.id2label[i].empty()
                           ? c.id2label[i]
                           : "LABEL_" + std::to_string(i);
    id2label[std::to_string(i)] = name;
    label2id[name] = i;
  }
  j["id2label"] = id2label;
  j["label2id"] = label2id;
  if (j.contains("num_labels")) j["num_labels"] = c.num_labels;
  j["torch_dtype"] = "float32";
  return j.dump(2) + "\n";
}

}  // namespace onyx::models
