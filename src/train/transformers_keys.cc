// transformers_keys.cc — Transformers' TrainingArguments keys onyx has no field for, and what
// each means here (train/transformers_keys.h). The table is checked against the pinned
// transformers.TrainingArguments by tests/python/test_package.py (args-every-transformers-key):
// together with onyx's own fields it must hold every key, with Transformers' defaults.
#include "train/transformers_keys.h"

#include <algorithm>
#include <cmath>

#include "onyx/error.h"

namespace onyx::train {

namespace {

constexpr const char* kInertNames = "a name for experiment trackers; onyx records it";
constexpr const char* kInertCuda = "GPU-only; onyx trains on the CPU, where it changes nothing";
constexpr const char* kInertLoader =
    "data-loader workers and memory pinning; onyx's data loading does not use them and the batches "
    "are the same";
constexpr const char* kInertDist =
    "torch DDP's settings; onyx's data parallelism (mpirun) reduces every gradient of every rank";
constexpr const char* kInertLog = "Transformers' own logging verbosity; onyx records it";
constexpr const char* kInertScript =
    "read by the example scripts, not by the Trainer (as in Transformers); onyx records it";
constexpr const char* kNotImpl =
    "not implemented by onyx, and any other value would make the run differ from Transformers'";

const std::vector<TransformersKey>& table() {
  static const std::vector<TransformersKey> t = {
      // -- inert: every value of the type accepted and recorded
      {"run_name", "str | None", "null", true, kInertNames},
      {"project", "str", "\"huggingface\"", true, kInertNames},
      {"trackio_space_id", "str | None", "null", true, kInertNames},
      {"trackio_bucket_id", "str | None", "null", true, kInertNames},
      {"trackio_static_space_id", "str | None", "null", true, kInertNames},
      {"log_level",
       "str",
       "\"passive\"",
       true,
       kInertLog,
       {"detail", "debug", "info", "warning", "error", "critical", "passive"}},
      {"log_level_replica",
       "str",
       "\"warning\"",
       true,
       kInertLog,
       {"detail", "debug", "info", "warning", "error", "critical", "passive"}},
      {"log_on_each_node", "bool", "true", true, kInertLog},
      {"do_train", "bool", "false", true, kInertScript},
      {"do_eval", "bool", "false", true, kInertScript},
      {"do_predict", "bool", "false", true, kInertScript},
      {"local_rank", "int", "-1", true, "set by torch launchers; mpirun ranks onyx's processes"},
      {"use_cpu", "bool", "false", true, "onyx always trains on the CPU"},
      {"tf32", "bool | None", "null", true, kInertCuda},
      {"torch_empty_cache_steps", "int | None", "null", true, kInertCuda},
      {"torch_compile", "bool", "false", true,
       "onyx compiles every training graph (fusions, memory plan) whatever it says"},
      {"torch_compile_backend", "str | None", "null", true,
       "onyx compiles every training graph (fusions, memory plan) whatever it says"},
      {"torch_compile_mode", "str | None", "null", true,
       "onyx compiles every training graph (fusions, memory plan) whatever it says"},
      {"use_liger_kernel", "bool", "false", true,
       "Liger's fused GPU kernels compute what onyx's fused CPU kernels compute"},
      {"liger_kernel_config", "dict | None", "null", true,
       "Liger's fused GPU kernels compute what onyx's fused CPU kernels compute"},
      {"use_cache", "bool", "false", true,
       "the model's generation cache; training does not use it"},
      {"dataloader_num_workers", "int", "0", true, kInertLoader},
      {"dataloader_pin_memory", "bool", "true", true, kInertLoader},
      {"dataloader_persistent_workers", "bool", "false", true, kInertLoader},
      {"dataloader_prefetch_factor", "int | None", "null", true, kInertLoader},
      {"dataloader_multiprocessing_context", "str | None", "null", true, kInertLoader},
      {"dataloader_in_order", "bool", "true", true, kInertLoader},
      {"eval_accumulation_steps", "int | None", "null", true,
       "where evaluation keeps its predictions; the metrics are the same"},
      {"eval_use_gather_object", "bool", "false", true, kInertDist},
      {"save_on_each_node", "bool", "false", true, "multi-node file systems; onyx's rank 0 saves"},
      {"ddp_find_unused_parameters", "bool | None", "null", true, kInertDist},
      {"ddp_broadcast_buffers", "bool | None", "null", true, kInertDist},
      {"ddp_static_graph", "bool | None", "null", true, kInertDist},
      {"ddp_backend",
       "str | None",
       "null",
       true,
       kInertDist,
       {"nccl", "gloo", "mpi", "xccl", "hccl", "cncl", "mccl"}},
      {"full_determinism", "bool", "false", true,
       "onyx's training is deterministic for a given thread count whatever it says"},
      {"gradient_checkpointing_kwargs", "dict | None", "null", true,
       "torch.utils.checkpoint's options (use_reentrant); onyx recomputes the same values"},
      {"activation_checkpointing", "bool | None", "null", true,
       "Transformers 5's name for gradient_checkpointing: true / false set it"},
      {"activation_checkpointing_kwargs", "dict | None", "null", true,
       "torch.utils.checkpoint's options (use_reentrant); onyx recomputes the same values"},
      {"hub_token", "str | None", "null", true, "read only when push_to_hub is true"},
      {"hub_private_repo", "bool | None", "null", true, "read only when push_to_hub is true"},
      {"hub_model_id", "str | None", "null", true, "read only when push_to_hub is true"},
      {"hub_strategy",
       "str",
       "\"every_save\"",
       true,
       "read only when push_to_hub is true",
       {"end", "every_save", "checkpoint", "all_checkpoints"}},
      {"hub_always_push", "bool", "false", true, "read only when push_to_hub is true"},
      {"hub_revision", "str | None", "null", true, "read only when push_to_hub is true"},
      // -- only the default: another value is an error with this reason
      {"push_to_hub", "bool", "false", false,
       "onyx does not upload to the Hugging Face Hub (this machine reaches no hub); push the "
       "output_dir with huggingface_hub afterwards"},
      {"deepspeed", "str | None", "null", false,
       "DeepSpeed is not used; onyx shards optimizer state itself: zero_stage 1 or 2 under "
       "onyx launch"},
      {"fsdp", "str | list | None", "null", false,
       "FSDP is not implemented; onyx shards optimizer state with zero_stage 1 or 2"},
      {"fsdp_config", "dict | None", "null", false,
       "FSDP is not implemented; onyx shards optimizer state with zero_stage 1 or 2"},
      {"accelerator_config", "dict | None", "null", false,
       "Accelerate is not used; onyx's data loading and data parallelism are its own"},
      {"parallelism_config", "dict | None", "null", false,
       "tensor / context parallelism is not implemented (data parallelism is: onyx launch)"},
      {"average_tokens_across_devices", "bool", "true", false,
       "onyx's data parallelism always normalizes the loss by the tokens of all ranks"},
      {"remove_unused_columns", "bool", "true", false,
       "onyx feeds a model only the columns its graph has inputs for (Transformers' true)"},
      {"skip_memory_metrics", "bool", "true", false,
       "memory metrics (train_mem_*) are not collected"},
      {"debug", "str | list", "\"\"", false, "PyTorch's debug modes are not implemented"},
      {"enable_jit_checkpoint", "bool", "false", false,
       "saving a checkpoint on SIGTERM is not implemented"},
      {"optim_args", "str | None", "null", false, kNotImpl},
      {"optim_target_modules", "str | list | None", "null", false, kNotImpl},
      {"eval_on_start", "bool", "false", false, kNotImpl},
      {"eval_delay", "float", "0", false, kNotImpl},
      {"batch_eval_metrics", "bool", "false", false, kNotImpl},
      {"prediction_loss_only", "bool", "false", false, kNotImpl},
      {"eval_do_concat_batches", "bool", "true", false, kNotImpl},
      {"label_names", "str | list | None", "null", false, kNotImpl},
      {"include_for_metrics", "str | list", "[]", false, kNotImpl},
      {"include_num_input_tokens_seen", "str | bool", "\"no\"", false, kNotImpl},
      {"neftune_noise_alpha", "float | None", "null", false, kNotImpl},
      {"ignore_data_skip", "bool", "false", false, kNotImpl},
      {"restore_callback_states_from_checkpoint", "bool", "false", false, kNotImpl},
      {"save_only_model", "bool", "false", false, kNotImpl},
  };
  return t;
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), ::tolower);
  return s;
}

