// hf_weights.cc — see hf_weights.h.
#include "models/hf_weights.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>

#include "io/safetensors.h"
#include "ir/graph.h"
#include "quant/store_4bit.h"

namespace onyx::models {
namespace fs = std::filesystem;

namespace {

std::string read_text(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  ONYX_CHECK(f, p.string(), ": cannot open");
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
bool starts_with(const std::string& s, const std::string& prefix) {
  return s.rfind(prefix, 0) == 0;
}

}  // namespace

Tensor to_float32(const Tensor& t) {
  if (!is_float(t.dtype())) return t;
  Tensor out(DType::Float32, t.shape());
  float* y = out.data<float>();
  int64_t n = t.numel();
  switch (t.dtype()) {
    case DType::Float16:
      for (int64_t i = 0; i < n; i++) y[i] = half_to_float(t.data<uint16_t>()[i]);
      break;
    case DType::BFloat16:
      for (int64_t i = 0; i < n; i++) y[i] = bf16_to_float(t.data<uint16_t>()[i]);
      break;
    case DType::Float64:
      for (int64_t i = 0; i < n; i++) y[i] = (float)t.data<double>()[i];
      break;
    default:
      if (n) std::memcpy(y, t.raw(), t.nbytes());
  }
  return out;
}

namespace {

// A checkpoint tensor as an owned float32 tensor: an owned float32 one as it is; a view of a mapped
// file (`mapped`) copied, its pages then dropped (io::release_pages); another float dtype
// converted.
Tensor owned_float32(const Tensor& t, bool mapped) {
  if (!is_float(t.dtype()) || (t.dtype() == DType::Float32 && !mapped)) return t;
  Tensor out = to_float32(t);
  if (mapped) io::release_pages(t);
  return out;
}

// A checkpoint tensor for a weight stored bf16 (HfConfig::bf16_linears): bf16 copied as it is,
// another float dtype read as float32 and rounded to nearest even (ir::store_initializer_bf16's
// rounding, so the bits are those of converting after the build).
Tensor owned_bf16(const Tensor& t, bool mapped) {
  Tensor out(DType::BFloat16, t.shape());
  if (t.dtype() == DType::BFloat16) {
    std::memcpy(out.raw(), t.raw(), t.nbytes());
  } else {
    const Tensor f = to_float32(t);
    const float* x = f.data<float>();
    uint16_t* y = out.data<uint16_t>();
    for (int64_t i = 0; i < f.numel(); i++) y[i] = float_to_bf16(x[i]);
  }
  if (mapped) io::release_pages(t);
  return out;
}

std::string list(const std::vector<std::string>& names) {
  std::string s = "[";
  for (size_t i = 0; i < names.size(); i++) s += (i ? ", '" : "'") + names[i] + "'";
  return s + "]";
}

bool bit_equal(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// Buffers Transformers keeps in state_dicts that are not weights.
bool is_buffer(const std::string& model_type, const std::string& k) {
  if (ends_with(k, "position_ids")) return true;
  if (ends_with(k, "rotary_emb.inv_freq")) return true;  // older Llama-family checkpoints
  if (model_type == "gpt2" && (ends_with(k, ".attn.bias") || ends_with(k, ".attn.masked_bias")))
    return true;
  return false;
}

// Tensors Transformers drops silently for a task (its _keys_to_ignore_on_load_unexpected).
bool ignored_unexpected(const BuiltModel& m, const std::string& k) {
  const std::string& t = m.config.model_type;
  if ((t == "bert" || t == "roberta") && m.task != Task::Base &&
      m.task != Task::SequenceClassification)
    return k.find("pooler.") != std::string::npos;
  return false;
}

}  // namespace

std::map<std::string, Tensor> read_hf_checkpoint(const std::string& dir, bool mapped) {
  fs::path d(dir);
  std::map<std::string, Tensor> out;
  fs::path single = d / "model.safetensors", index = d / "model.safetensors.index.json";
  if (fs::exists(single)) {
    auto f = io::load_safetensors(single.string());
    for (auto& [k, t] : f.tensors) {
      out[k] = mapped ? t : to_float32(t);
      if (!mapped && is_float(t.dtype())) io::release_pages(t);  // copied: the pages can go
    }
    return out;
  }
  if (fs::exists(index)) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(read_text(index));
    } catch (const nlohmann::json::exception& e) {
      throw Error(cat(index.string(), ": invalid JSON: ", e.what()));
    }
    ONYX_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(),
               index.string(), ": missing required key 'weight_map' ({tensor name: shard file})");
    std::map<std::string, std::vector<std::string>> by_file;
    for (auto& [name, file] : j["weight_map"].items()) {
      ONYX_CHECK(file.is_string(), index.string(), ": weight_map['", name,
                 "'] must be a file name");
      std::string f = file.get<std::string>();
      ONYX_CHECK(f.find('/') == std::string::npos && f != ".." && !f.empty(), index.string(),
                 ": weight_map['", name, "'] = '", f, "' is not a file name in the folder");
      by_file[f].push_back(name);
    }
    for (auto& [file, names] : by_file) {
      fs::path p = d / file;
      ONYX_CHECK(fs::exists(p), index.string(), ": shard '", file, "' (holding '", names[0],
                 "') does not exist");
      auto f = io::load_safetensors(p.string());
      for (auto& name : names) {
        auto it = f.tensors.find(name);
        ONYX_CHECK(it != f.tensors.end(), p.string(), ": tensor '", name,
                   "' listed in model.safetensors.index.json is not in this shard");
        out[name] = mapped ? it->second : to_float32(it->second);
        if (!mapped && is_float(it->second.dtype())) io::release_pages(it->second);
      }
    }
    return out;
  }
  std::string hint = fs::exists(d / "pytorch_model.bin")
                         ? " (pytorch_model.bin is not read: convert it to safetensors)"
                         : "";
  throw Error(cat(dir, ": no model.safetensors or model.safetensors.index.json", hint));
}

