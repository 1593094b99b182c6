// fuzz_safetensors.cc — libFuzzer target: a safetensors file's bytes (weights or adapters from a
// downloaded folder); every tensor of a file that parses is read in full.
#include <cstdint>
#include <string>

#include "io/safetensors.h"
#include "onyx/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  try {
    auto f = onyx::io::parse_safetensors(input, "fuzz.safetensors");
    volatile uint8_t sink = 0;
    for (auto& [name, t] : f.tensors) {
      const uint8_t* p = static_cast<const uint8_t*>(t.raw());
      for (size_t i = 0; i < t.nbytes(); i++) sink ^= p[i];
    }
  } catch (const onyx::Error&) {
  }
  return 0;
}
