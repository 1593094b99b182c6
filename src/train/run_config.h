// train/run_config.h — the `onyx train` config file (YAML or JSON): the model, the loss, the data,
// metrics, and any TrainingArguments by their Hugging Face names. `--key value` on the command line
// overrides the file. Unknown keys and ill-typed values are errors naming the key and the file.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "onyx/trainer.h"
#include "onyx/training_args.h"

namespace onyx::train {

struct RunConfig {
  std::string path;         // the config file
  std::string model;        // .onnx path (relative paths resolve against the config's folder)
  autodiff::LossSpec loss;
  std::string train_data, eval_data, test_data;
  std::vector<std::string> metrics;
  std::vector<std::string> frozen;
  std::string predictions;  // output used for metrics / predict
  TrainingArguments args;
};

// overrides: ("learning_rate", "1e-4"), ... applied after the file, in order.
RunConfig load_run_config(const std::string& path,
                          const std::vector<std::pair<std::string, std::string>>& overrides);

// Parses "--key value" / "--key=value" pairs; throws on a dangling key.
std::vector<std::pair<std::string, std::string>> parse_overrides(const std::vector<std::string>& args);

Model model_from_config(const RunConfig& c);

}  // namespace onyx::train