// Whether `w` is read as a MatMul's right-hand side itself (a Conv1D weight, (in, out)), not
// through a Transpose (nn.Linear's (out, in)).
bool read_as_matmul_rhs(const ir::Graph& g, const std::string& w) {
  for (const ir::Node& n : g.nodes)
    if (n.op_type == "MatMul" && n.domain.empty() && n.inputs.size() == 2 && n.inputs[1] == w)
      return true;
  return false;
}

// The weights a folder saved quantized holds in bitsandbytes' 4-bit format (Transformers' names:
// W, W.absmax, ...), stored so in the graph (quant/store_4bit.h) and taken out of `mapped`; returns
// the graph initializers they fill (the weights and their absmax companions).
std::set<std::string> store_4bit_weights(BuiltModel& m, std::map<std::string, Tensor>& mapped,
                                         const std::string& what) {
  ir::Graph& g = *m.model.graph;
  std::set<std::string> loaded;
  auto mark_loaded = [&](const std::string& k) {  // the weight and its absmax companions
    loaded.insert(k);
    for (const char* s : {".absmax", ".nested_absmax", ".nested_quant_map"})
      if (g.initializers.count(k + s)) loaded.insert(k + s);
  };
  const std::vector<std::string> order = g.initializer_order;
  for (const std::string& k : order) {
    const Tensor& cur = g.initializers.at(k);
    auto f = mapped.find(k);
    if (cur.dtype() == DType::UInt8 && m.config.quantization && f != mapped.end() &&
        is_float(f->second.dtype())) {
      // built 4-bit (QLoRA) from a float checkpoint: quantized as it is read
      const Tensor w = owned_float32(f->second, /*views=*/true);
      quant::replace_4bit_state(
          g, k, quant::quantize_4bit(w, *m.config.quantization, what + ": '" + k + "'"));
      mapped.erase(f);
      mark_loaded(k);
      continue;
    }
    if (!quant::is_hf_4bit(mapped, k)) continue;
    ONYX_CHECK(m.config.quantization, what, ": '", k,
               "' is stored 4-bit but config.json has no "
               "quantization_config");
    quant::Quant4 q = quant::read_hf_4bit(mapped, k, what);
    if (cur.dtype() == DType::UInt8) {  // built 4-bit already: the folder's state replaces it
      quant::replace_4bit_state(g, k, q);
    } else {
      // A Conv1D weight (in, out) is stored quantized as nn.Linear's (out, in).
      const bool conv1d = read_as_matmul_rhs(g, k);
      const Shape want = conv1d && cur.rank() == 2 ? Shape{cur.dim(1), cur.dim(0)} : cur.shape();
      ONYX_CHECK(q.shape == want && cur.dtype() == DType::Float32, what, ": the 4-bit weight '", k,
                 "' has shape ", shape_str(q.shape), ", the model expects ", shape_str(want),
                 conv1d ? " (a Conv1D weight, quantized transposed)" : "");
      quant::store_initializer_4bit(g, k, q, m.config.quantization->compute_dtype, conv1d);
    }
    for (auto it = mapped.begin(); it != mapped.end();)
      it = it->first == k || starts_with(it->first, k + ".") ? mapped.erase(it) : std::next(it);
    mark_loaded(k);
  }
  return loaded;
}

