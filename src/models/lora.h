// models/lora.h — LoRA adapters in PEFT's format on a model graph: for each linear layer whose
// module name matches target_modules, y = W x + b becomes y = W x + b + (B (A dropout(x))) * s,
// s = lora_alpha / r (lora_alpha / sqrt(r) with use_rslora), A (r, in) initialized as PEFT does
// (kaiming_uniform(a = sqrt(5)): U(-1/sqrt(in), 1/sqrt(in))), B (out, r) zeros, so training starts
// from the base model. Only the adapters (and, per `bias`, biases) train; everything else is
// frozen. Saved as PEFT saves them: adapter_config.json and adapter_model.safetensors with
// tensors "base_model.model.<module>.lora_A.weight" / ".lora_B.weight".
//
// Linear layers are found in the graph, not in the builder: an initializer "<module>.weight" of
// rank 2 that is transposed into a MatMul (nn.Linear, W (out, in)) or is a MatMul's right-hand
// side itself (GPT-2's Conv1D, W (in, out): PEFT's fan_in_fan_out), its output possibly followed
// by a bias Add. Works on onyx's Hugging Face graphs and on ONNX files that keep module names.
#pragma once
#include <map>
#include <set>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "quant/bnb_config.h"

namespace onyx::models {

// PEFT's prefix of every adapter tensor name in adapter_model.safetensors.
inline constexpr const char* kPeftPrefix = "base_model.model.";

struct LoraSpec {
  int64_t r = 8;
  double lora_alpha = 8;
  double lora_dropout = 0.0;
  std::vector<std::string> target_modules;  // names or suffixes (PEFT's list rule)
  std::string target_regex;                 // or one regular expression (PEFT's str rule)
  std::string bias = "none";                // none | all | lora_only
  bool use_rslora = false;
  std::string task_type = "CAUSAL_LM";  // "": null (PEFT's base PeftModel: a diffusers UNet)
  std::string base_model_name_or_path;
};

// Reads PEFT's adapter_config.json (a file, or a folder holding one). Throws naming the file and
// key for a missing / ill-typed key or a PEFT type other than LORA.
LoraSpec read_adapter_config(const std::string& path);
// The same from the file's text (`path` names it in messages).
LoraSpec parse_adapter_config(const std::string& json_text, const std::string& path);
std::string adapter_config_json(const LoraSpec& spec);

struct LoraResult {
  std::vector<std::string> modules;                    // adapted modules, in graph order
  std::map<std::string, std::string> adapter_tensors;  // graph name -> PEFT's saved name
  std::vector<std::string> trainable;                  // adapters (+ biases per `bias`)
};

// Adds the adapters to `g` (initial values from `initial` when it has them, under PEFT's saved
// names, else PEFT's initialization from `seed`). Throws when no module matches, naming the
// linear layers the graph has.
LoraResult apply_lora(ir::Graph& g, const LoraSpec& spec, uint64_t seed,
                      const std::map<std::string, Tensor>& initial = {});

// A PEFT adapter (adapter_model.safetensors' tensors) merged into the graph's weights:
// W += s * B A for nn.Linear, W += s * (B A)^T for Conv1D; trained biases (bias: all / lora_only)
// replace the base's. Returns the merged modules; throws naming a tensor no module has.
std::vector<std::string> merge_lora(ir::Graph& g, const LoraSpec& spec,
                                    const std::map<std::string, Tensor>& adapter);

// Stores the frozen linear weights of `g` in bfloat16 (TRL's model_init_kwargs dtype: bfloat16
// with LoRA — half the base's memory): each float32 initializer in `frozen` of rank 2 that is
// read only as a MatMul's right-hand side, directly or through Transpose(perm [1,0]) (nn.Linear,
// Conv1D, an untied LM head), becomes a bf16 initializer of the same name (rounded to nearest
// even) read through one Cast(W, to=FLOAT) node; passes/bf16_weight_fusion.cc then lets the fused
// MatMulT / LinearCrossEntropy kernels read the bf16 tensor itself (bf16 inputs, float32
// accumulation). Weights read otherwise (an embedding table, a tied LM head) stay float32.
// Returns the converted names.
std::vector<std::string> store_frozen_weights_bf16(ir::Graph& g,
                                                   const std::set<std::string>& frozen);

// How a frozen linear weight is read: as MatMul(X, W) (Conv1D's (in, out) layout, an outer
// projection) or as MatMul(X, Transpose(W)) (nn.Linear's (out, in)).
enum class LinearRead { Direct, Transposed };
// The float32 initializers in `frozen` of rank 2 read only as a MatMul's right-hand side, one way.
std::map<std::string, LinearRead> frozen_linear_weights(const ir::Graph& g,
                                                        const std::set<std::string>& frozen);

// QLoRA (TRL's model_init_kwargs.quantization_config, a 4-bit folder's config.json): the frozen
// nn.Linear weights Transformers would quantize for `c` (not the LM head, none of
// llm_int8_skip_modules) stored in bitsandbytes' 4-bit format (quant/store_4bit.h), bit for bit as
// bitsandbytes quantizes them; a Conv1D weight (GPT-2, read as MatMul(X, W)) quantized from its
// transpose, as Transformers does. Returns the quantized names.
std::vector<std::string> store_frozen_weights_4bit(ir::Graph& g,
                                                   const std::set<std::string>& frozen,
                                                   const quant::BnbConfig& c);

}  // namespace onyx::models
