// fuzz_wav.cc — libFuzzer target: a WAV file's bytes (speech data for Whisper's features); a file
// that parses is mixed to mono in full.
#include <cstdint>
#include <string>

#include "data/wav.h"
#include "onyx/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  try {
    auto a = onyx::data::parse_wav(input, "fuzz.wav", 1 << 16);
    volatile float sink = 0;
    for (float v : a.samples) sink += v;
  } catch (const onyx::Error&) {
  }
  return 0;
}
