// cmd_export.cc — `onyx export CHECKPOINT_OR_MODEL --output model.onnx [--keep-loss]`: the forward
// graph with the trained weights, Dropout removed, the loss removed unless asked, standard ops
// only.
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "io/safetensors.h"
#include "ir/onnx_io.h"
#include "models/hf_weights.h"
#include "passes/inference_export.h"

namespace fs = std::filesystem;

namespace onyx::cli {

Action add_export_command(CLI::App& app) {
  auto* cmd =
      app.add_subcommand("export", "write an inference ONNX model from a checkpoint or model");
  struct Opts {
    std::string input, output, loss;
    bool keep_loss = false;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("input", o->input,
                  "a checkpoint folder, a Hugging Face model folder, or an .onnx file")
      ->required();
  cmd->add_option("--output", o->output, "the .onnx file to write")->required();
  cmd->add_option("--loss", o->loss,
                  "name of the loss output to remove (default: from the checkpoint)");
  cmd->add_flag("--keep-loss", o->keep_loss, "keep the loss output (and its label inputs)");
  return [o]() {
    ir::Graph g;
    std::string loss = o->loss;
    if (fs::is_directory(o->input) && fs::exists(fs::path(o->input) / "config.json")) {
      // A Hugging Face folder (or a checkpoint of an onyx-built HF model): config.json + weights.
      models::BuiltModel b = models::load_hf_folder(o->input);
      g = *b.model.graph;
      if (loss.empty())
        for (auto& out : g.outputs)
          if (out.name == "loss") loss = "loss";
    } else if (fs::is_directory(o->input)) {
      fs::path dir(o->input);
      fs::path meta = dir / "onyx_model.json";
      ONYX_CHECK(fs::exists(meta), "'", o->input,
                 "' has no onyx_model.json (not an onyx checkpoint)");
      nlohmann::json j;
      try {
        std::ifstream f(meta);
        j = nlohmann::json::parse(f);
      } catch (const std::exception& e) {
        throw Error(cat("'", meta.string(), "': not valid JSON: ", e.what()));
      }
      ONYX_CHECK(j.contains("source") && j["source"].is_string(), "'", meta.string(),
                 "': missing 'source' (the model the checkpoint was trained from)");
      g = ir::load_onnx(j["source"].get<std::string>());
      if (loss.empty() && j.contains("loss_output") && j["loss_output"].is_string())
        loss = j["loss_output"].get<std::string>();
      auto w = io::load_safetensors((dir / "model.safetensors").string());
      for (auto& [name, t] : w.tensors) {
        auto it = g.initializers.find(name);
        ONYX_CHECK(it != g.initializers.end(), "checkpoint tensor '", name,
                   "' is not in the model");
        ONYX_CHECK(it->second.meta() == t.meta(), "checkpoint tensor '", name, "' has shape ",
                   shape_str(t.shape()), " but the model has ", shape_str(it->second.shape()));
        it->second = t;
      }
    } else {
      g = ir::load_onnx(o->input);
    }
    passes::InferenceExportOptions eo;
    eo.loss_output = loss;
    eo.keep_loss = o->keep_loss;
    ir::Graph out = passes::make_inference_graph(g, eo);
    ir::save_onnx(out, o->output);
    std::cout << "wrote " << o->output << ": " << out.nodes.size() << " nodes, "
              << out.inputs.size() << " inputs, " << out.outputs.size() << " outputs\n";
    return 0;
  };
}

}  // namespace onyx::cli