void apply_hf_checkpoint(BuiltModel& m, const std::map<std::string, Tensor>& tensors,
                         const std::string& what, bool views) {
  ir::Graph& g = *m.model.graph;
  const std::string arch = architecture_name(m.config.model_type, m.task);
  std::set<std::string> expected(g.initializer_order.begin(), g.initializer_order.end());
  std::map<std::string, std::string> tied(m.tied.begin(), m.tied.end());

  // 1. Names as Transformers fixes them: gamma/beta -> weight/bias; buffers dropped.
  std::map<std::string, Tensor> named;
  for (auto& [k0, t] : tensors) {
    std::string k = k0;
    if (ends_with(k, ".gamma")) k = k.substr(0, k.size() - 6) + ".weight";
    if (ends_with(k, ".beta")) k = k.substr(0, k.size() - 5) + ".bias";
    if (is_buffer(m.config.model_type, k)) continue;
    named[k] = t;
  }
  // 2. The base-model prefix: a bare checkpoint into a model with a head gets it added, a
  // checkpoint with a head into the bare model gets it stripped.
  std::string prefix = base_model_prefix(m.config.model_type) + ".";
  bool has_prefix = false, expects_prefix = false;
  for (auto& [k, t] : named) has_prefix |= starts_with(k, prefix);
  for (auto& k : expected) expects_prefix |= starts_with(k, prefix);
  for (auto& [k, src] : tied) expects_prefix |= starts_with(k, prefix);
  std::map<std::string, Tensor> mapped;
  for (auto& [k, t] : named) {
    std::string n = k;
    if (expects_prefix && !has_prefix && (expected.count(prefix + k) || tied.count(prefix + k)))
      n = prefix + k;
    else if (has_prefix && !expects_prefix && starts_with(k, prefix))
      n = k.substr(prefix.size());
    mapped[n] = t;
  }
  // 3. Weights in, shapes checked; 4-bit ones (a folder saved quantized) in their format.
  std::set<std::string> loaded = store_4bit_weights(m, mapped, what);
  std::vector<std::string> unexpected;
  for (auto& [k, t] : mapped) {
    if (tied.count(k)) continue;  // checked below
    if (!expected.count(k)) {
      if (!ignored_unexpected(m, k)) unexpected.push_back(k);
      continue;
    }
    const Tensor& cur = g.initializers.at(k);
    ONYX_CHECK(is_float(t.dtype()), what, ": tensor '", k, "' has dtype ", dtype_name(t.dtype()),
               "; model weights must be F32, F16 or BF16");
    ONYX_CHECK(t.shape() == cur.shape(), what, ": size mismatch for '", k,
               "': the checkpoint has shape ", shape_str(t.shape()), ", the model (", arch,
               ") expects ", shape_str(cur.shape()));
    // (frees the initializer it replaces)
    g.initializers[k] =
        cur.dtype() == DType::BFloat16 ? owned_bf16(t, views) : owned_float32(t, views);
    loaded.insert(k);
  }
  // 4. Tied copies: equal to their source is the normal case; alone, they stand in for it.
  for (auto& [name, src] : tied) {
    auto it = mapped.find(name);
    if (it == mapped.end()) continue;
    const Tensor& cur = g.initializers.at(src);
    if (!loaded.count(src) && is_float(it->second.dtype()) && it->second.shape() == cur.shape()) {
      g.initializers[src] = owned_float32(it->second, views);
      loaded.insert(src);
    } else if (!loaded.count(src) ||
               !bit_equal(owned_float32(it->second, views), g.initializers.at(src))) {
      std::cerr << "Warning: " << what << ": '" << name << "' differs from '" << src
                << "', which it is tied to; '" << src << "' is used.\n";
    }
  }
  std::vector<std::string> missing;
  for (auto& k : g.initializer_order)
    if (!loaded.count(k)) missing.push_back(k);
  m.missing_keys = missing;
  m.unexpected_keys = unexpected;
  if (!unexpected.empty())
    std::cerr << "Some weights of the model checkpoint at " << what
              << " were not used when initializing " << arch << ": " << list(unexpected) << "\n";
  if (!missing.empty())
    std::cerr
        << "Some weights of " << arch << " were not initialized from the model checkpoint at "
        << what << " and are newly initialized: " << list(missing)
        << "\nYou should probably TRAIN this model on a down-stream task to be able to use it "
           "for predictions and inference.\n";
}

