// run_config.cc — YAML/JSON config -> RunConfig via yaml-cpp (JSON is read as YAML).
#include "config/run_config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "config/config_values.h"
#include "data/dataset.h"
#include "diffusion/diffusers_folder.h"
#include "diffusion/text_encoder.h"
#include "diffusion/vae.h"
#include "io/safetensors.h"
#include "models/hf_model.h"
#include "models/hf_weights.h"
#include "onyx/custom_ops.h"
#include "quant/store_4bit.h"
#include "train/did_you_mean.h"

namespace fs = std::filesystem;

namespace onyx::config {
namespace {

// A YAML flag: true or false (YAML 1.1's yes / on / y, quoted or not, are refused: PEFT and TRL
// would read a quoted "yes" as a truthy string, and onyx would not know which was meant).
nlohmann::json yaml_to_json(const YAML::Node& n);

bool strict_bool(const YAML::Node& n, const std::string& key, const std::string& what) {
  const std::string v = n.IsScalar() ? n.as<std::string>() : std::string("(not a scalar)");
  ONYX_CHECK(v == "true" || v == "false" || v == "True" || v == "False", what, ": '", key,
             "' must be true or false, got '", v, "'");
  return v == "true" || v == "True";
}

std::vector<std::string> string_list(const YAML::Node& n, const std::string& key,
                                     const std::string& what) {
  std::vector<std::string> out;
  if (n.IsScalar()) {
    std::string s = n.as<std::string>();
    size_t p = 0;
    while (p <= s.size()) {
      size_t q = s.find(',', p);
      if (q == std::string::npos) q = s.size();
      if (q > p) out.push_back(s.substr(p, q - p));
      p = q + 1;
    }
    return out;
  }
  ONYX_CHECK(n.IsSequence(), what, ": '", key, "' must be a list");
  for (auto x : n) out.push_back(scalar(x, key, what));
  return out;
}

// `loss`: a graph output name, or {type: cross_entropy | mse | output, logits, labels,
// ignore_index}.
void set_loss(RunConfig& c, const YAML::Node& v, const std::string& what) {
  if (v.IsScalar()) {
    c.loss.kind = autodiff::LossSpec::Kind::GraphOutput;
    c.loss.output = v.as<std::string>();
    return;
  }
  ONYX_CHECK(v.IsMap(), what,
             ": 'loss' must be an output name or a mapping {type, logits, labels}");
  std::string type = "cross_entropy";
  for (auto kv : v) {
    std::string k = kv.first.as<std::string>();
    std::string val = scalar(kv.second, "loss." + k, what);
    if (k == "type")
      type = val;
    else if (k == "logits" || k == "predictions" || k == "output")
      c.loss.output = val;
    else if (k == "labels")
      c.loss.labels = val;
    else if (k == "ignore_index") {
      try {
        c.loss.ignore_index = std::stoll(val);
      } catch (...) {
        throw Error(cat(what, ": 'loss.ignore_index' must be an integer, got '", val, "'"));
      }
    } else
      throw Error(cat(what, ": unknown key 'loss.", k, "' (type, logits, labels, ignore_index)"));
  }
  if (type == "cross_entropy")
    c.loss.kind = autodiff::LossSpec::Kind::CrossEntropy;
  else if (type == "mse")
    c.loss.kind = autodiff::LossSpec::Kind::MSE;
  else if (type == "output")
    c.loss.kind = autodiff::LossSpec::Kind::GraphOutput;
  else
    throw Error(cat(what, ": 'loss.type' must be cross_entropy, mse or output, got '", type, "'"));
  if (c.loss.kind != autodiff::LossSpec::Kind::GraphOutput)
    ONYX_CHECK(!c.loss.output.empty() && !c.loss.labels.empty(), what, ": loss of type '", type,
               "' needs 'logits' and 'labels'");
}

// `lora`: PEFT's LoraConfig keys (r, lora_alpha, lora_dropout, target_modules, bias, use_rslora,
// task_type), checked.
void set_lora(RunConfig& c, const YAML::Node& v, const std::string& what) {
  ONYX_CHECK(v.IsMap(), what,
             ": 'lora' must be a mapping {r, lora_alpha, lora_dropout, target_modules, bias, "
             "use_rslora}");
  models::LoraSpec s;
  for (auto kv : v) {
    std::string k = kv.first.as<std::string>();
    try {
      if (k == "r")
        s.r = kv.second.as<int64_t>();
      else if (k == "lora_alpha")
        s.lora_alpha = kv.second.as<double>();
      else if (k == "lora_dropout")
        s.lora_dropout = kv.second.as<double>();
      else if (k == "target_modules" && kv.second.IsSequence())
        s.target_modules = kv.second.as<std::vector<std::string>>();
      else if (k == "target_modules")
        s.target_regex = kv.second.as<std::string>();
      else if (k == "bias")
        s.bias = kv.second.as<std::string>();
      else if (k == "use_rslora")
        s.use_rslora = strict_bool(kv.second, "lora.use_rslora", what);
      else if (k == "task_type")
        s.task_type = kv.second.as<std::string>();
      else
        throw Error(cat(what, ": unknown key 'lora.", k,
                        "' (r, lora_alpha, lora_dropout, target_modules, bias, use_rslora, "
                        "task_type)"));
    } catch (const YAML::Exception&) {
      throw Error(cat(what, ": 'lora.", k, "' has the wrong type"));
    }
  }
  ONYX_CHECK(s.r > 0, what, ": 'lora.r' must be positive, got ", s.r);
  ONYX_CHECK(std::isfinite(s.lora_alpha), what, ": 'lora.lora_alpha' must be a finite number");
  ONYX_CHECK(s.lora_dropout >= 0 && s.lora_dropout < 1, what,
             ": 'lora.lora_dropout' must be in [0, 1)");
  ONYX_CHECK(s.bias == "none" || s.bias == "all" || s.bias == "lora_only", what,
             ": 'lora.bias' must be none, all or lora_only, got '", s.bias, "'");
  ONYX_CHECK(!s.target_modules.empty() || !s.target_regex.empty(), what,
             ": 'lora.target_modules' is missing (e.g. [q_proj, v_proj])");
  c.lora = s;
  c.lora_initial.clear();
}

// `model_init_kwargs`: TRL's SFTConfig.model_init_kwargs; onyx reads dtype and
// quantization_config.
void set_model_init_kwargs(RunConfig& c, const YAML::Node& v, const std::string& what) {
  // dtype (torch_dtype before Transformers 4.56): bfloat16 stores the frozen linear weights in bf16
  // (models/lora.h); quantization_config: a BitsAndBytesConfig's 4-bit keys (QLoRA).
  ONYX_CHECK(v.IsMap(), what, ": 'model_init_kwargs' must be a mapping, e.g. {dtype: bfloat16}");
  for (auto kv : v) {
    std::string k = kv.first.as<std::string>();
    if (k == "quantization_config") {
      c.quantization = quant::parse_bnb_config(yaml_to_json(kv.second),
                                               what + ": model_init_kwargs", /*strict=*/true);
      continue;
    }
    ONYX_CHECK(k == "dtype" || k == "torch_dtype", what, ": unknown key 'model_init_kwargs.", k,
               "' (onyx reads dtype and quantization_config)");
    std::string d = kv.second.IsScalar() ? kv.second.as<std::string>() : "";
    if (d.rfind("torch.", 0) == 0) d = d.substr(6);
    ONYX_CHECK(d == "bfloat16" || d == "float32" || d == "auto", what, ": 'model_init_kwargs.", k,
               "' must be bfloat16, float32 or auto, got '", d,
               "' (float16 has no math on these CPUs; trainable weights stay float32)");
    c.frozen_dtype = d == "bfloat16" ? "bfloat16" : "float32";
  }
}

// DPOConfig's keys (trainer: dpo).
const std::vector<std::string>& dpo_keys() {
  static const std::vector<std::string> keys = {"beta",
                                                "loss_type",
                                                "loss_weights",
                                                "label_smoothing",
                                                "discopop_tau",
                                                "disable_dropout",
                                                "precompute_ref_log_probs",
                                                "precompute_ref_batch_size",
                                                "ref_model"};
  return keys;
}

bool is_dpo_key(const std::string& key) {
  const auto& k = dpo_keys();
  return std::find(k.begin(), k.end(), key) != k.end();
}

void set_dpo_key(RunConfig& c, const std::string& key, const YAML::Node& v,
                 const std::string& what) {
  auto number = [&](const std::string& text) { return finite_number(text, key, what); };
  auto flag = [&]() { return true_or_false(scalar(v, key, what), key, what); };
  models::PreferenceLoss& d = c.dpo;
  if (key == "beta") {
    d.beta = number(scalar(v, key, what));
  } else if (key == "loss_type") {
    d.loss_type = string_list(v, key, what);
  } else if (key == "loss_weights") {
    d.loss_weights.clear();
    for (auto& w : string_list(v, key, what)) d.loss_weights.push_back(number(w));
  } else if (key == "label_smoothing") {
    d.label_smoothing = number(scalar(v, key, what));
  } else if (key == "discopop_tau") {
    d.discopop_tau = number(scalar(v, key, what));
  } else if (key == "disable_dropout") {
    d.disable_dropout = flag();
  } else if (key == "ref_model") {
    c.ref_model = scalar(v, key, what);
  } else if (key == "precompute_ref_log_probs") {
    flag();  // either way: the reference (the starting policy) is computed once, before step 1
  } else {
    const double n = number(scalar(v, key, what));
    ONYX_CHECK(n >= 0 && n == std::floor(n), what, ": '", key, "' must be a positive integer, got ",
               n);
    c.precompute_ref_batch_size = (int64_t)n;
  }
}

// GRPOConfig's keys (trainer: grpo) and the CLI's reward_funcs.
const std::vector<std::string>& grpo_keys() {
  static const std::vector<std::string> keys = {"num_generations",
                                                "max_completion_length",
                                                "temperature",
                                                "top_p",
                                                "top_k",
                                                "min_p",
                                                "repetition_penalty",
                                                "beta",
                                                "epsilon",
                                                "epsilon_high",
                                                "loss_type",
                                                "scale_rewards",
                                                "num_iterations",
                                                "reward_weights",
                                                "mask_truncated_completions",
                                                "shuffle_dataset",
                                                "disable_dropout",
                                                "multi_objective_aggregation",
                                                "reward_funcs",
                                                "steps_per_generation",
                                                "generation_batch_size",
                                                "use_bias_correction_kl",
                                                "importance_sampling_level"};
  return keys;
}

bool is_grpo_key(const std::string& key) {
  const auto& k = grpo_keys();
  return std::find(k.begin(), k.end(), key) != k.end();
}

void set_grpo_key(RunConfig& c, const std::string& key, const YAML::Node& v,
                  const std::string& what) {
  train::GrpoOptions& o = c.grpo;
  auto number = [&]() { return finite_number(scalar(v, key, what), key, what); };
  auto integer = [&]() {
    const double n = number();
    ONYX_CHECK(n >= 0 && n == std::floor(n) && n < 1e15, what, ": '", key,
               "' must be a non-negative integer, got ", n);
    return (int64_t)n;
  };
  auto flag = [&]() { return true_or_false(scalar(v, key, what), key, what); };
  auto null = [&]() {
    return v.IsNull() || (v.IsScalar() && (v.Scalar() == "null" || v.Scalar() == "~"));
  };
  if (key == "num_generations") {
    o.num_generations = integer();
  } else if (key == "max_completion_length") {
    o.max_completion_length = integer();
  } else if (key == "temperature") {
    o.temperature = number();
  } else if (key == "top_p") {
    o.top_p = number();
  } else if (key == "top_k") {
    o.top_k = integer();
  } else if (key == "min_p") {
    ONYX_CHECK(null(), what, ": 'min_p' (min-p sampling) is not implemented in onyx's generator");
  } else if (key == "repetition_penalty") {
    o.repetition_penalty = number();
  } else if (key == "beta") {
    o.loss.beta = number();
  } else if (key == "epsilon") {
    o.loss.epsilon = number();
    if (!c.grpo_epsilon_high_given) o.loss.epsilon_high = o.loss.epsilon;
  } else if (key == "epsilon_high") {
    if (!null()) {
      o.loss.epsilon_high = number();
      c.grpo_epsilon_high_given = true;
    }
  } else if (key == "loss_type") {
    o.loss.loss_type = scalar(v, key, what);
  } else if (key == "scale_rewards") {
    const std::string s = scalar(v, key, what);  // GRPOConfig maps True / False to group / none
    o.scale_rewards = s == "true" ? "group" : s == "false" ? "none" : s;
  } else if (key == "num_iterations") {
    o.num_iterations = integer();
  } else if (key == "reward_weights") {
    o.reward_weights.clear();
    if (!null())
      for (auto& w : string_list(v, key, what))
        o.reward_weights.push_back(finite_number(w, key, what));
  } else if (key == "mask_truncated_completions") {
    o.mask_truncated_completions = flag();
  } else if (key == "shuffle_dataset") {
    o.shuffle_dataset = flag();
  } else if (key == "disable_dropout") {
    o.loss.disable_dropout = flag();
  } else if (key == "multi_objective_aggregation") {
    o.multi_objective_aggregation = scalar(v, key, what);
  } else if (key == "reward_funcs") {
    ONYX_CHECK(v.IsSequence(), what,
               ": 'reward_funcs' must be a list of {type: exact_match | regex | length, ...}");
    o.reward_specs.clear();
    for (auto item : v) o.reward_specs.push_back(yaml_to_json(item));
  } else if (key == "steps_per_generation") {
    o.steps_per_generation = null() ? 0 : integer();
  } else if (key == "generation_batch_size") {
    o.generation_batch_size = null() ? 0 : integer();
  } else if (key == "use_bias_correction_kl") {
    o.loss.use_bias_correction_kl = flag();
  } else {  // importance_sampling_level
    ONYX_CHECK(scalar(v, key, what) == "token", what,
               ": importance_sampling_level: onyx implements 'token' only (GSPO's 'sequence' is "
               "not built)");
  }
}

// A key of DPOConfig or GRPOConfig: set as `trainer:` says, or kept until it does.
void set_method_key(RunConfig& c, const std::string& key, const YAML::Node& v,
                    const std::string& what) {
  if (c.trainer == "default") {
    c.pending_method_keys.push_back({key, YAML::Dump(v)});
    return;
  }
  const bool dpo = c.trainer == "dpo";
  ONYX_CHECK(dpo ? is_dpo_key(key) : is_grpo_key(key), what, ": '", key, "' is not a key of ",
             dpo ? "DPOConfig (trainer: dpo)" : "GRPOConfig (trainer: grpo)");
  if (dpo)
    set_dpo_key(c, key, v, what);
  else
    set_grpo_key(c, key, v, what);
}

const std::vector<std::string>& diffusion_keys() {
  static const std::vector<std::string> k = {"noise_scheduler",
                                             "prediction_type",
                                             "snr_gamma",
                                             "class_dropout_prob",
                                             "use_ema",
                                             "ema_max_decay",
                                             "ema_min_decay",
                                             "ema_power",
                                             "ema_inv_gamma",
                                             "ema_use_warmup",
                                             "ema_update_after_step",
                                             "text_encoder",
                                             "tokenizer",
                                             "captions",
                                             "vae",
                                             "proportion_empty_prompts"};
  return k;
}
bool is_diffusion_key(const std::string& key) {
  const auto& k = diffusion_keys();
  return std::find(k.begin(), k.end(), key) != k.end();
}

void set_diffusion_key(RunConfig& c, const std::string& key, const YAML::Node& v,
                       const std::string& what) {
  RunConfig::Diffusion& d = c.diffusion;
  if (key == "noise_scheduler") {
    if (v.IsMap())
      d.noise_scheduler_json = yaml_to_json(v).dump();
    else
      d.noise_scheduler = resolve(fs::path(c.path).parent_path().string(), scalar(v, key, what));
    return;
  }
  if (key == "vae") {
    const std::string path = scalar(v, key, what);
    d.vae = path == "none" ? path : resolve(fs::path(c.path).parent_path().string(), path);
    return;
  }
  if (key == "text_encoder" || key == "tokenizer") {
    (key == "text_encoder" ? d.text_encoder : d.tokenizer) =
        resolve(fs::path(c.path).parent_path().string(), scalar(v, key, what));
    return;
  }
  if (key == "captions") {
    ONYX_CHECK(v.IsSequence() && v.size() > 0, what,
               ": 'captions' must be a list of strings, one per class label");
    d.captions.clear();
    for (size_t i = 0; i < v.size(); ++i) {
      ONYX_CHECK(v[i].IsScalar(), what, ": captions[", i, "] must be a string");
      d.captions.push_back(v[i].as<std::string>());
    }
    return;
  }
  const std::string t = scalar(v, key, what);
  if (key == "prediction_type") {
    ONYX_CHECK(t == "epsilon" || t == "v_prediction" || t == "sample", what,
               ": 'prediction_type' must be epsilon, v_prediction or sample, got '", t, "'");
    d.prediction_type = t;
    return;
  }
  if (key == "use_ema" || key == "ema_use_warmup") {
    (key == "use_ema" ? d.ema.enabled : d.ema.use_ema_warmup) = true_or_false(t, key, what);
    return;
  }
  const double x = finite_number(t, key, what);
  ONYX_CHECK(x >= 0, what, ": '", key, "' must be a number >= 0, got '", t, "'");
  if (key == "snr_gamma") d.snr_gamma = x;
  if (key == "class_dropout_prob") {
    ONYX_CHECK(x < 1, what, ": 'class_dropout_prob' must be in [0, 1), got ", x);
    d.class_dropout_prob = x;
  }
  if (key == "proportion_empty_prompts") {
    ONYX_CHECK(x <= 1, what, ": 'proportion_empty_prompts' must be in [0, 1], got ", x);
    d.proportion_empty_prompts = x;
  }
  if (key == "ema_max_decay") d.ema.decay = x;
  if (key == "ema_min_decay") d.ema.min_decay = x;
  if (key == "ema_power") d.ema.power = x;
  if (key == "ema_inv_gamma") d.ema.inv_gamma = x;
  if (key == "ema_update_after_step") {
    ONYX_CHECK(x == std::floor(x) && x < 1e15, what,
               ": 'ema_update_after_step' must be a non-negative integer, got '", t, "'");
    d.ema.update_after_step = (int64_t)x;
  }
}

void set_key(RunConfig& c, const std::string& key, const YAML::Node& v, const std::string& what) {
  if (key == "model") {
    if (v.IsMap()) {
      c.model.clear();
      c.model_spec = YAML::Dump(v);
    } else {
      c.model = scalar(v, key, what);
      c.model_spec.clear();
    }
  } else if (key == "loss") {
    set_loss(c, v, what);
  } else if (key == "train_data" || key == "eval_data" || key == "test_data") {
    DataSpec& d = key == "train_data"  ? c.train_data
                  : key == "eval_data" ? c.eval_data
                                       : c.test_data;
    if (v.IsMap())
      d = {"", YAML::Dump(v)};
    else
      d = {scalar(v, key, what), ""};
  } else if (key == "metrics") {
    c.metrics = string_list(v, key, what);
  } else if (key == "frozen") {
    c.frozen = string_list(v, key, what);
  } else if (key == "lora") {
    set_lora(c, v, what);
  } else if (key == "model_init_kwargs") {
    set_model_init_kwargs(c, v, what);
  } else if (key == "peft_config") {
    std::string p = resolve(fs::path(c.path).parent_path().string(), scalar(v, key, what));
    c.lora = models::read_adapter_config(p);
    fs::path weights = fs::path(p) / "adapter_model.safetensors";
    c.lora_initial = fs::is_directory(p) && fs::exists(weights) ? weights.string() : "";
  } else if (key == "custom_op_libraries") {
    // Loaded as soon as they are read, so the model (and every later plan) sees their ops.
    // Relative paths resolve against the config file's folder.
    for (auto& lib : string_list(v, key, what)) {
      std::string p = resolve(fs::path(c.path).parent_path().string(), lib);
      try {
        load_custom_op_library(p);
      } catch (const Error& e) {
        throw Error(cat(what, ": 'custom_op_libraries': ", e.what()));
      }
      c.custom_op_libraries.push_back(p);
    }
  } else if (key == "predictions") {
    c.predictions = scalar(v, key, what);
  } else if (key == "batch_norm_running_var") {
    c.batch_norm_running_var = scalar(v, key, what);
    ONYX_CHECK(c.batch_norm_running_var == "population" || c.batch_norm_running_var == "unbiased",
               what,
               ": 'batch_norm_running_var' must be population (the ONNX spec) or unbiased "
               "(PyTorch's BatchNorm), got '",
               c.batch_norm_running_var, "'");
  } else if (is_diffusion_key(key)) {
    set_diffusion_key(c, key, v, what);
  } else if (key == "early_stopping_patience" || key == "early_stopping_threshold") {
    std::string t = scalar(v, key, what);
    try {
      size_t pos = 0;
      if (key == "early_stopping_patience") {
        long long p = std::stoll(t, &pos);
        ONYX_CHECK(pos == t.size() && p > 0, "x");
        c.early_stopping_patience = p;
      } else {
        double d = std::stod(t, &pos);
        ONYX_CHECK(pos == t.size() && d >= 0, "x");
        c.early_stopping_threshold = d;
      }
    } catch (const std::exception&) {
      throw Error(cat(what, ": '", key, "' must be ",
                      key == "early_stopping_patience" ? "a positive integer" : "a number >= 0",
                      ", got '", t, "'"));
    }
  } else if (key == "report_to" && v.IsSequence()) {
    // Transformers takes a list of integrations: [] = none, [x] = x; onyx has only tensorboard
    // ("all" = tensorboard), so a list naming anything else besides it is an error.
    std::vector<std::string> names;
    for (auto& s : string_list(v, key, what))
      if (s != "none" && std::find(names.begin(), names.end(), s) == names.end())
        names.push_back(s);
    bool all_tb = !names.empty();
    for (auto& s : names) all_tb = all_tb && (s == "tensorboard" || s == "all");
    std::string joined;
    for (auto& s : names) joined += (joined.empty() ? "" : ", ") + s;
    ONYX_CHECK(names.size() <= 1 || all_tb, what, ": 'report_to' lists [", joined,
               "]; onyx reports only to tensorboard (report_to: none, tensorboard, all or a "
               "list of one of them)");
    try {
      c.args.set(key, names.empty() ? "none" : names.size() == 1 ? names[0] : "tensorboard");
    } catch (const Error& e) {
      throw Error(cat(what, ": ", e.what()));
    }
  } else if (key == "trainer") {
    c.trainer = scalar(v, key, what);
    ONYX_CHECK(c.trainer == "default" || c.trainer == "dpo" || c.trainer == "grpo", what,
               ": 'trainer' must be default, dpo or grpo, got '", c.trainer, "'");
    auto pending = std::move(c.pending_method_keys);
    c.pending_method_keys.clear();
    for (auto& [k, text] : pending) set_key(c, k, YAML::Load(text), what);
  } else if (is_dpo_key(key) || is_grpo_key(key)) {
    set_method_key(c, key, v, what);
  } else if (TrainingArguments::is_key(key)) {
    // a mapping or a list (lr_scheduler_kwargs, include_for_metrics) goes as its JSON text
    const std::string text =
        v.IsMap() || v.IsSequence() ? yaml_to_json(v).dump() : scalar(v, key, what);
    try {
      c.args.set(key, text);
    } catch (const Error& e) {
      throw Error(cat(what, ": ", e.what()));
    }
  } else {
    std::vector<std::string> known = TrainingArguments::keys();
    for (const char* k : {"model", "loss", "predictions", "train_data", "eval_data", "test_data",
                          "metrics", "frozen", "lora", "peft_config", "model_init_kwargs",
                          "custom_op_libraries", "batch_norm_running_var",
                          "early_stopping_patience", "early_stopping_threshold", "trainer"})
      known.push_back(k);
    known.insert(known.end(), diffusion_keys().begin(), diffusion_keys().end());
    known.insert(known.end(), dpo_keys().begin(), dpo_keys().end());
    known.insert(known.end(), grpo_keys().begin(), grpo_keys().end());
    throw Error(cat(what, ": unknown key '", key, "'", train::did_you_mean(key, known)));
  }
}

}  // namespace

void set_config_key(RunConfig& c, const std::string& key, const std::string& yaml_text,
                    const std::string& what) {
  YAML::Node n;
  try {
    n = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    throw Error(cat(what, ": '", key, "': not valid YAML: ", e.what()));
  }
  set_key(c, key, n, what);
}

std::vector<std::pair<std::string, std::string>> parse_overrides(
    const std::vector<std::string>& a) {
  std::vector<std::pair<std::string, std::string>> out;
  for (size_t i = 0; i < a.size(); i++) {
    std::string k = a[i];
    ONYX_CHECK(k.rfind("--", 0) == 0, "unexpected argument '", k, "' (overrides are --key value)");
    k = k.substr(2);
    auto eq = k.find('=');
    if (eq != std::string::npos) {
      out.push_back({k.substr(0, eq), k.substr(eq + 1)});
      continue;
    }
    ONYX_CHECK(i + 1 < a.size(), "override '--", k, "' has no value");
    out.push_back({k, a[++i]});
  }
  return out;
}

namespace {

// A config from its parsed YAML (a file's or a text's): keys, then the overrides, the methods'
// defaults, paths resolved against `dir`; errors name `what`.
RunConfig config_from_yaml(const YAML::Node& root, const std::string& path, const std::string& dir,
                           const std::vector<std::pair<std::string, std::string>>& overrides,
                           const std::string& what) {
  RunConfig c;
  c.path = path;
  ONYX_CHECK(root.IsMap(), what, ": must be a mapping of keys to values");
  for (auto kv : root) set_key(c, kv.first.as<std::string>(), kv.second, what);
  for (auto& [k, v] : overrides) {
    YAML::Node n;
    try {
      n = YAML::Load(v);
    } catch (...) {
      n = YAML::Node(v);
    }
    if (!n.IsScalar() && !n.IsNull() && k != "metrics" && k != "frozen" && k != "loss" &&
        k != "report_to" && k != "custom_op_libraries")
      n = YAML::Node(v);
    set_key(c, k, n, "command line");
  }
  // PEFT's prepare_model_for_kbit_training (which TRL applies to a 4-bit model) turns gradient
  // checkpointing on unless told otherwise.
  auto given = [&](const char* k) {
    if (root[k]) return true;
    for (auto& kv : overrides)
      if (kv.first == k) return true;
    return false;
  };
  if (c.quantization && !given("gradient_checkpointing") && !given("activation_checkpointing"))
    c.args.gradient_checkpointing = true;
  // trainer: dpo takes DPOConfig's defaults where they differ from TrainingArguments': learning
  // rate 1e-6, logging every 10 steps, gradient checkpointing on, bf16 unless fp16.
  ONYX_CHECK(c.pending_method_keys.empty(), what, ": '",
             c.pending_method_keys.empty() ? "" : c.pending_method_keys[0].first,
             "' is a key of DPOConfig or GRPOConfig: set `trainer: dpo` or `trainer: grpo`");
  // GRPOConfig's defaults where they differ from TrainingArguments': as DPOConfig's, and
  // per_device_train_batch_size 8
  if (c.trainer == "grpo" && !given("per_device_train_batch_size"))
    c.args.per_device_train_batch_size = 8;
  if (c.trainer == "dpo" || c.trainer == "grpo") {
    if (!given("learning_rate")) c.args.learning_rate = 1e-6;
    if (!given("logging_steps")) c.args.set("logging_steps", "10");
    if (!given("gradient_checkpointing") && !given("activation_checkpointing"))
      c.args.gradient_checkpointing = true;
    if (!given("bf16")) c.args.bf16 = !c.args.fp16;
  }
  c.dir = dir.empty() ? "." : dir;
  c.model = resolve(dir, c.model);
  for (DataSpec* d : {&c.train_data, &c.eval_data, &c.test_data}) d->path = resolve(dir, d->path);
  ONYX_CHECK(!c.model.empty() || !c.model_spec.empty(), what, ": 'model' is missing");
  ONYX_CHECK(c.model.empty() || fs::exists(c.model), what, ": model '", c.model,
             "' does not exist");
  c.args.validate();
  return c;
}

}  // namespace

RunConfig load_run_config(const std::string& path,
                          const std::vector<std::pair<std::string, std::string>>& overrides) {
  std::string what = cat("config '", path, "'");
  ONYX_CHECK(fs::exists(path), "config file '", path, "' does not exist");
  const std::string ext = fs::path(path).extension().string();
  ONYX_CHECK(ext != ".onnx" && ext != ".safetensors" && !fs::is_directory(path), what,
             ": is a model, not a config; write a .yaml or .json config with `model: ", path,
             "` (and loss, train_data, ...: see `onyx train --help`)");
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::Exception& e) {
    throw Error(cat(what, ": not valid YAML/JSON: ", e.what()));
  }
  return config_from_yaml(root, path, fs::path(path).parent_path().string(), overrides, what);
}

