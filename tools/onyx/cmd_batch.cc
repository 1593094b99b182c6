// cmd_batch.cc — `onyx batch CONFIG --output BATCH.safetensors [--data eval_data] [--rows 0,3,7 |
// --count N] [--epoch E] [--key value ...]`: the batch a config's dataset gives for some rows, as
// the Trainer reads it (train_data with the epoch's augmentations: set_epoch with the run's data
// seed), before the model's own preparation of it — what the data pipeline makes of the files,
// to look at or compare with another library's.
#include <iostream>

#include "commands.h"
#include "config/run_config.h"
#include "io/safetensors.h"

namespace onyx::cli {

Action add_batch_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "batch", "write the batch a config's dataset gives for some rows into a .safetensors file");
  auto path = std::make_shared<std::string>();
  auto output = std::make_shared<std::string>();
  auto which = std::make_shared<std::string>("train_data");
  auto rows = std::make_shared<std::vector<int64_t>>();
  auto count = std::make_shared<int64_t>(0);
  auto epoch = std::make_shared<int64_t>(0);
  cmd->add_option("config", *path, "config file (.yaml or .json)")->required();
  cmd->add_option("--output", *output, "the .safetensors file to write")->required();
  cmd->add_option("--data", *which, "train_data, eval_data or test_data")
      ->check(CLI::IsMember({"train_data", "eval_data", "test_data"}));
  cmd->add_option("--rows", *rows, "the rows (default: the first --count)")->delimiter(',');
  cmd->add_option("--count", *count, "the first N rows (default: per_device_train_batch_size)");
  cmd->add_option("--epoch", *epoch, "the training epoch whose random augmentations to draw");
  cmd->allow_extras();
  return [=]() {
    const config::RunConfig c =
        config::load_run_config(*path, config::parse_overrides(cmd->remaining()));
    const config::DataSpec& spec = *which == "train_data"  ? c.train_data
                                   : *which == "eval_data" ? c.eval_data
                                                           : c.test_data;
    ONYX_CHECK(!spec.empty(), "config '", *path, "' has no ", *which);
    auto ds = config::dataset_from_spec(spec, c, *which);
    if (*which == "train_data")
      ds->set_epoch(*epoch, (uint64_t)c.args.data_seed.value_or(c.args.seed));
    std::vector<int64_t> idx = *rows;
    if (idx.empty()) {
      const int64_t n =
          std::min(*count > 0 ? *count : c.args.per_device_train_batch_size, ds->size());
      for (int64_t i = 0; i < n; ++i) idx.push_back(i);
    }
    for (int64_t i : idx)
      ONYX_CHECK(i >= 0 && i < ds->size(), "--rows: row ", i, " is not in the ", *which, " (",
                 ds->size(), " rows)");
    const auto batch = ds->batch(idx);
    io::save_safetensors(*output, batch, {{"format", "pt"}});
    std::cout << "wrote " << *output << ":";
    for (const auto& [k, t] : batch) std::cout << " " << k << " " << shape_str(t.shape());
    std::cout << "\n";
    return 0;
  };
}

}  // namespace onyx::cli
