// cmd_run.cc — `onyx run MODEL.onnx --inputs IN.safetensors --output OUT.safetensors`:
// one forward pass in inference mode (Dropout is the identity); every graph output is written
// under its name.
#include <filesystem>
#include <iostream>

#include "commands.h"
#include "hf_folder.h"
#include "io/safetensors.h"
#include "ir/onnx_io.h"
#include "runtime/session.h"

namespace onyx::cli {

Action add_run_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("run", "run a model's forward pass (inference mode)");
  struct Opts {
    std::string model, inputs, output;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("model", o->model, "an .onnx file or a Hugging Face checkpoint folder")
      ->required();
  cmd->add_option("--inputs", o->inputs, "safetensors file with one tensor per graph input")
      ->required();
  cmd->add_option("--output", o->output, "safetensors file to write the graph outputs to")
      ->required();
  return [o]() {
    if (std::filesystem::is_directory(o->model))  // config.json + model.safetensors
      return run_hf_folder_cli(o->model, o->inputs, o->output);
    auto g = std::make_shared<ir::Graph>(ir::load_onnx(o->model));
    auto in = io::load_safetensors(o->inputs);
    runtime::Session s(g);
    s.check_supported();
    auto out = s.run(in.tensors);
    io::save_safetensors(o->output, out);
    for (auto& [k, t] : out)
      std::cout << k << ": " << dtype_name(t.dtype()) << " " << shape_str(t.shape()) << "\n";
    return 0;
  };
}

}  // namespace onyx::cli
