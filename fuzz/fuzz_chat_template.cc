// fuzz_chat_template.cc — libFuzzer target: a chat template (and optionally a conversation) as a
// stranger writes them. The input is the template's text, or the template, a NUL byte and the
// messages' JSON. Anything but onyx::Error escaping parse or render is a finding, as are crashes,
// hangs (-timeout), memory beyond -rss_limit_mb and sanitizer reports.
#include <cstdint>
#include <string>

#include "data/chat_template.h"
#include "io/json.h"
#include "onyx/error.h"

namespace {
const char* kMessages = R"([{"role": "system", "content": "Be brief."},
  {"role": "user", "content": "Hi ä €"}, {"role": "assistant", "content": "Hello.",
  "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"x": 1}}}]},
  {"role": "tool", "content": "{\"t\": 2.5}"}, {"role": "user", "content": ["a", {"type": "text",
  "text": "b"}]}])";
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  const std::string source = input.substr(0, nul);
  try {
    onyx::data::ChatTemplate t(source, "fuzz.jinja");
    nlohmann::ordered_json messages = onyx::io::parse_ordered_json(
        nul == std::string::npos ? kMessages : input.substr(nul + 1), "messages");
    for (bool gen : {false, true}) {
      auto vars = onyx::data::chat_template_vars(
          messages, gen, {{"bos_token", "<s>"}, {"eos_token", "</s>"}},
          nlohmann::ordered_json{{"tools", nlohmann::ordered_json::array()}});
      t.render(vars);
    }
  } catch (const onyx::Error&) {
  }
  return 0;
}
