// hf_folder.h — what `onyx run` and `onyx grad` do when their model argument is a Hugging Face
// checkpoint folder (config.json + model.safetensors) instead of an .onnx file.
#pragma once
#include <cstdint>
#include <string>

namespace onyx::cli {

// One forward pass in inference mode (Dropout as the identity, the CausalLM loss and its labels
// removed): inputs by graph-input name from `inputs` (attention_mask / token_type_ids default to
// ones / zeros, an encoder–decoder's decoder_input_ids are labels shifted right; labels are
// otherwise ignored), every output written to `output` (safetensors).
// Prints one "name: dtype shape" line per output. Returns the exit code.
int run_hf_folder_cli(const std::string& dir, const std::string& inputs, const std::string& output);

// One forward + backward in training mode with the task's loss (labels from `inputs`): writes
// "loss" and one gradient per weight, under Transformers' names, to `output`. `dropout` false runs
// Dropout as the identity. Returns the exit code.
int grad_hf_folder_cli(const std::string& dir, const std::string& inputs, const std::string& output,
                       uint64_t seed = 0, bool dropout = true);

}  // namespace onyx::cli
