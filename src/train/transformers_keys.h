// train/transformers_keys.h — the keys of Transformers' TrainingArguments (5.24, the pinned
// version) that onyx has no field for: scripts pass them routinely (do_train, run_name,
// push_to_hub=False, dataloader_num_workers, torch_compile=False, ...), so a config or a Python
// TrainingArguments accepts every one of them. Each is either inert here — it changes nothing
// onyx computes (names for trackers, data-loader workers, CUDA-only switches: any value of its
// type is accepted and recorded) — or not implemented: only its default is accepted, and any other
// value is an error saying why (the run would differ from Transformers', or needs what this
// machine has not: the Hub, GPUs, DeepSpeed). Nothing is accepted and silently dropped.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace onyx::train {

struct TransformersKey {
  const char* name;
  const char* type;          // as --help prints it: bool, int, str, str | None, dict | None, ...
  const char* default_json;  // Transformers' default, as JSON
  bool any_value;            // true: inert here, every value of the type accepted
  const char* note;          // why inert, or why only the default (the error's reason)
  std::vector<std::string> choices = {};  // for a choice among strings
};

const std::vector<TransformersKey>& transformers_keys();
const TransformersKey* find_transformers_key(const std::string& name);
// `text` (a config's or a flag's value, "none" for None, JSON for a dict or list) as the key's
// JSON value; an ill-typed value, or a non-default one of a key that keeps its default, is an
// error naming the key.
nlohmann::json parse_transformers_key(const TransformersKey& key, const std::string& text);

}  // namespace onyx::train
