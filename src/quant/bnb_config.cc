// quant/bnb_config.cc — BitsAndBytesConfig's 4-bit keys (see bnb_config.h).
#include "quant/bnb_config.h"

#include <set>

#include "onyx/error.h"

namespace onyx::quant {
namespace {

bool read_bool(const nlohmann::json& v, const std::string& what, const std::string& key) {
  ONYX_CHECK(v.is_boolean(), what, ": quantization_config.", key, " must be true or false, got ",
             v.dump());
  return v.get<bool>();
}

std::string read_compute_dtype(const nlohmann::json& v, const std::string& what) {
  if (v.is_null()) return "float32";
  ONYX_CHECK(v.is_string(), what,
             ": quantization_config.bnb_4bit_compute_dtype must be a dtype "
             "name, got ",
             v.dump());
  std::string d = v.get<std::string>();
  if (d.rfind("torch.", 0) == 0) d = d.substr(6);
  if (d == "float32" || d == "float") return "float32";
  if (d == "bfloat16") return "bfloat16";
  throw Error(cat(what, ": quantization_config.bnb_4bit_compute_dtype '", d,
                  "' is not supported on the CPU (float32, bfloat16)"));
}

std::vector<std::string> read_skip_modules(const nlohmann::json& v, const std::string& what) {
  std::vector<std::string> out;
  if (v.is_null()) return out;
  ONYX_CHECK(v.is_array(), what,
             ": quantization_config.llm_int8_skip_modules must be a list of "
             "module names, got ",
             v.dump());
  for (auto& m : v) {
    ONYX_CHECK(m.is_string(), what, ": quantization_config.llm_int8_skip_modules: ", m.dump(),
               " is not a module name");
    out.push_back(m.get<std::string>());
  }
  return out;
}

// Keys Transformers writes that carry nothing for 4-bit weights (8-bit's options).
const std::set<std::string>& inert_keys() {
  static const std::set<std::string> k = {"_load_in_4bit", "_load_in_8bit", "llm_int8_threshold",
                                          "llm_int8_has_fp16_weight",
                                          "llm_int8_enable_fp32_cpu_offload"};
  return k;
}

}  // namespace

BnbConfig parse_bnb_config(const nlohmann::json& j, const std::string& what, bool strict) {
  ONYX_CHECK(j.is_object(), what, ": quantization_config must be a mapping, got ", j.dump());
  BnbConfig c;
  if (j.contains("quant_method")) {
    const auto& m = j["quant_method"];
    ONYX_CHECK(m.is_string() && m.get<std::string>() == "bitsandbytes", what,
               ": quantization_config.quant_method ", m.dump(),
               " is not supported (bitsandbytes 4-bit only)");
  }
  if (j.contains("load_in_8bit") && j["load_in_8bit"].is_boolean() && j["load_in_8bit"].get<bool>())
    throw Error(cat(what,
                    ": quantization_config.load_in_8bit: 8-bit (LLM.int8) weights are not "
                    "supported; use load_in_4bit"));
  ONYX_CHECK(j.contains("load_in_4bit") && read_bool(j["load_in_4bit"], what, "load_in_4bit"), what,
             ": quantization_config needs load_in_4bit: true (onyx reads bitsandbytes' 4-bit "
             "configuration)");
  for (auto& [key, v] : j.items()) {
    if (key == "quant_method" || key == "load_in_8bit" || key == "load_in_4bit") continue;
    if (key == "bnb_4bit_quant_type") {
      ONYX_CHECK(v.is_string(), what,
                 ": quantization_config.bnb_4bit_quant_type must be nf4 or fp4");
      c.quant_type = parse_code4(v.get<std::string>(), what + ": quantization_config");
    } else if (key == "bnb_4bit_use_double_quant") {
      c.double_quant = read_bool(v, what, key);
    } else if (key == "bnb_4bit_compute_dtype") {
      c.compute_dtype = read_compute_dtype(v, what);
    } else if (key == "llm_int8_skip_modules") {
      c.skip_modules = read_skip_modules(v, what);
    } else if (key == "bnb_4bit_quant_storage") {
      ONYX_CHECK(v.is_null() || (v.is_string() && (v.get<std::string>() == "uint8" ||
                                                   v.get<std::string>() == "torch.uint8")),
                 what, ": quantization_config.bnb_4bit_quant_storage ", v.dump(),
                 " is not supported (uint8)");
    } else if (strict && !inert_keys().count(key)) {
      throw Error(cat(what, ": unknown key 'quantization_config.", key,
                      "' (load_in_4bit, bnb_4bit_quant_type, bnb_4bit_use_double_quant, "
                      "bnb_4bit_compute_dtype, bnb_4bit_quant_storage, llm_int8_skip_modules)"));
    }
  }
  return c;
}

nlohmann::ordered_json bnb_config_json(const BnbConfig& c) {
  // Transformers' BitsAndBytesConfig.to_dict(), keys sorted as save_pretrained writes them.
  nlohmann::ordered_json j;
  j["_load_in_4bit"] = true;
  j["_load_in_8bit"] = false;
  j["bnb_4bit_compute_dtype"] = c.compute_dtype;
  j["bnb_4bit_quant_storage"] = "uint8";
  j["bnb_4bit_quant_type"] = code4_name(c.quant_type);
  j["bnb_4bit_use_double_quant"] = c.double_quant;
  j["llm_int8_enable_fp32_cpu_offload"] = false;
  j["llm_int8_has_fp16_weight"] = false;
  j["llm_int8_skip_modules"] =
      c.skip_modules.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(c.skip_modules);
  j["llm_int8_threshold"] = 6.0;
  j["load_in_4bit"] = true;
  j["load_in_8bit"] = false;
  j["quant_method"] = "bitsandbytes";
  return j;
}

bool quantizes_module(const BnbConfig& c, const std::string& weight_name) {
  const std::string module = weight_name.substr(0, weight_name.rfind('.'));
  // the output head (Transformers' get_keys_to_not_convert: the model's last module)
  for (const char* head : {"lm_head", "score", "classifier"})
    if (module == head || module.rfind(std::string(head) + ".", 0) == 0) return false;
  for (auto& s : c.skip_modules)
    if (module.find(s) != std::string::npos) return false;
  return true;
}

}  // namespace onyx::quant
