// fuzz_config.cc — libFuzzer target: a model folder's config.json and generation_config.json (the
// same bytes read as each).
#include <cstdint>
#include <string>

#include "generate/generation_config.h"
#include "io/json.h"
#include "models/hf_model.h"
#include "onyx/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  try {
    onyx::models::parse_hf_config(input, "fuzz/config.json");
  } catch (const onyx::Error&) {
  }
  try {
    auto j = onyx::io::parse_json(input, "fuzz/generation_config.json");
    auto cfg = onyx::generate::apply_generation_config_json(j, {}, "fuzz/generation_config.json");
    onyx::generate::check_generation_token_ids(cfg, 1000, "fuzz");
  } catch (const onyx::Error&) {
  }
  return 0;
}
