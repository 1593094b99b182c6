// models/lora.cc — LoRA adapters on a graph, PEFT's adapter_config.json (see lora.h).
#include "models/lora.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <set>
#include <sstream>

#include "io/json.h"
#include "ir/bf16_storage.h"
#include "models/graph_builder.h"
#include "onyx/error.h"
#include "quant/store_4bit.h"

namespace fs = std::filesystem;

namespace onyx::models {
namespace {

bool ends_with(const std::string& s, const std::string& t) {
  return s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
}

bool matches(const LoraSpec& spec, const std::string& module) {
  if (!spec.target_regex.empty()) return std::regex_match(module, std::regex(spec.target_regex));
  for (auto& t : spec.target_modules)
    if (module == t || ends_with(module, "." + t)) return true;
  return false;
}

// The graph's linear layers: "<module>.weight" (rank 2) transposed into a MatMul (nn.Linear) or a
// MatMul's right-hand side (Conv1D). module -> (index of the MatMul node, conv1d)
std::map<std::string, std::pair<size_t, bool>> linear_layers(const ir::Graph& g) {
  std::map<std::string, std::vector<size_t>> users;
  for (size_t i = 0; i < g.nodes.size(); i++)
    for (auto& in : g.nodes[i].inputs) users[in].push_back(i);
  std::map<std::string, std::pair<size_t, bool>> out;
  for (auto& [wname, w] : g.initializers) {
    if (!ends_with(wname, ".weight")) continue;
    const std::string module = wname.substr(0, wname.size() - 7);
    // a weight stored 4-bit is read through its Dequantize4Bit (quant/store_4bit.h), one stored
    // bf16 through its Cast to float32 (ir/bf16_storage.h)
    std::string read = wname;
    const ir::Node* only = users[wname].size() == 1 ? &g.nodes[users[wname][0]] : nullptr;
    if (only && (only->op_type == "Dequantize4Bit" ||
                 (only->op_type == "Cast" && w.dtype() == DType::BFloat16 &&
                  only->attr_int("to", 0) == (int64_t)DType::Float32)))
      read = only->outputs[0];
    else if (w.rank() != 2)
      continue;
    for (size_t u : users[read]) {
      const ir::Node& n = g.nodes[u];
      if (n.op_type == "Transpose" && n.domain.empty()) {
        for (size_t v : users[n.outputs[0]])
          if (g.nodes[v].op_type == "MatMul" && g.nodes[v].inputs.size() == 2 &&
              g.nodes[v].inputs[1] == n.outputs[0])
            out[module] = {v, false};
      } else if (n.op_type == "MatMul" && n.inputs.size() == 2 && n.inputs[1] == read) {
        out[module] = {u, true};
      }
    }
  }
  return out;
}

// The float shape of a weight: its own, or (stored 4-bit) the one its Dequantize4Bit gives.
Shape float_weight_shape(const ir::Graph& g, const std::string& w) {
  for (const ir::Node& n : g.nodes)
    if (n.op_type == "Dequantize4Bit" && !n.inputs.empty() && n.inputs[0] == w) {
      const Shape s = n.attr_ints("shape");  // the quantized matrix, transposed for a Conv1D
      return n.attr_int("transpose", 0) && s.size() == 2 ? Shape{s[1], s[0]} : s;
    }
  return g.initializers.at(w).shape();
}

}  // namespace

std::vector<std::string> merge_lora(ir::Graph& g, const LoraSpec& spec,
                                    const std::map<std::string, Tensor>& adapter) {
  const double s = spec.use_rslora ? spec.lora_alpha / std::sqrt((double)spec.r)
                                   : spec.lora_alpha / (double)spec.r;
  auto layers = linear_layers(g);
  const std::string prefix = kPeftPrefix;
  std::vector<std::string> merged;
  for (auto& [saved, t] : adapter) {
    ONYX_CHECK(saved.rfind(prefix, 0) == 0, "merge_lora: adapter tensor '", saved,
               "' does not start with '", prefix, "'");
    std::string name = saved.substr(prefix.size());
    if (ends_with(name, ".lora_B.weight")) continue;  // with its lora_A
    if (ends_with(name, ".lora_A.weight")) {
      std::string module = name.substr(0, name.size() - 14);
      auto it = layers.find(module);
      ONYX_CHECK(it != layers.end(), "merge_lora: adapter tensor '", saved,
                 "' names no linear layer of the model");
      auto bt = adapter.find(prefix + module + ".lora_B.weight");
      ONYX_CHECK(bt != adapter.end(), "merge_lora: '", saved, "' has no lora_B");
      const Tensor& A = t;           // (r, in)
      const Tensor& B = bt->second;  // (out, r)
      Tensor& W = g.initializers.at(module + ".weight");
      const bool conv1d = it->second.second;
      const int64_t r = A.dim(0), in = A.dim(1), out = B.dim(0);
      ONYX_CHECK(B.dim(1) == r && W.dtype() == DType::Float32 &&
                     W.shape() == (conv1d ? Shape{in, out} : Shape{out, in}),
                 "merge_lora: '", module, "': adapter shapes ", shape_str(A.shape()), " / ",
                 shape_str(B.shape()), " do not fit the weight ", shape_str(W.shape()));
      Tensor Wm = W.clone();
      float* w = Wm.data<float>();
      const float* a = A.data<float>();
      const float* b = B.data<float>();
      for (int64_t o = 0; o < out; o++)
        for (int64_t i = 0; i < in; i++) {
          double acc = 0;
          for (int64_t k = 0; k < r; k++) acc += (double)b[o * r + k] * (double)a[k * in + i];
          w[conv1d ? i * out + o : o * in + i] += (float)(s * acc);
        }
      W = Wm;
      merged.push_back(module);
    } else {  // a trained bias
      auto it = g.initializers.find(name);
      ONYX_CHECK(it != g.initializers.end() && it->second.meta() == t.meta(),
                 "merge_lora: adapter tensor '", saved, "' names no parameter of that shape");
      it->second = t.clone();
    }
  }
  return merged;
}

LoraSpec read_adapter_config(const std::string& path_in) {
  std::string path = path_in;
  if (fs::is_directory(path)) path = (fs::path(path) / "adapter_config.json").string();
  std::ifstream f(path);
  ONYX_CHECK(f.good(), "peft_config: cannot read '", path, "'");
  std::stringstream ss;
  ss << f.rdbuf();
  return parse_adapter_config(ss.str(), path);
}

LoraSpec parse_adapter_config(const std::string& text, const std::string& path) {
  nlohmann::json j = io::parse_json(text, "'" + path + "'");
  ONYX_CHECK(j.is_object(), "'", path, "': expected a JSON object");
  std::string type = j.value("peft_type", "LORA");
  ONYX_CHECK(type == "LORA", "'", path, "': peft_type '", type, "' is not supported (LORA)");
  LoraSpec s;
  try {
    s.r = j.value("r", (int64_t)8);
    s.lora_alpha = j.value("lora_alpha", 8.0);
    s.lora_dropout = j.value("lora_dropout", 0.0);
    s.bias = j.value("bias", std::string("none"));
    s.use_rslora = j.value("use_rslora", false);
    if (j.contains("task_type") && j["task_type"].is_string()) s.task_type = j["task_type"];
    if (j.contains("base_model_name_or_path") && j["base_model_name_or_path"].is_string())
      s.base_model_name_or_path = j["base_model_name_or_path"];
    auto& t = j.at("target_modules");
    if (t.is_string())
      s.target_regex = t.get<std::string>();
    else
      s.target_modules = t.get<std::vector<std::string>>();
    if (j.contains("modules_to_save") && !j["modules_to_save"].is_null())
      ONYX_CHECK(j["modules_to_save"].empty(), "'", path,
                 "': modules_to_save is not supported (LoRA adapters only)");
    if (j.contains("use_dora"))
      ONYX_CHECK(!j["use_dora"].get<bool>(), "'", path, "': DoRA is not supported");
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error(cat("'", path, "': missing or ill-typed key: ", e.what()));
  }
  ONYX_CHECK(s.r > 0, "'", path, "': r must be positive, got ", s.r);
  ONYX_CHECK(std::isfinite(s.lora_alpha), "'", path, "': lora_alpha must be a finite number");
  ONYX_CHECK(s.bias == "none" || s.bias == "all" || s.bias == "lora_only", "'", path, "': bias '",
             s.bias, "' is not one of none, all, lora_only");
  ONYX_CHECK(s.lora_dropout >= 0 && s.lora_dropout < 1, "'", path,
             "': lora_dropout must be in [0, 1)");
  return s;
}

std::string adapter_config_json(const LoraSpec& s) {
  nlohmann::ordered_json j;
  j["peft_type"] = "LORA";
  if (s.task_type.empty())
    j["task_type"] = nullptr;  // a model PEFT has no task for (a diffusers UNet)
  else
    j["task_type"] = s.task_type;
  j["base_model_name_or_path"] = s.base_model_name_or_path;
  j["r"] = s.r;
  j["lora_alpha"] = s.lora_alpha;
  j["lora_dropout"] = s.lora_dropout;
  if (!s.target_regex.empty())
    j["target_modules"] = s.target_regex;
  else
    j["target_modules"] = s.target_modules;
  j["bias"] = s.bias;
  j["use_rslora"] = s.use_rslora;
  j["fan_in_fan_out"] = false;
  j["modules_to_save"] = nullptr;
  j["init_lora_weights"] = true;
  j["inference_mode"] = true;
  j["use_dora"] = false;
  return j.dump(2) + "\n";
}

LoraResult apply_lora(ir::Graph& g, const LoraSpec& spec, uint64_t seed,
                      const std::map<std::string, Tensor>& initial) {
  ONYX_CHECK(spec.r > 0, "lora: r must be positive, got ", spec.r);
  ONYX_CHECK(!spec.target_modules.empty() || !spec.target_regex.empty(),
             "lora: target_modules is empty");
  const float scale = (float)(spec.use_rslora ? spec.lora_alpha / std::sqrt((double)spec.r)
                                              : spec.lora_alpha / (double)spec.r);
  // consumers of each value
  std::map<std::string, std::vector<size_t>> users;
  for (size_t i = 0; i < g.nodes.size(); i++)
    for (auto& in : g.nodes[i].inputs) users[in].push_back(i);
  LoraResult res;
  std::vector<std::string> linears;  // every linear layer seen, for the error message
  std::vector<ir::Node> added;
  std::map<std::string, std::string> rename;  // old output -> adapted output
  std::set<std::string> trainable_bias;
  // candidates, found before any adapter is added; a copy of each MatMul (g.nodes grows later)
  for (auto& [module, site] : linear_layers(g)) {
    const Shape ws = float_weight_shape(g, module + ".weight");
    const ir::Node mm_node = g.nodes[site.first];
    const ir::Node* mm = &mm_node;
    const bool conv1d = site.second;
    linears.push_back(module);
    if (!matches(spec, module)) continue;
    const int64_t in = conv1d ? ws[0] : ws[1], out = conv1d ? ws[1] : ws[0];
    // the layer's output: the MatMul's, or the bias Add's right after it
    std::string y = mm->outputs[0];
    if (users[y].size() == 1) {
      const ir::Node& a = g.nodes[users[y][0]];
      if (a.op_type == "Add" && a.domain.empty()) {
        const std::string& other = a.inputs[0] == y ? a.inputs[1] : a.inputs[0];
        if (g.initializers.count(other) && g.initializers.at(other).rank() == 1) {
          y = a.outputs[0];
          if (spec.bias == "lora_only") trainable_bias.insert(other);
        }
      }
    }
    const std::string A = module + ".lora_A.weight", B = module + ".lora_B.weight";
    const std::string pA = kPeftPrefix + A, pB = kPeftPrefix + B;
    auto init_or = [&](const std::string& saved, const Shape& shape, const Tensor& fallback) {
      auto it = initial.find(saved);
      if (it == initial.end()) return fallback;
      ONYX_CHECK(it->second.dtype() == DType::Float32 && it->second.shape() == shape,
                 "lora: the initial adapter's '", saved, "' is ", dtype_name(it->second.dtype()),
                 shape_str(it->second.shape()), ", the model needs float32", shape_str(shape));
      return it->second.clone();
    };
    // PEFT: kaiming_uniform_(A, a=sqrt(5)) = U(-1/sqrt(in), 1/sqrt(in)); B = 0
    Tensor a0 = init_parameter(seed, A, {spec.r, in}, Init::uniform(1.0 / std::sqrt((double)in)));
    g.add_initializer(A, init_or(pA, {spec.r, in}, a0));
    g.add_initializer(B, init_or(pB, {out, spec.r}, Tensor::zeros(DType::Float32, {out, spec.r})));
    res.adapter_tensors[A] = pA;
    res.adapter_tensors[B] = pB;
    res.trainable.push_back(A);
    res.trainable.push_back(B);
    res.modules.push_back(module);
    // y' = y + ((dropout(x) @ A^T) @ B^T) * scale
    const std::string base = module + "/lora";
    auto node = [&](const std::string& op, std::vector<std::string> ins, const std::string& o,
                    std::map<std::string, ir::Attribute> attrs = {}) {
      ir::Node n;
      n.op_type = op;
      n.name = base + "/" + op + "_" + std::to_string(added.size());
      n.inputs = std::move(ins);
      n.outputs = {o};
      n.attrs = std::move(attrs);
      added.push_back(n);
      return o;
    };
    // scalars as Constant nodes, not initializers: they are no weights (nothing to train, freeze
    // or save)
    auto constant = [&](const std::string& o, const Tensor& t) {
      return node("Constant", {}, o, {{"value", ir::Attribute::of_tensor(t)}});
    };
    std::string x = mm->inputs[0];
    if (spec.lora_dropout > 0) {
      Tensor t = Tensor::zeros(DType::Bool, {});
      *static_cast<bool*>(t.raw()) = true;
      std::string ratio =
          constant(base + "/dropout_p",
                   Tensor::from_vector<float>(DType::Float32, {}, {(float)spec.lora_dropout}));
      x = node("Dropout", {x, ratio, constant(base + "/dropout_train", t)}, base + "/x");
    }
    std::string at =
        node("Transpose", {A}, base + "/At", {{"perm", ir::Attribute::of_ints({1, 0})}});
    std::string bt =
        node("Transpose", {B}, base + "/Bt", {{"perm", ir::Attribute::of_ints({1, 0})}});
    std::string h = node("MatMul", {x, at}, base + "/h");
    std::string d = node("MatMul", {h, bt}, base + "/delta");
    std::string s_ =
        constant(base + "/scale", Tensor::from_vector<float>(DType::Float32, {}, {scale}));
    std::string ds = node("Mul", {d, s_}, base + "/scaled");
    rename[y] = node("Add", {y, ds}, base + "/out");
  }
  if (res.modules.empty()) {
    std::string have;
    for (size_t i = 0; i < linears.size() && i < 12; i++) have += (i ? ", " : "") + linears[i];
    if (linears.size() > 12) have += ", ...";
    std::string want;
    for (auto& t : spec.target_modules) want += (want.empty() ? "" : ", ") + t;
    if (!spec.target_regex.empty()) want = "regex " + spec.target_regex;
    throw Error(cat(
        "lora: target_modules (", want,
        ") match no linear layer of the model (it has: ", have.empty() ? "none found" : have, ")"));
  }
  // consumers of an adapted layer read y' instead (the adapter's own Add keeps y)
  for (auto& n : g.nodes)
    for (auto& in : n.inputs) {
      auto it = rename.find(in);
      if (it != rename.end()) in = it->second;
    }
  for (auto& o : g.outputs) {
    auto it = rename.find(o.name);
    ONYX_CHECK(it == rename.end(), "lora: adapted layer output '", o.name,
               "' is a graph output (not supported)");
  }
  for (auto& n : added) g.nodes.push_back(std::move(n));
  g.nodes = [&] {
    std::vector<ir::Node> sorted;
    for (int i : ir::topological_order(g)) sorted.push_back(g.nodes[i]);
    return sorted;
  }();
  if (spec.bias == "all")
    for (auto& [name, t] : g.initializers)
      if (ends_with(name, ".bias") && !res.adapter_tensors.count(name)) trainable_bias.insert(name);
  for (auto& b : trainable_bias) {
    res.trainable.push_back(b);
    res.adapter_tensors[b] = kPeftPrefix + b;
  }
  return res;
}

std::map<std::string, LinearRead> frozen_linear_weights(const ir::Graph& g,
                                                        const std::set<std::string>& frozen) {
  std::map<std::string, std::vector<size_t>> users;
  for (size_t i = 0; i < g.nodes.size(); i++)
    for (auto& in : g.nodes[i].inputs) users[in].push_back(i);
  std::set<std::string> outputs;
  for (auto& o : g.outputs) outputs.insert(o.name);
  auto is_rhs = [&](size_t u, const std::string& v) {
    const ir::Node& n = g.nodes[u];
    return n.op_type == "MatMul" && n.domain.empty() && n.inputs.size() == 2 && n.inputs[1] == v &&
           n.inputs[0] != v;
  };
  // How w is read when it is read only as a linear layer's weight (else nullopt).
  auto linear_read = [&](const std::string& w) -> std::optional<LinearRead> {
    if (outputs.count(w) || users[w].empty()) return std::nullopt;
    bool direct = false;
    for (size_t u : users[w]) {
      const ir::Node& n = g.nodes[u];
      if (is_rhs(u, w)) {
        direct = true;
        continue;
      }
      if (!(n.op_type == "Transpose" && n.domain.empty() && n.inputs.size() == 1 &&
            n.attr_ints("perm") == std::vector<int64_t>{1, 0}))
        return std::nullopt;
      const std::string& t = n.outputs[0];
      if (outputs.count(t) || users[t].empty()) return std::nullopt;
      for (size_t v : users[t])
        if (!is_rhs(v, t)) return std::nullopt;
    }
    return direct ? LinearRead::Direct : LinearRead::Transposed;
  };
  std::map<std::string, LinearRead> out;
  for (auto& [name, t] : g.initializers) {
    if (!frozen.count(name) || t.dtype() != DType::Float32 || t.rank() != 2) continue;
    if (auto r = linear_read(name)) out[name] = *r;
  }
  return out;
}

std::vector<std::string> store_frozen_weights_bf16(ir::Graph& g,
                                                   const std::set<std::string>& frozen) {
  std::vector<std::string> done;
  for (auto& [name, read] : frozen_linear_weights(g, frozen)) done.push_back(name);
  for (const std::string& name : done) ir::store_initializer_bf16(g, name);
  return done;
}

std::vector<std::string> store_frozen_weights_4bit(ir::Graph& g,
                                                   const std::set<std::string>& frozen,
                                                   const quant::BnbConfig& c) {
  std::vector<std::string> done;
  std::vector<bool> conv1d;
  for (auto& [name, read] : frozen_linear_weights(g, frozen)) {
    if (!quant::quantizes_module(c, name)) continue;
    done.push_back(name);
    conv1d.push_back(read == LinearRead::Direct);  // GPT-2's (in, out): quantized transposed
  }
  for (size_t i = 0; i < done.size(); i++)
    quant::quantize_initializer_4bit(g, done[i], c, "quantization_config: '" + done[i] + "'",
                                     conv1d[i]);
  return done;
}

}  // namespace onyx::models
