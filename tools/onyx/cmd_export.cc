// cmd_export.cc — `onyx export CHECKPOINT_OR_MODEL --output model.onnx [--keep-loss]
// [--dtype float32|bfloat16]`: the forward graph with the trained weights, Dropout removed, the
// loss removed unless asked, standard ops only; with --dtype bfloat16 the weights are stored bf16
// and cast to float32 inside the graph (ir::store_weights_bf16).
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <set>

#include "commands.h"
#include "io/safetensors.h"
#include "ir/bf16_storage.h"
#include "ir/onnx_io.h"
#include "models/hf_weights.h"
#include "models/lora.h"
#include "passes/inference_export.h"

namespace fs = std::filesystem;

namespace onyx::cli {

Action add_export_command(CLI::App& app) {
  auto* cmd =
      app.add_subcommand("export", "write an inference ONNX model from a checkpoint or model");
  struct Opts {
    std::string input, output, loss, dtype = "float32";
    bool keep_loss = false, merge_lora = false;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("input", o->input,
                  "a checkpoint folder, a Hugging Face model folder, or an .onnx file")
      ->required();
  cmd->add_option("--output", o->output, "the .onnx file to write")->required();
  cmd->add_option("--loss", o->loss,
                  "name of the loss output to remove (default: from the checkpoint)");
  cmd->add_flag("--keep-loss", o->keep_loss, "keep the loss output (and its label inputs)");
  cmd->add_option("--dtype", o->dtype,
                  "float32 (default), or bfloat16 (also bf16): weights stored bf16 and cast to "
                  "float32 in the graph (half the file; the arithmetic stays float32)")
      ->check(CLI::IsMember({"float32", "fp32", "bfloat16", "bf16"}));
  cmd->add_flag("--merge-lora", o->merge_lora,
                "a LoRA checkpoint: merge the adapters into the weights; --output a .onnx file, or "
                "a folder for a Hugging Face model folder (config.json, model.safetensors, "
                "tokenizer files)");
  return [o]() {
    ir::Graph g;
    std::string loss = o->loss;
    const bool lora = fs::exists(fs::path(o->input) / "adapter_config.json");
    ONYX_CHECK(!o->merge_lora || lora, "--merge-lora: '", o->input,
               "' has no adapter_config.json (not a LoRA checkpoint or adapter folder)");
    const bool to_folder = o->merge_lora && (o->output.size() < 5 ||
                                             o->output.substr(o->output.size() - 5) != ".onnx");
    const bool bf16 = o->dtype == "bfloat16" || o->dtype == "bf16";
    ONYX_CHECK(!(bf16 && to_folder), "--dtype ", o->dtype,
               " applies to an .onnx --output; the merged Hugging Face folder '", o->output,
               "' is written in float32");
    if (fs::is_directory(o->input) && fs::exists(fs::path(o->input) / "config.json")) {
      // A Hugging Face folder (or a checkpoint of an onyx-built HF model): config.json + weights.
      models::BuiltModel b = models::load_hf_folder(o->input);
      g = *b.model.graph;
      if (loss.empty())
        for (auto& out : g.outputs)
          if (out.name == "loss") loss = "loss";
      if (lora) {  // the adapters: merged into the weights, or as nodes of the graph
        models::LoraSpec spec = models::read_adapter_config(o->input);
        auto adapter =
            io::load_safetensors((fs::path(o->input) / "adapter_model.safetensors").string())
                .tensors;
        if (o->merge_lora) {
          auto merged = models::merge_lora(g, spec, adapter);
          std::cout << "merged LoRA adapters into " << merged.size() << " layers\n";
        } else {
          models::apply_lora(g, spec, 0, adapter);
        }
      }
      if (to_folder) {  // a Hugging Face folder of the merged model
        fs::create_directories(o->output);
        std::map<std::string, Tensor> w(g.initializers.begin(), g.initializers.end());
        for (auto& [name, src] : b.tied) w.erase(name);
        io::save_safetensors((fs::path(o->output) / "model.safetensors").string(), w,
                             {{"format", "pt"}});
        static const std::set<std::string> skip = {
            "adapter_config.json", "adapter_model.safetensors",
            "model.safetensors",   "onyx_model.json",
            "trainer_state.json",  "training_args.json",
            "rng_state.json",      "scheduler.json",
            "log_history.jsonl"};
        for (auto& e : fs::directory_iterator(o->input)) {
          std::string n = e.path().filename().string();
          if (!e.is_regular_file() || skip.count(n) || n.rfind("optimizer", 0) == 0) continue;
          fs::copy_file(e.path(), fs::path(o->output) / n, fs::copy_options::overwrite_existing);
        }
        std::cout << "wrote " << o->output << ": model.safetensors (" << w.size()
                  << " tensors, adapters merged) and config/tokenizer files\n";
        return 0;
      }
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
    size_t n_bf16 = bf16 ? ir::store_weights_bf16(out).size() : 0;
    ir::save_onnx(out, o->output);
    std::cout << "wrote " << o->output << ": " << out.nodes.size() << " nodes, "
              << out.inputs.size() << " inputs, " << out.outputs.size() << " outputs";
    if (bf16) std::cout << ", " << n_bf16 << " weights stored bfloat16";
    std::cout << "\n";
    return 0;
  };
}

}  // namespace onyx::cli
