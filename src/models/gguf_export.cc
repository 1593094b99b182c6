// models/gguf_export.cc — see gguf_export.h.
#include "models/gguf_export.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "onyx/error.h"

namespace fs = std::filesystem;

namespace onyx::models {
namespace {

using json = nlohmann::json;

json read_json(const fs::path& p, bool required) {
  std::ifstream f(p);
  if (!f) {
    ONYX_CHECK(!required, p.string(), ": cannot read the file");
    return json();
  }
  std::stringstream ss;
  ss << f.rdbuf();
  json j = json::parse(ss.str(), nullptr, false);
  ONYX_CHECK(!j.is_discarded() && j.is_object(), p.string(), ": not a JSON object");
  return j;
}

std::string gguf_arch(const HfConfig& c) {
  if (c.model_type == "llama" || c.model_type == "mistral") return "llama";
  if (c.model_type == "qwen2") return "qwen2";
  throw Error(cat("gguf: model_type '", c.model_type,
                  "' is not supported (llama, mistral, qwen2: llama.cpp's llama and qwen2)"));
}

int64_t head_dim(const HfConfig& c) {
  return c.head_dim > 0 ? c.head_dim : c.hidden_size / c.num_attention_heads;
}
int64_t kv_heads(const HfConfig& c) {
  return c.num_key_value_heads > 0 ? c.num_key_value_heads : c.num_attention_heads;
}

// Transformers' name -> llama.cpp's ("" for a tensor the file does not hold).
std::string gguf_name(const std::string& n) {
  static const std::map<std::string, std::string> top = {
      {"model.embed_tokens.weight", "token_embd.weight"},
      {"model.norm.weight", "output_norm.weight"},
      {"lm_head.weight", "output.weight"}};
  if (auto it = top.find(n); it != top.end()) return it->second;
  static const std::map<std::string, std::string> layer = {
      {"input_layernorm", "attn_norm"}, {"post_attention_layernorm", "ffn_norm"},
      {"self_attn.q_proj", "attn_q"},   {"self_attn.k_proj", "attn_k"},
      {"self_attn.v_proj", "attn_v"},   {"self_attn.o_proj", "attn_output"},
      {"mlp.gate_proj", "ffn_gate"},    {"mlp.up_proj", "ffn_up"},
      {"mlp.down_proj", "ffn_down"}};
  const std::string prefix = "model.layers.";
  if (n.rfind(prefix, 0) != 0) return "";
  const size_t dot = n.find('.', prefix.size());
  const std::string index = n.substr(prefix.size(), dot - prefix.size());
  const size_t last = n.rfind('.');
  const std::string module = n.substr(dot + 1, last - dot - 1), kind = n.substr(last + 1);
  auto it = layer.find(module);
  if (it == layer.end()) return "";
  return "blk." + index + "." + it->second + "." + kind;
}

// llama.cpp's "llama" rotary layout: each head's rows (x0..x_{d/2-1}, y0..) interleaved.
Tensor permute_heads(const Tensor& w, int64_t heads) {
  const int64_t rows = w.shape()[0], cols = w.numel() / rows, half = rows / heads / 2;
  ONYX_CHECK(rows % (2 * heads) == 0, "gguf: cannot permute ", shape_str(w.shape()), " over ",
             heads, " heads");
  Tensor out(DType::Float32, w.shape());
  const float* s = w.data<float>();
  float* d = out.data<float>();
  for (int64_t h = 0; h < heads; h++)
    for (int64_t two = 0; two < 2; two++)
      for (int64_t i = 0; i < half; i++) {
        const int64_t from = (h * 2 + two) * half + i, to = (h * half + i) * 2 + two;
        std::copy(s + from * cols, s + (from + 1) * cols, d + to * cols);
      }
  return out;
}

// Llama 3's rope scaling as llama.cpp reads it: a factor per rotary frequency.
Tensor llama3_rope_factors(const HfConfig& c) {
  const int64_t dim = head_dim(c);
  const double factor = c.rope.factor, low = c.rope.low_freq_factor, high = c.rope.high_freq_factor;
  const double old_len = c.rope.original_max_position_embeddings > 0
                             ? (double)c.rope.original_max_position_embeddings
                             : 8192.0;
  const double low_wavelen = old_len / low, high_wavelen = old_len / high;
  std::vector<float> f;
  for (int64_t i = 0; i < dim; i += 2) {
    const float freq = 1.0f / std::pow((float)c.rope.theta, (float)i / (float)dim);
    const double wavelen = 2 * M_PI / freq;
    if (wavelen < high_wavelen) {
      f.push_back(1.0f);
    } else if (wavelen > low_wavelen) {
      f.push_back((float)factor);
    } else {
      const double smooth = (old_len / wavelen - low) / (high - low);
      f.push_back((float)(1.0 / ((1 - smooth) / factor + smooth)));
    }
  }
  return Tensor::from_vector(DType::Float32, {(int64_t)f.size()}, f);
}

void set_hparams(io::GgufWriter& w, const HfConfig& c, const std::string& arch) {
  w.set(arch + ".vocab_size", (uint32_t)c.vocab_size);
  w.set(arch + ".context_length", (uint32_t)c.max_position_embeddings);
  w.set(arch + ".embedding_length", (uint32_t)c.hidden_size);
  w.set(arch + ".feed_forward_length", (uint32_t)c.intermediate_size);
  w.set(arch + ".block_count", (uint32_t)c.num_hidden_layers);
  w.set(arch + ".attention.head_count", (uint32_t)c.num_attention_heads);
  w.set(arch + ".attention.head_count_kv", (uint32_t)kv_heads(c));
  w.set(arch + ".rope.freq_base", (float)c.rope.theta);
  w.set(arch + ".attention.layer_norm_rms_epsilon", (float)c.layer_norm_eps);
  w.set(arch + ".rope.dimension_count", (uint32_t)head_dim(c));
  if (c.rope.type == "linear") {
    w.set(arch + ".rope.scaling.type", std::string("linear"));
    w.set(arch + ".rope.scaling.factor", (float)c.rope.factor);
  } else {
    ONYX_CHECK(c.rope.type == "default" || c.rope.type == "llama3", "gguf: rope scaling '",
               c.rope.type, "' is not supported (default, linear, llama3)");
  }
}

// ---- the tokenizer ----

struct Vocab {
  std::vector<std::string> tokens;
  std::vector<int32_t> types;  // 1 normal, 3 control, 4 user-defined, 5 unused, 6 byte
  std::vector<std::string> merges;
};

bool is_byte_token(const std::string& t) {
  return t.size() == 6 && t.rfind("<0x", 0) == 0 && t.back() == '>';
}

// The Split regex of tokenizer.json's pre-tokenizer, if any.
std::string split_pattern(const json& pre) {
  if (!pre.is_object()) return "";
  if (pre.value("type", "") == "Split" && pre.contains("pattern") && pre["pattern"].is_object())
    return pre["pattern"].value("Regex", "");
  if (pre.contains("pretokenizers") && pre["pretokenizers"].is_array())
    for (auto& p : pre["pretokenizers"]) {
      std::string s = split_pattern(p);
      if (!s.empty()) return s;
    }
  return "";
}

// tokenizer.ggml.pre: llama.cpp's name for the pre-tokenizer (its converter identifies it by a
// hash of tokenized text; here by the Split regex itself).
std::string pre_tokenizer_name(const json& tok) {
  const std::string re = split_pattern(tok.value("pre_tokenizer", json()));
  if (re.find("\\p{N}{1,3}") != std::string::npos) return "llama-bpe";
  if (re.find("\\p{N}|") != std::string::npos) return "qwen2";
  return re.empty() ? "gpt-2" : "default";
}

Vocab read_vocab(const json& tok, int64_t vocab_size, const std::string& what) {
  const json& model = tok.value("model", json());
  ONYX_CHECK(model.is_object() && model.value("type", "") == "BPE" && model.contains("vocab") &&
                 model["vocab"].is_object(),
             what, ": gguf export needs a BPE tokenizer.json (model.type BPE with a vocab)");
  std::map<int64_t, std::string> by_id;
  for (auto& [t, id] : model["vocab"].items())
    if (id.is_number_integer()) by_id[id.get<int64_t>()] = t;
  std::map<int64_t, bool> added;  // id -> special
  if (tok.contains("added_tokens") && tok["added_tokens"].is_array())
    for (auto& a : tok["added_tokens"]) {
      const int64_t id = a.value("id", (int64_t)-1);
      if (id < 0) continue;
      by_id[id] = a.value("content", std::string());
      added[id] = a.value("special", false);
    }
  const int64_t n = std::max<int64_t>(vocab_size, by_id.empty() ? 0 : by_id.rbegin()->first + 1);
  const bool byte_fallback = model.value("byte_fallback", false);
  Vocab v;
  for (int64_t i = 0; i < n; i++) {
    auto it = by_id.find(i);
    if (it == by_id.end()) {
      v.tokens.push_back("[PAD" + std::to_string(i) + "]");
      v.types.push_back(5);
      continue;
    }
    v.tokens.push_back(it->second);
    auto a = added.find(i);
    if (a != added.end())
      v.types.push_back(a->second ? 3 : 4);
    else if (byte_fallback && is_byte_token(it->second))
      v.types.push_back(6);
    else
      v.types.push_back(1);
  }
  if (model.contains("merges") && model["merges"].is_array())
    for (auto& m : model["merges"]) {
      if (m.is_string())
        v.merges.push_back(m.get<std::string>());
      else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string())
        v.merges.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
    }
  return v;
}

// The id of a special token named by tokenizer_config.json (a string or {content}).
std::optional<int64_t> token_id(const json& cfg, const char* key, const Vocab& v) {
  if (!cfg.contains(key)) return std::nullopt;
  const json& t = cfg[key];
  const std::string s = t.is_string()   ? t.get<std::string>()
                        : t.is_object() ? t.value("content", std::string())
                                        : std::string();
  for (size_t i = 0; i < v.tokens.size(); i++)
    if (!s.empty() && v.tokens[i] == s) return (int64_t)i;
  return std::nullopt;
}

void set_tokenizer(io::GgufWriter& w, const HfConfig& c, const fs::path& dir) {
  const json tok = read_json(dir / "tokenizer.json", true);
  const std::string what = (dir / "tokenizer.json").string();
  const Vocab v = read_vocab(tok, c.vocab_size, what);
  const bool byte_fallback = tok["model"].value("byte_fallback", false);
  w.set("tokenizer.ggml.model", std::string(byte_fallback ? "llama" : "gpt2"));
  if (!byte_fallback) w.set("tokenizer.ggml.pre", pre_tokenizer_name(tok));
  w.set("tokenizer.ggml.tokens", v.tokens);
  if (byte_fallback) w.set("tokenizer.ggml.scores", std::vector<float>(v.tokens.size(), -1000.0f));
  w.set("tokenizer.ggml.token_type", v.types);
  if (!byte_fallback) w.set("tokenizer.ggml.merges", v.merges);
  const json tcfg = read_json(dir / "tokenizer_config.json", false);
  const json mcfg = c.raw_json.empty() ? json() : json::parse(c.raw_json, nullptr, false);
  auto special = [&](const char* cfg_key, const char* tok_key, const char* gguf_key) {
    std::optional<int64_t> id;
    if (mcfg.is_object() && mcfg.contains(cfg_key) && mcfg[cfg_key].is_number_integer())
      id = mcfg[cfg_key].get<int64_t>();
    if (!id && tcfg.is_object()) id = token_id(tcfg, tok_key, v);
    if (id && *id >= 0 && *id < (int64_t)v.tokens.size()) w.set(gguf_key, (uint32_t)*id);
  };
  special("bos_token_id", "bos_token", "tokenizer.ggml.bos_token_id");
  special("eos_token_id", "eos_token", "tokenizer.ggml.eos_token_id");
  special("pad_token_id", "pad_token", "tokenizer.ggml.padding_token_id");
  if (tcfg.is_object()) {
    if (auto id = token_id(tcfg, "unk_token", v))
      w.set("tokenizer.ggml.unknown_token_id", (uint32_t)*id);
    if (tcfg.contains("add_bos_token") && tcfg["add_bos_token"].is_boolean())
      w.set("tokenizer.ggml.add_bos_token", tcfg["add_bos_token"].get<bool>());
    if (tcfg.contains("add_eos_token") && tcfg["add_eos_token"].is_boolean())
      w.set("tokenizer.ggml.add_eos_token", tcfg["add_eos_token"].get<bool>());
    if (tcfg.contains("chat_template") && tcfg["chat_template"].is_string())
      w.set("tokenizer.chat_template", tcfg["chat_template"].get<std::string>());
  }
  std::ifstream jinja(dir / "chat_template.jinja");
  if (jinja) {
    std::stringstream ss;
    ss << jinja.rdbuf();
    w.set("tokenizer.chat_template", ss.str());
  }
}

// The type tensor `g` (llama.cpp's name) is stored as in a file of matrices of type `type`: norms
// and biases F32, as the converter keeps them; a block type whose rows are not whole blocks F16 (as
// the converter and llama-quantize fall back); under Q4_0 the output head (`head`: output.weight,
// or token_embd.weight when the embeddings are tied) Q8_0 — llama-quantize keeps the head at more
// bits (Q6_K, a k-quant onyx does not write; Q8_0 where rows are not 256-blocks).
io::GgmlType tensor_type(io::GgmlType type, bool head, const Tensor& t) {
  if (t.rank() <= 1) return io::GgmlType::F32;
  if (io::is_block_type(type) && t.shape().back() % 32 != 0) return io::GgmlType::F16;
  if (type == io::GgmlType::Q4_0 && head) return io::GgmlType::Q8_0;
  return type;
}

}  // namespace

