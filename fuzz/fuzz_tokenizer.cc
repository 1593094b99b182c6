// fuzz_tokenizer.cc — libFuzzer target: a tokenizer.json as a downloaded folder holds it. A file
// that loads must then encode and decode text (the input's own bytes among it) without a finding.
#include <cstdint>
#include <string>

#include "onyx/error.h"
#include "tokenizers/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  try {
    auto tok = onyx::tokenizers::tokenizer_from_json_text(input, "fuzz/tokenizer.json");
    for (const std::string& text :
         {std::string("Hello world, ça va? 123 <s> </s> <|im_end|>\n\t  x"), input.substr(0, 64)}) {
      auto ids = tok->encode_ids(text);
      tok->decode(ids);
      tok->encode(text);
    }
  } catch (const onyx::Error&) {
  }
  return 0;
}
