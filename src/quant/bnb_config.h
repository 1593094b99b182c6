// quant/bnb_config.h — Transformers' BitsAndBytesConfig, its 4-bit part: how a model's linear
// layers are stored (load_in_4bit, bnb_4bit_quant_type, bnb_4bit_use_double_quant,
// bnb_4bit_compute_dtype, llm_int8_skip_modules), read from a config.json's quantization_config,
// from TRL's model_init_kwargs.quantization_config, or from the Python API, and written back as
// Transformers writes it.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "quant/bnb4.h"

namespace onyx::quant {

struct BnbConfig {
  Code4 quant_type = Code4::Fp4;  // Transformers' default
  bool double_quant = false;
  // The GEMMs' input precision: "float32" (default) or "bfloat16" (dequantized tiles and
  // activations rounded to bf16, float32 accumulation).
  std::string compute_dtype = "float32";
  // Modules left unquantized besides the LM head: a linear layer whose module name contains one
  // of these (Transformers' llm_int8_skip_modules).
  std::vector<std::string> skip_modules;
  int64_t blocksize = 64;  // bitsandbytes' 4-bit blocks (not a BitsAndBytesConfig field)
};

// Reads a quantization_config mapping. It must ask for 4-bit bitsandbytes (load_in_4bit true,
// quant_method absent or "bitsandbytes"); 8-bit, other methods, float16 compute and a quant storage
// other than uint8 are errors naming `what` and the key. `strict`: an unknown key is an error too
// (a user's config), else ignored (a config.json written by a newer Transformers).
BnbConfig parse_bnb_config(const nlohmann::json& j, const std::string& what, bool strict);

// The mapping Transformers writes into config.json for this configuration.
nlohmann::ordered_json bnb_config_json(const BnbConfig& c);

// Whether a linear layer's weight (a state_dict name, "model.layers.0.mlp.up_proj.weight") is
// quantized: not the output head (lm_head, score, classifier: the model's last module, which
// Transformers leaves) and no skip module in its module name.
bool quantizes_module(const BnbConfig& c, const std::string& weight_name);

}  // namespace onyx::quant
