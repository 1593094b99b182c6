// config/config_values.h — what the config's files share (run_config.cc reads the keys,
// datasets.cc the dataset specs): a YAML value as text, relative paths resolved against the
// config's folder, numbers and flags checked, and GRPO's options as the loss and the rollouts
// both need them. Internal to src/config.
#pragma once
#include <yaml-cpp/yaml.h>

#include <string>

#include "config/run_config.h"
#include "train/grpo.h"

namespace onyx::config {

// A single YAML value's text ("none" for null); a list or mapping is an error naming `key`.
std::string scalar(const YAML::Node& n, const std::string& key, const std::string& what);
// `p` against the config's folder when it is relative and exists there (or nowhere else).
std::string resolve(const std::string& base_dir, const std::string& p);
// A config value read as a finite number / as true or false ("yes", "1" or "on" are neither);
// errors name the key and where it was.
double finite_number(const std::string& text, const std::string& key, const std::string& what);
bool true_or_false(const std::string& text, const std::string& key, const std::string& what);
// The GRPO options with what the loss shares with sampling: the temperature the logits are
// divided by, dr_grpo's normalizer, whether the old policy's log-probabilities are inputs.
train::GrpoOptions grpo_options(const RunConfig& c);

}  // namespace onyx::config