bool none_text(const std::string& v) {
  const std::string l = lower(v);
  return l == "none" || l == "null" || l == "~" || l.empty();
}

// "Empty" values that mean the same default: None, "", [], {}.
bool empty_value(const nlohmann::json& v) {
  return v.is_null() || (v.is_string() && v.get<std::string>().empty()) ||
         ((v.is_array() || v.is_object()) && v.empty());
}

nlohmann::json parse_typed(const TransformersKey& k, const std::string& v) {
  const std::string type = k.type;
  auto fail = [&](const char* want) -> nlohmann::json {
    throw Error(cat("training argument '", k.name, "': expected ", want, ", got '", v, "'"));
  };
  const bool nullable = type.find("None") != std::string::npos;
  if (nullable && none_text(v)) return nullptr;
  if (type == "str | bool") {  // include_num_input_tokens_seen: "no", "all", true, ...
    const std::string l = lower(v);
    if (l == "true" || l == "false") return l == "true";
    return v;
  }
  if (type.rfind("bool", 0) == 0) {
    const std::string l = lower(v);
    if (l == "true" || l == "1" || l == "yes" || l == "on") return true;
    if (l == "false" || l == "0" || l == "no" || l == "off") return false;
    return fail("true or false");
  }
  if (type.rfind("int", 0) == 0 || type.rfind("float", 0) == 0) {
    size_t pos = 0;
    double d = 0;
    try {
      d = std::stod(v, &pos);
    } catch (...) {
      pos = 0;
    }
    if (pos != v.size() || !std::isfinite(d)) return fail("a number");
    if (type.rfind("int", 0) == 0) {
      if (d != std::floor(d) || std::fabs(d) > 9e15) return fail("an integer");
      return (int64_t)d;
    }
    return d;
  }
  if (type.rfind("dict", 0) == 0 || type.find("list") != std::string::npos) {
    if (v.empty() && type.rfind("str", 0) == 0) return "";  // debug's default ""
    if (none_text(v))
      return type.find("list") != std::string::npos && !nullable ? nlohmann::json::array()
                                                                 : nlohmann::json();
    if (!v.empty() && (v[0] == '{' || v[0] == '[')) {
      nlohmann::json j = nlohmann::json::parse(v, nullptr, false);
      if (j.is_discarded()) return fail("JSON");
      if (type.rfind("dict", 0) == 0 && !j.is_object()) return fail("a mapping");
      if (type.rfind("dict", 0) != 0 && !j.is_array()) return fail("a list");
      return j;
    }
    if (type.rfind("dict", 0) == 0) return fail("a mapping (JSON object)");
    return v;  // a single string where a list may be given
  }
  return v;  // str
}

}  // namespace

const std::vector<TransformersKey>& transformers_keys() { return table(); }

const TransformersKey* find_transformers_key(const std::string& name) {
  for (auto& k : table())
    if (name == k.name) return &k;
  return nullptr;
}

nlohmann::json parse_transformers_key(const TransformersKey& k, const std::string& text) {
  nlohmann::json v = parse_typed(k, text);
  if (!k.choices.empty() && v.is_string() &&
      std::find(k.choices.begin(), k.choices.end(), v.get<std::string>()) == k.choices.end()) {
    std::string list;
    for (auto& c : k.choices) list += (list.empty() ? "" : ", ") + c;
    throw Error(cat("training argument '", k.name, "': '", text, "' is not one of: ", list));
  }
  if (!k.any_value) {
    const nlohmann::json def = nlohmann::json::parse(k.default_json);
    const bool same = v == def || (empty_value(v) && empty_value(def)) ||
                      (std::string(k.name) == "include_num_input_tokens_seen" && v == false);
    if (!same)
      throw Error(cat("training argument '", k.name, "': ", v.dump(), " is not supported (only ",
                      k.default_json, "): ", k.note));
  }
  return v;
}

}  // namespace onyx::train
