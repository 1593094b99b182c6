// cmd_export.cc — `onyx export CHECKPOINT_OR_MODEL --output model.onnx [--keep-loss]
// [--dtype float32|bfloat16]`: the forward graph with the trained weights, Dropout removed, the
// loss removed unless asked, standard ops only; with --dtype bfloat16 the weights are stored bf16
// and cast to float32 inside the graph (ir::store_weights_bf16). `--merge-lora --output DIR`: the
// merged model as a Hugging Face folder; `--output model.gguf [--outtype f16]` (or --format
// gguf): a Llama-family model as llama.cpp's GGUF (models/gguf_export.h). A 4-bit base (QLoRA) is
// dequantized first, then the adapters merged in float32.
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <set>

#include "commands.h"
#include "diffusion/diffusers_folder.h"
#include "io/safetensors.h"
#include "ir/bf16_storage.h"
#include "ir/onnx_io.h"
#include "models/gguf_export.h"
#include "models/hf_weights.h"
#include "models/lora.h"
#include "passes/inference_export.h"
#include "quant/store_4bit.h"

namespace fs = std::filesystem;

namespace onyx::cli {

namespace {

struct ExportOpts {
  std::string input, output, loss, dtype = "float32", format, outtype = "f16";
  bool keep_loss = false, merge_lora = false;
};

// What --output asks for: "onnx", "hf" (a merged Hugging Face folder) or "gguf".
std::string export_format(const ExportOpts& o) {
  auto ends = [&](const std::string& e) {
    return o.output.size() >= e.size() &&
           o.output.compare(o.output.size() - e.size(), e.size(), e) == 0;
  };
  if (!o.format.empty()) return o.format;
  if (ends(".gguf")) return "gguf";
  if (ends(".onnx")) return "onnx";
  return o.merge_lora ? "hf" : "onnx";
}

// A Hugging Face folder (or a checkpoint of an onyx-built HF model) with float32 weights: a 4-bit
// base (QLoRA) dequantized; a LoRA checkpoint's adapters merged (--merge-lora) or as nodes.
models::BuiltModel load_hf_for_export(const ExportOpts& o, bool lora) {
  models::BuiltModel b = models::load_hf_folder(o.input);
  quant::restore_float_weights(*b.model.graph);
  if (!lora) return b;
  models::LoraSpec spec = models::read_adapter_config(o.input);
  auto adapter =
      io::load_safetensors((fs::path(o.input) / "adapter_model.safetensors").string()).tensors;
  if (o.merge_lora) {
    auto merged = models::merge_lora(*b.model.graph, spec, adapter);
    std::cout << "merged LoRA adapters into " << merged.size() << " layers\n";
  } else {
    models::apply_lora(*b.model.graph, spec, 0, adapter);
  }
  return b;
}

// The model's weights by Transformers name, tied copies left out.
std::map<std::string, Tensor> untied_weights(const models::BuiltModel& b) {
  const ir::Graph& g = *b.model.graph;
  std::map<std::string, Tensor> w(g.initializers.begin(), g.initializers.end());
  for (auto& [name, src] : b.tied) w.erase(name);
  return w;
}

int write_gguf_file(const ExportOpts& o, const models::BuiltModel& b, bool lora) {
  models::GgufExportOptions go;
  go.type = io::parse_ggml_type(o.outtype, "--outtype");
  const int n = models::write_gguf(b.config, untied_weights(b), o.input, o.output, go);
  std::cout << "wrote " << o.output << ": " << n << " tensors (" << io::ggml_type_name(go.type)
            << "), " << b.config.model_type << (lora ? ", adapters merged" : "") << "\n";
  return 0;
}

// The checkpoint's config.json for float weights: a QLoRA run's quantization_config left out (the
// merged weights are float32; with it Transformers would read them as 4-bit codes).
void write_float_config(const fs::path& from, const fs::path& to) {
  nlohmann::ordered_json j;
  try {
    std::ifstream f(from);
    j = nlohmann::ordered_json::parse(f);
  } catch (const std::exception& e) {
    throw Error(cat("'", from.string(), "': not valid JSON: ", e.what()));
  }
  if (j.is_object()) j.erase("quantization_config");
  std::ofstream(to) << j.dump(2) << "\n";
}

// A Hugging Face folder of the merged model: model.safetensors and the checkpoint's config and
// tokenizer files.
int write_merged_folder(const ExportOpts& o, const models::BuiltModel& b) {
  fs::create_directories(o.output);
  auto w = untied_weights(b);
  io::save_safetensors((fs::path(o.output) / "model.safetensors").string(), w, {{"format", "pt"}});
  static const std::set<std::string> skip = {
      "adapter_config.json", "adapter_model.safetensors", "model.safetensors", "onyx_model.json",
      "trainer_state.json",  "training_args.json",        "rng_state.json",    "scheduler.json",
      "log_history.jsonl"};
  for (auto& e : fs::directory_iterator(o.input)) {
    std::string n = e.path().filename().string();
    if (!e.is_regular_file() || skip.count(n) || n.rfind("optimizer", 0) == 0) continue;
    if (n == "config.json")
      write_float_config(e.path(), fs::path(o.output) / n);
    else
      fs::copy_file(e.path(), fs::path(o.output) / n, fs::copy_options::overwrite_existing);
  }
  std::cout << "wrote " << o.output << ": model.safetensors (" << w.size()
            << " tensors, adapters merged) and config/tokenizer files\n";
  return 0;
}

// An onyx checkpoint of an ONNX model: its source graph with the checkpoint's weights; `loss`
// filled from onyx_model.json when empty.
ir::Graph load_onnx_checkpoint(const std::string& input, std::string& loss) {
  fs::path dir(input);
  fs::path meta = dir / "onyx_model.json";
  ONYX_CHECK(fs::exists(meta), "'", input, "' has no onyx_model.json (not an onyx checkpoint)");
  nlohmann::json j;
  try {
    std::ifstream f(meta);
    j = nlohmann::json::parse(f);
  } catch (const std::exception& e) {
    throw Error(cat("'", meta.string(), "': not valid JSON: ", e.what()));
  }
  ONYX_CHECK(j.contains("source") && j["source"].is_string(), "'", meta.string(),
             "': missing 'source' (the model the checkpoint was trained from)");
  ir::Graph g = ir::load_onnx(j["source"].get<std::string>());
  if (loss.empty() && j.contains("loss_output") && j["loss_output"].is_string())
    loss = j["loss_output"].get<std::string>();
  auto w = io::load_safetensors((dir / "model.safetensors").string());
  for (auto& [name, t] : w.tensors) {
    auto it = g.initializers.find(name);
    ONYX_CHECK(it != g.initializers.end(), "checkpoint tensor '", name, "' is not in the model");
    ONYX_CHECK(it->second.meta() == t.meta(), "checkpoint tensor '", name, "' has shape ",
               shape_str(t.shape()), " but the model has ", shape_str(it->second.shape()));
    it->second = t;
  }
  return g;
}

int write_onnx(const ExportOpts& o, const ir::Graph& g, const std::string& loss, bool bf16) {
  passes::InferenceExportOptions eo;
  eo.loss_output = loss;
  eo.keep_loss = o.keep_loss;
  ir::Graph out = passes::make_inference_graph(g, eo);
  size_t n_bf16 = bf16 ? ir::store_weights_bf16(out).size() : 0;
  ir::save_onnx(out, o.output);
  std::cout << "wrote " << o.output << ": " << out.nodes.size() << " nodes, " << out.inputs.size()
            << " inputs, " << out.outputs.size() << " outputs";
  if (bf16) std::cout << ", " << n_bf16 << " weights stored bfloat16";
  std::cout << "\n";
  return 0;
}

int run_export(const ExportOpts& o) {
  const bool lora = fs::exists(fs::path(o.input) / "adapter_config.json");
  ONYX_CHECK(!o.merge_lora || lora, "--merge-lora: '", o.input,
             "' has no adapter_config.json (not a LoRA checkpoint or adapter folder)");
  const std::string format = export_format(o);
  const bool bf16 = o.dtype == "bfloat16" || o.dtype == "bf16";
  io::parse_ggml_type(o.outtype, "--outtype");  // checked before anything is read
  ONYX_CHECK(format != "gguf" || !lora || o.merge_lora, "--output ", o.output, ": '", o.input,
             "' is a LoRA checkpoint; a GGUF file holds merged weights: add --merge-lora");
  ONYX_CHECK(format != "hf" || o.merge_lora,
             "--format hf writes a merged LoRA checkpoint: add --merge-lora");
  ONYX_CHECK(!(bf16 && format == "hf"), "--dtype ", o.dtype,
             " applies to an .onnx --output; the merged Hugging Face folder '", o.output,
             "' is written in float32");
  const bool hf = fs::is_directory(o.input) && fs::exists(fs::path(o.input) / "config.json");
  ONYX_CHECK(format != "gguf" || hf, "--output ", o.output,
             ": GGUF export reads a Hugging Face folder (config.json), not '", o.input, "'");
  std::string loss = o.loss;
  if (hf && diffusion::is_diffusers_folder(o.input)) {  // the sampling graph with its weights
    ONYX_CHECK(format == "onnx" && !lora, "--output ", o.output, ": '", o.input,
               "' is a diffusers model: it exports as .onnx (LoRA adapters are PEFT's files)");
    return write_onnx(o, *diffusion::load_denoiser(o.input).graph, "", bf16);
  }
  if (hf) {
    models::BuiltModel b = load_hf_for_export(o, lora);
    if (format == "gguf") return write_gguf_file(o, b, lora);
    if (format == "hf") return write_merged_folder(o, b);
    if (loss.empty())
      for (auto& out : b.model.graph->outputs)
        if (out.name == "loss") loss = "loss";
    return write_onnx(o, *b.model.graph, loss, bf16);
  }
  ir::Graph g =
      fs::is_directory(o.input) ? load_onnx_checkpoint(o.input, loss) : ir::load_onnx(o.input);
  return write_onnx(o, g, loss, bf16);
}

}  // namespace

Action add_export_command(CLI::App& app) {
  auto* cmd =
      app.add_subcommand("export",
                         "write a checkpoint or model as inference ONNX, a merged Hugging Face "
                         "folder, or GGUF");
  auto o = std::make_shared<ExportOpts>();
  cmd->add_option("input", o->input,
                  "a checkpoint folder, a Hugging Face model folder, or an .onnx file")
      ->required();
  cmd->add_option("--output", o->output,
                  "what to write: an .onnx file, a folder (--merge-lora: a Hugging Face model "
                  "folder) or a .gguf file")
      ->required();
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
                "tokenizer files), or a .gguf file");
  cmd->add_option("--format", o->format,
                  "onnx, hf (a Hugging Face folder) or gguf (llama.cpp; Llama, Mistral, Qwen2); "
                  "default: from --output (.onnx, .gguf, else a folder with --merge-lora)")
      ->check(CLI::IsMember({"onnx", "hf", "gguf"}));
  cmd->add_option(
      "--outtype", o->outtype,
      "GGUF: the matrices' type: f32, f16 (default), bf16, q8_0 or q4_0 (norms and other "
      "1-D tensors stay f32)");
  return [o]() { return run_export(*o); };
}

}  // namespace onyx::cli
