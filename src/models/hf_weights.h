// models/hf_weights.h — Hugging Face checkpoint folders: config.json + model.safetensors (or the
// shards named by model.safetensors.index.json) into a BuiltModel, and back.
//
// Loading follows Transformers' from_pretrained: F32/F16/BF16 tensors (converted to float32),
// legacy LayerNorm "gamma"/"beta" names, buffers ("position_ids", GPT-2's "attn.bias") ignored, the
// base-model prefix ("bert.", "transformer.", ...) added or stripped as the checkpoint and the
// task need, tied copies ("lm_head.weight") accepted; weights the checkpoint lacks keep their
// random init and are listed in a warning, tensors the model has no use for are listed in another,
// and a tensor of the wrong shape is an error naming it and both shapes.
#pragma once
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "models/hf_model.h"

namespace onyx::models {

// Reads dir/config.json and the weights. `task` defaults to the config's first "architectures"
// entry (Base when there is none). `seed` initializes what the checkpoint lacks.
// `quantize` (QLoRA's quantization_config): the linear weights stored 4-bit as they are built and
// read (a folder saved 4-bit keeps its own quantization_config). `bf16_linears` (LoRA over a bf16
// base): the linear weights stored bf16 as they are built and read (HfConfig::bf16_linears).
BuiltModel load_hf_folder(const std::string& dir, std::optional<Task> task = std::nullopt,
                          int64_t seed = 0,
                          const std::optional<quant::BnbConfig>& quantize = std::nullopt,
                          bool bf16_linears = false);

// A float tensor (F32/F16/BF16/F64) as an owned float32 tensor; other dtypes are kept as they
// are (buffers such as position_ids are int64) and rejected only if used as a weight.
Tensor to_float32(const Tensor& t);

// Reads the checkpoint tensors of a folder as stored (model.safetensors, else the shards of
// model.safetensors.index.json), any float dtype converted to float32 — or, with `mapped`, as
// views of the memory-mapped files in their stored dtypes (no copy, no page read yet), for
// apply_hf_checkpoint to convert one by one.
std::map<std::string, Tensor> read_hf_checkpoint(const std::string& dir, bool mapped = false);

// Puts checkpoint tensors (names as in a Transformers state_dict; any float dtype, converted to
// float32 as each is put in) into the model's initializers, filling model.missing_keys /
// unexpected_keys and printing Transformers' warnings to stderr. With `views` the tensors are
// views of mapped files (read_hf_checkpoint's `mapped`): each is copied and its pages dropped as it
// is put in, and the initializer it replaces is freed then, so the weights are held about once,
// not three times, while loading.
// `what` names the checkpoint in messages.
void apply_hf_checkpoint(BuiltModel& model, const std::map<std::string, Tensor>& tensors,
                         const std::string& what, bool views = false);

// The model's weights by Transformers name (tied copies not included).
std::map<std::string, Tensor> hf_weights(const BuiltModel& model);

// Writes dir/config.json (architectures, model_type, id2label/label2id) and dir/model.safetensors
// (metadata format=pt; float32; tied weights omitted), each atomically. `weights` overrides the
// model's initializers by name (e.g. trained values); every name must be a model weight of the
// model's shape. Shards of an earlier sharded save in `dir` are removed.
void save_hf_folder(const BuiltModel& model, const std::map<std::string, Tensor>& weights,
                    const std::string& dir);

// Adds the inputs a caller may leave out: attention_mask (ones) and token_type_ids (zeros), shaped
// as input_ids, position_ids (0..T-1), and an encoder–decoder's decoder_input_ids (labels shifted
// right, as Transformers' shift_tokens_right), when the graph takes them.
void fill_default_inputs(const BuiltModel& model, std::map<std::string, Tensor>& inputs);
// The same as a function that holds only the names it needs (not the graph), and those names.
std::function<void(std::map<std::string, Tensor>&)> default_input_filler(const BuiltModel& model);
std::set<std::string> defaulted_inputs(const BuiltModel& model);

}  // namespace onyx::models