BuiltModel load_hf_folder(const std::string& dir, std::optional<Task> task, int64_t seed,
                          const std::optional<quant::BnbConfig>& quantize, bool bf16_linears) {
  fs::path d(dir);
  ONYX_CHECK(fs::is_directory(d), dir, ": not a folder");
  fs::path cfg = d / "config.json";
  ONYX_CHECK(fs::exists(cfg), dir, ": no config.json in the folder");
  HfConfig c = parse_hf_config(read_text(cfg), cfg.string());
  if (quantize && !c.quantization) c.quantization = quantize;
  c.bf16_linears = bf16_linears && !c.quantization;
  if (!task) {
    task = Task::Base;
    if (!c.architectures.empty()) {
      task = task_from_architecture(c.architectures[0]);
      ONYX_CHECK(
          task, cfg.string(), ": architecture '", c.architectures[0],
          "' is not one onyx knows (...ForSequenceClassification, ...ForTokenClassification, "
          "...ForMaskedLM, ...LMHeadModel, ...ForImageClassification, ...Model)");
    }
  }
  BuiltModel m = build_hf_model(c, *task, seed);
  m.model.source = dir;
  apply_hf_checkpoint(m, read_hf_checkpoint(dir, /*mapped=*/true), dir, /*mapped=*/true);
  return m;
}

std::map<std::string, Tensor> hf_weights(const BuiltModel& m) {
  std::map<std::string, Tensor> out;
  for (auto& k : m.model.graph->initializer_order) out[k] = m.model.graph->initializers.at(k);
  return out;
}

void save_hf_folder(const BuiltModel& m, const std::map<std::string, Tensor>& weights,
                    const std::string& dir) {
  const ir::Graph& g = *m.model.graph;
  for (auto& [k, t] : weights)
    ONYX_CHECK(g.initializers.count(k), "save_hf_folder: '", k, "' is not a weight of ",
               architecture_name(m.config.model_type, m.task));
  std::map<std::string, Tensor> out;
  for (auto& k : g.initializer_order) {
    const Tensor& cur = g.initializers.at(k);
    auto it = weights.find(k);
    Tensor t = it != weights.end() ? it->second : cur;
    ONYX_CHECK(t.shape() == cur.shape(), "save_hf_folder: '", k, "' has shape ",
               shape_str(t.shape()), ", the model expects ", shape_str(cur.shape()));
    ONYX_CHECK(is_float(t.dtype()), "save_hf_folder: '", k, "' has dtype ", dtype_name(t.dtype()));
    out[k] = to_float32(t);
  }
  fs::path d(dir);
  std::error_code ec;
  fs::create_directories(d, ec);
  ONYX_CHECK(fs::is_directory(d), dir, ": cannot create the folder: ", ec.message());
  io::save_safetensors((d / "model.safetensors").string(), out, {{"format", "pt"}},
                       g.initializer_order);
  io::write_file_atomic(
      (d / "config.json").string(),
      hf_config_to_json(m.config, architecture_name(m.config.model_type, m.task)));
  // An earlier sharded save would shadow nothing (model.safetensors is read first) but wastes
  // space: remove it, as Transformers' save_pretrained does.
  static const std::regex shard(R"(model-\d+-of-\d+\.safetensors)");
  for (auto& e : fs::directory_iterator(d, ec)) {
    std::string name = e.path().filename().string();
    if (name == "model.safetensors.index.json" || std::regex_match(name, shard))
      fs::remove(e.path(), ec);
  }
}