int write_gguf(const HfConfig& c, const std::map<std::string, Tensor>& weights,
               const std::string& tokenizer_dir, const std::string& path,
               const GgufExportOptions& o) {
  const std::string arch = gguf_arch(c);
  io::GgufWriter w;
  w.set("general.architecture", arch);
  w.set("general.name", o.name.empty() ? fs::path(tokenizer_dir).filename().string() : o.name);
  w.set("general.file_type", io::gguf_file_type(o.type));
  if (io::is_block_type(o.type)) w.set("general.quantization_version", (uint32_t)2);
  set_hparams(w, c, arch);
  set_tokenizer(w, c, fs::path(tokenizer_dir));
  int n = 0;
  if (c.rope.type == "llama3") {
    w.add_tensor("rope_freqs.weight", llama3_rope_factors(c), io::GgmlType::F32);
    n++;
  }
  bool has_output = false;
  for (auto& [name, t] : weights) has_output |= gguf_name(name) == "output.weight";
  for (auto& [name, t] : weights) {
    const std::string g = gguf_name(name);
    if (g.empty()) continue;
    ONYX_CHECK(t.dtype() == DType::Float32, "gguf: '", name, "' is ", dtype_name(t.dtype()),
               ", expected float32 (merged and dequantized)");
    Tensor data = t;
    if (arch == "llama" && name.find("self_attn.q_proj.") != std::string::npos)
      data = permute_heads(t, c.num_attention_heads);
    if (arch == "llama" && name.find("self_attn.k_proj.") != std::string::npos)
      data = permute_heads(t, kv_heads(c));
    const bool head = g == "output.weight" || (!has_output && g == "token_embd.weight");
    w.add_tensor(g, data, tensor_type(o.type, head, t));
    n++;
  }
  w.write(path);
  return n;
}

}  // namespace onyx::models