RunConfig parse_run_config(const std::string& text, const std::string& dir,
                           const std::string& what) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw Error(cat(what, ": not valid YAML/JSON: ", e.what()));
  }
  return config_from_yaml(root, (fs::path(dir) / "config").string(), dir, {}, what);
}

namespace {

// YAML scalar -> JSON value (numbers and booleans typed), recursively for maps and lists.
nlohmann::json yaml_to_json(const YAML::Node& n) {
  if (n.IsMap()) {
    nlohmann::json j = nlohmann::json::object();
    for (auto kv : n) j[kv.first.as<std::string>()] = yaml_to_json(kv.second);
    return j;
  }
  if (n.IsSequence()) {
    nlohmann::json j = nlohmann::json::array();
    for (auto x : n) j.push_back(yaml_to_json(x));
    return j;
  }
  if (n.IsNull()) return nullptr;
  std::string s = n.as<std::string>();
  if (s == "true" || s == "false") return s == "true";
  try {
    size_t pos;
    long long i = std::stoll(s, &pos);
    if (pos == s.size()) return i;
    double d = std::stod(s, &pos);
    if (pos == s.size()) return d;
  } catch (...) {
  }
  return s;
}

std::string read_text(const std::string& path, const std::string& what) {
  std::ifstream f(path);
  ONYX_CHECK(f.good(), what, ": cannot open '", path, "'");
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

models::Task parse_task(const std::string& t, const std::string& what) {
  static const std::map<std::string, models::Task> tasks = {
      {"sequence-classification", models::Task::SequenceClassification},
      {"token-classification", models::Task::TokenClassification},
      {"masked-lm", models::Task::MaskedLM},
      {"causal-lm", models::Task::CausalLM},
      {"image-classification", models::Task::ImageClassification},
      {"seq2seq-lm", models::Task::Seq2SeqLM},
      {"base", models::Task::Base}};
  auto it = tasks.find(t);
  if (it != tasks.end()) return it->second;
  std::string list;
  for (auto& [k, _] : tasks) list += (list.empty() ? "" : ", ") + k;
  throw Error(cat(what, ": unknown task '", t, "' (", list, ")"));
}

// A config mapping without `task`: the model type's usual head.
models::Task default_task(const std::string& t) {
  if (t == "vit") return models::Task::ImageClassification;
  if (t == "gpt2" || t == "llama" || t == "mistral" || t == "qwen2") return models::Task::CausalLM;
  if (t == "whisper" || t == "bart" || t == "t5" || t == "mt5") return models::Task::Seq2SeqLM;
  return models::Task::SequenceClassification;
}

Model from_built(models::BuiltModel b, const std::string& source) {
  Model m = b.model;
  m.generic_onnx = false;  // Hugging Face names: the HF weight-decay rule applies by name
  m.source = source;
  m.config_json =
      models::hf_config_to_json(b.config, models::architecture_name(b.config.model_type, b.task));
  m.optional_inputs = models::defaulted_inputs(b);
  m.fill_defaults = models::default_input_filler(b);
  return m;
}

// LoRA over a bf16 base (model_init_kwargs.dtype bfloat16): its linear weights, all frozen (onyx's
// LoRA trains adapters and biases), are built and read in bf16 (HfConfig::bf16_linears), so the
// model never exists whole in float32 (Llama-family builders; the others convert after the build).
bool bf16_linears_from_start(const RunConfig& c) { return c.lora && c.frozen_dtype == "bfloat16"; }

// QLoRA: the frozen linear weights in 4-bit (TRL's model_init_kwargs.quantization_config). As
// Transformers and PEFT refuse to train a purely quantized model, LoRA is required.
void store_quantized(const RunConfig& c, Model& m) {
  ONYX_CHECK(c.lora,
             "model_init_kwargs.quantization_config: a 4-bit model trains through "
             "adapters; add a lora: (or peft_config:) section");
  // Llama-family models are built 4-bit (and a folder saved 4-bit is read so); the others are
  // quantized here, from their float32 graph.
  if (!quant::holds_4bit_weights(*m.graph)) {
    auto stored = models::store_frozen_weights_4bit(*m.graph, m.frozen, *c.quantization);
    ONYX_CHECK(!stored.empty(),
               "model_init_kwargs.quantization_config: the model has no frozen "
               "linear weight to quantize");
  }
  for (const ir::Node& n : m.graph->nodes)  // the 4-bit state's float32 tensors are frozen too
    if (n.op_type == "Dequantize4Bit")
      for (auto& in : n.inputs)
        if (!in.empty() && is_float(m.graph->initializers.at(in).dtype())) m.frozen.insert(in);
  // The saved config.json says how its model.safetensors is stored, as Transformers' does.
  if (!m.config_json.empty()) {
    nlohmann::ordered_json j = nlohmann::ordered_json::parse(m.config_json);
    if (!j.contains("quantization_config"))
      j["quantization_config"] = quant::bnb_config_json(*c.quantization);
    m.config_json = j.dump(2) + "\n";
  }
}

// A model given as a mapping {arch, config, config_overrides, weights, task, seed}: built from its
// config (4-bit or bf16 linear weights as the run asks), the weights read when given.
Model model_from_spec(const RunConfig& c) {
  std::string what = cat("config '", c.path, "': 'model'");
  YAML::Node n = YAML::Load(c.model_spec);
  for (auto kv : n) {
    std::string k = kv.first.as<std::string>();
    ONYX_CHECK(k == "arch" || k == "config" || k == "weights" || k == "task" || k == "seed" ||
                   k == "config_overrides",
               what, ": unknown key '", k,
               "' (arch, config, config_overrides, weights, task, seed)");
  }
  ONYX_CHECK(n["config"], what, ": 'config' (a config.json path or an inline mapping) is missing");
  nlohmann::json cj;
  std::string cfg_what = what + ".config";
  if (n["config"].IsMap()) {
    cj = yaml_to_json(n["config"]);
  } else {
    std::string p = resolve(c.dir, n["config"].as<std::string>());
    if (fs::is_directory(p)) p = (fs::path(p) / "config.json").string();
    cfg_what = cat("'", p, "'");
    try {
      cj = nlohmann::json::parse(read_text(p, what));
    } catch (const nlohmann::json::exception& e) {
      throw Error(cat(cfg_what, ": not valid JSON: ", e.what()));
    }
  }
  // config_overrides: keys set over the config (from_pretrained(path, num_labels=4, ...))
  if (n["config_overrides"]) {
    ONYX_CHECK(n["config_overrides"].IsMap(), what, ": 'config_overrides' must be a mapping");
    nlohmann::json over = yaml_to_json(n["config_overrides"]);
    for (auto& [k, v] : over.items()) cj[k] = v;
  }
  if (n["arch"]) cj["model_type"] = n["arch"].as<std::string>();
  models::HfConfig hc = models::parse_hf_config(cj.dump(), cfg_what);
  if (c.quantization && !hc.quantization) hc.quantization = c.quantization;
  hc.bf16_linears = bf16_linears_from_start(c) && !hc.quantization;
  models::Task task =
      n["task"] ? parse_task(n["task"].as<std::string>(), what) : default_task(hc.model_type);
  int64_t seed = n["seed"] ? n["seed"].as<int64_t>() : c.args.seed;
  models::BuiltModel b = models::build_hf_model(hc, task, seed);
  if (n["weights"]) {
    std::string w = resolve(c.dir, n["weights"].as<std::string>());
    std::map<std::string, Tensor> tensors;
    if (fs::is_directory(w))
      tensors = models::read_hf_checkpoint(w);
    else
      tensors = io::load_safetensors(w).tensors;
    models::apply_hf_checkpoint(b, tensors, cat("'", w, "'"));
  }
  return from_built(std::move(b), c.path);
}

// The frozen text encoder of text-to-image training: the config's text_encoder / tokenizer, or
// for a UNet that takes encoder_hidden_states the pipeline's folders beside it (none: the data
// brings encoder_hidden_states).
std::shared_ptr<diffusion::TextEncoder> text_encoder(const RunConfig& c, const Model& m) {
  const RunConfig::Diffusion& d = c.diffusion;
  const std::string what = cat("config '", c.path, "'");
  ONYX_CHECK(d.text_encoder.empty() == d.tokenizer.empty(), what,
             ": 'text_encoder' and 'tokenizer' go together (a CLIPTextModel folder and its "
             "tokenizer folder)");
  if (!d.text_encoder.empty()) return diffusion::TextEncoder::open(d.text_encoder, d.tokenizer);
  bool conditional = false;
  for (auto& in : m.graph->inputs) conditional |= in.name == "encoder_hidden_states";
  auto encoder = conditional ? diffusion::TextEncoder::beside(c.model) : nullptr;
  ONYX_CHECK(encoder || (d.captions.empty() && d.proportion_empty_prompts == 0), what,
             ": 'captions' and 'proportion_empty_prompts' need a text encoder (text_encoder and "
             "tokenizer, or a pipeline's text_encoder/ and tokenizer/ beside the model folder)");
  return encoder;
}

// A diffusers model folder trained as diffusers' example scripts train it (diffusion/unet2d.h);
// the scheduler's config is saved with the model.
Model diffusion_model(const RunConfig& c) {
  const RunConfig::Diffusion& d = c.diffusion;
  diffusion::Objective o;
  o.schedule = d.noise_scheduler_json.empty()
                   ? diffusion::find_schedule_config(c.model, d.noise_scheduler)
                   : diffusion::parse_schedule_config(
                         d.noise_scheduler_json, cat("config '", c.path, "': 'noise_scheduler'"));
  if (!d.prediction_type.empty()) o.schedule.prediction_type = d.prediction_type;
  o.snr_gamma = d.snr_gamma;
  Model m =
      diffusion::load_denoiser_training(c.model, o, (uint64_t)c.args.seed, d.class_dropout_prob);
  m.side_files["scheduler_config.json"] = diffusion::schedule_config_json(o.schedule);
  if (auto encoder = text_encoder(c, m))
    diffusion::condition_on_text(m, encoder, d.captions, d.proportion_empty_prompts,
                                 (uint64_t)c.args.seed);
  if (d.vae != "none") {
    auto vae = d.vae.empty() ? diffusion::Vae::of_model(c.model) : diffusion::Vae::open(d.vae);
    if (vae) diffusion::train_on_latents(m, vae, (uint64_t)c.args.seed);
  }
  return m;
}

}  // namespace

Model model_from_config(const RunConfig& c) {
  Model m;
  const bool diffusers = c.model_spec.empty() && diffusion::is_diffusers_folder(c.model);
  if (!c.model_spec.empty()) {
    m = model_from_spec(c);
  } else if (diffusers) {
    m = diffusion_model(c);
  } else if (fs::is_directory(c.model)) {
    m = from_built(models::load_hf_folder(c.model, std::nullopt, c.args.seed, c.quantization,
                                          bf16_linears_from_start(c)),
                   c.model);
  } else {
    m = Model::from_onnx(c.model, c.loss);
  }
  if (c.model_spec.empty() && !fs::is_directory(c.model)) {
    m.predictions = c.predictions.empty() && c.loss.kind != autodiff::LossSpec::Kind::GraphOutput
                        ? c.loss.output
                        : c.predictions;
  } else if (!c.predictions.empty()) {
    m.predictions = c.predictions;
  }
  if (c.trainer == "dpo") {
    models::to_preference_model(m, c.dpo);
    m.reference_batch_size = c.precompute_ref_batch_size;
    if (!c.ref_model.empty()) {
      m.reference_model = resolve(c.dir, c.ref_model);
      ONYX_CHECK(fs::is_directory(m.reference_model), "ref_model '", m.reference_model,
                 "' is not a model folder");
      ONYX_CHECK(!c.lora,
                 "ref_model with LoRA: the reference is the base with the adapters off "
                 "(TRL refuses a ref_model with a peft_config too)");
    }
  }
  if (c.trainer == "grpo") models::to_grpo_model(m, grpo_options(c).loss);
  if (c.lora) {
    // LoRA: adapters on the matching linear layers; everything else frozen
    models::LoraSpec spec = *c.lora;
    if (spec.base_model_name_or_path.empty()) spec.base_model_name_or_path = c.model;
    // a diffusers UNet is no PEFT task: PeftModel.from_pretrained(unet, folder) opens it
    if (diffusers && spec.task_type == "CAUSAL_LM") spec.task_type = "";
    std::map<std::string, Tensor> initial;
    if (!c.lora_initial.empty()) initial = io::load_safetensors(c.lora_initial).tensors;
    models::LoraResult r = models::apply_lora(*m.graph, spec, (uint64_t)c.args.seed, initial);
    std::set<std::string> trainable(r.trainable.begin(), r.trainable.end());
    for (auto& [name, t] : m.graph->initializers)
      if (is_float(t.dtype()) && !trainable.count(name)) m.frozen.insert(name);
    std::set<std::string> saved_names;
    for (auto& [g, saved] : r.adapter_tensors) saved_names.insert(saved);
    for (auto& [k, t] : initial)
      ONYX_CHECK(saved_names.count(k), "peft_config: '", c.lora_initial, "' has tensor '", k,
                 "', which no adapted module of this model has");
    m.adapter_tensors = r.adapter_tensors;
    m.adapter_config_json = models::adapter_config_json(spec);
    // a UNet2DConditionModel's adapters also as diffusers' own LoRA file (its loaders take that
    // model, not UNet2DModel or DiT)
    for (auto& in : m.graph->inputs)
      if (diffusers && in.name == "encoder_hidden_states") m.diffusers_lora_component = "unet";
  }
  m.frozen.insert(c.frozen.begin(), c.frozen.end());
  if (c.quantization) store_quantized(c, m);
  ONYX_CHECK(c.lora || !quant::holds_4bit_weights(*m.graph), "model '", c.model,
             "' is stored 4-bit "
             "(bitsandbytes): a quantized model trains through adapters; add a lora: (or "
             "peft_config:) section");
  if (c.frozen_dtype == "bfloat16") {
    auto stored = models::store_frozen_weights_bf16(*m.graph, m.frozen);
    for (auto& [name, t] : m.graph->initializers)  // those built bf16 (bf16_linears_from_start)
      if (t.dtype() == DType::BFloat16 && m.frozen.count(name)) stored.push_back(name);
    ONYX_CHECK(!stored.empty(),
               "model_init_kwargs.dtype bfloat16: the model has no frozen linear "
               "weight to store in bf16 (it applies to LoRA's base and `frozen` layers; trainable "
               "weights stay float32)");
    m.bf16_weights.insert(stored.begin(), stored.end());
  }
  m.batch_norm_unbiased_var = c.batch_norm_running_var == "unbiased";
  // Tokenizer / image-processor files of a Hugging Face folder, and the tokenizer the data names,
  // go next to the saved weights.
  auto add_dir = [&](const std::string& d) {
    static const char* names[] = {"tokenizer.json",
                                  "tokenizer_config.json",
                                  "special_tokens_map.json",
                                  "vocab.txt",
                                  "vocab.json",
                                  "merges.txt",
                                  "added_tokens.json",
                                  "tokenizer.model",
                                  "spiece.model",
                                  "chat_template.jinja",
                                  "preprocessor_config.json",
                                  "generation_config.json"};
    for (const char* n : names)
      if (fs::is_regular_file(fs::path(d) / n))
        m.processor_files.push_back((fs::path(d) / n).string());
  };
  auto add_processor_files = [&](const std::string& p) {
    if (fs::is_directory(p)) {
      add_dir(p);
    } else if (fs::is_regular_file(p)) {  // a tokenizer file of a Hugging Face folder: its folder
      fs::path dir = fs::path(p).parent_path();
      if (fs::is_regular_file(dir / "tokenizer_config.json")) {
        add_dir(dir.string());
      } else {
        m.processor_files.push_back(p);
        // a byte-level BPE named by its vocab.json is that file and the merges.txt beside it
        if (fs::path(p).filename() == "vocab.json" && fs::is_regular_file(dir / "merges.txt"))
          m.processor_files.push_back((dir / "merges.txt").string());
      }
    }
  };
  if (c.model_spec.empty() && fs::is_directory(c.model)) add_processor_files(c.model);
  if (!c.train_data.spec.empty()) {
    YAML::Node n = YAML::Load(c.train_data.spec);
    if (n.IsMap() && n["tokenizer"] && n["tokenizer"].IsScalar()) {
      std::string tok = resolve(c.dir, n["tokenizer"].as<std::string>());
      if (m.processor_files.empty()) add_processor_files(tok);
    }
  }
  return m;
}

std::unique_ptr<Trainer> make_trainer(const RunConfig& c, std::shared_ptr<data::Dataset> train,
                                      std::shared_ptr<data::Dataset> eval) {
  ComputeMetrics cm = c.metrics.empty() ? nullptr : metrics::by_names(c.metrics);
  std::vector<std::shared_ptr<TrainerCallback>> callbacks;
  if (c.early_stopping_patience)
    callbacks.push_back(std::make_shared<EarlyStoppingCallback>((int)*c.early_stopping_patience,
                                                                c.early_stopping_threshold));
  Model m = model_from_config(c);
  ONYX_CHECK(diffusion::is_diffusers_folder(c.model) ||
                 (!c.diffusion.ema.enabled && c.diffusion.snr_gamma == 0 &&
                  c.diffusion.noise_scheduler.empty() && c.diffusion.noise_scheduler_json.empty()),
             "config '", c.path,
             "': use_ema, snr_gamma and noise_scheduler are diffusion training's (the model is "
             "not a diffusers folder)");
  auto t = std::make_unique<Trainer>(std::move(m), c.args, std::move(train), std::move(eval), cm,
                                     std::move(callbacks));
  if (c.diffusion.ema.enabled) t->set_ema(c.diffusion.ema);
  bool need_predictions = false;
  for (auto& m : c.metrics) need_predictions |= m != "perplexity";
  t->set_metrics_need_predictions(need_predictions);
  return t;
}

}  // namespace onyx::config