std::set<std::string> defaulted_inputs(const BuiltModel& m) {
  std::set<std::string> out;
  for (const char* n : {"attention_mask", "token_type_ids", "position_ids", "decoder_input_ids"})
    if (m.model.graph->find_input(n)) out.insert(n);
  return out;
}

// Transformers' shift_tokens_right: labels (B,T) one to the right, the start token first, -100
// read as the padding token.
static Tensor shift_tokens_right(const Tensor& labels, int64_t pad, int64_t start) {
  ONYX_CHECK(labels.dtype() == DType::Int64 && labels.rank() == 2,
             "labels must be int64 (batch, length) to make decoder_input_ids from, got ",
             dtype_name(labels.dtype()), " ", shape_str(labels.shape()));
  Tensor out(DType::Int64, labels.shape());
  const int64_t rows = labels.dim(0), cols = labels.dim(1);
  const int64_t* l = labels.data<int64_t>();
  int64_t* o = out.data<int64_t>();
  for (int64_t r = 0; r < rows; r++)
    for (int64_t t = 0; t < cols; t++) {
      const int64_t v = t == 0 ? start : l[r * cols + t - 1];
      o[r * cols + t] = v == -100 ? pad : v;
    }
  return out;
}

std::function<void(std::map<std::string, Tensor>&)> default_input_filler(const BuiltModel& m) {
  std::set<std::string> names = defaulted_inputs(m);
  const int64_t pad = m.config.pad_token_id, start = m.config.s2s.decoder_start_token_id;
  // learned decoder positions (Whisper's max_target_positions, BART's max_position_embeddings)
  const std::string type = m.config.model_type;
  const int64_t positions =
      type == "whisper" || type == "bart" ? m.config.max_position_embeddings : 0;
  return [names, pad, start, type, positions](std::map<std::string, Tensor>& inputs) {
    auto labels = inputs.find("labels");
    if (names.count("decoder_input_ids") && !inputs.count("decoder_input_ids") &&
        labels != inputs.end())
      inputs["decoder_input_ids"] = shift_tokens_right(labels->second, pad, start);
    auto dec = inputs.find("decoder_input_ids");
    if (positions && dec != inputs.end() && dec->second.rank() == 2)
      ONYX_CHECK(dec->second.dim(1) <= positions, "decoder inputs (labels) of ", dec->second.dim(1),
                 " tokens: the ", type, " decoder has ", positions, " positions (",
                 type == "whisper" ? "max_target_positions" : "max_position_embeddings",
                 "); truncate the labels to at most that");
    auto ids = inputs.find("input_ids");
    if (ids == inputs.end()) return;
    Shape s = ids->second.shape();
    if (names.count("attention_mask") && !inputs.count("attention_mask")) {
      Tensor ones(DType::Int64, s);
      std::fill(ones.data<int64_t>(), ones.data<int64_t>() + ones.numel(), 1);
      inputs["attention_mask"] = ones;
    }
    if (names.count("token_type_ids") && !inputs.count("token_type_ids"))
      inputs["token_type_ids"] = Tensor::zeros(DType::Int64, s);
    if (names.count("position_ids") && !inputs.count("position_ids") && s.size() == 2) {
      Tensor pos(DType::Int64, s);  // 0..T-1 in every row
      int64_t* p = pos.data<int64_t>();
      for (int64_t i = 0; i < pos.numel(); i++) p[i] = i % s[1];
      inputs["position_ids"] = pos;
    }
  };
}

void fill_default_inputs(const BuiltModel& m, std::map<std::string, Tensor>& inputs) {
  default_input_filler(m)(inputs);
}

}  // namespace onyx::models
