// fuzz_chat_template.cc — libFuzzer target: a chat template (and optionally a conversation) as a
// stranger writes them. The input is the template's text, or the template, a NUL byte and the
// messages' JSON. Anything but onyx::Error escaping parse or render is a finding, as are crashes,
// hangs (-timeout), memory beyond -rss_limit_mb and sanitizer reports.
#include <cstdint>
#include <string>

#include "data/chat_template.h"
#include "io/json.h"
#include "onyx/error.h"
#include "tokenizers/tokenizer.h"

namespace {
const char* kMessages = R"([{"role": "system", "content": "Be brief."},
  {"role": "user", "content": "Hi ä €"}, {"role": "assistant", "content": "Hello.",
  "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"x": 1}}}]},
  {"role": "tool", "content": "{\"t\": 2.5}"}, {"role": "user", "content": ["a", {"type": "text",
  "text": "b"}]}])";

// The input with every byte that is not part of well-formed UTF-8 replaced by '?': a template
// that is not UTF-8 is refused at once, so the engine itself is fuzzed on the repaired text too.
std::string repaired(std::string s) {
  for (size_t i = onyx::tokenizers::unicode::invalid_utf8_at(s); i != std::string::npos;
       i = onyx::tokenizers::unicode::invalid_utf8_at(s, i + 1))
    s[i] = '?';
  return s;
}

void render_all(const std::string& source, const std::string& messages_json) {
  try {
    onyx::data::ChatTemplate t(source, "fuzz.jinja");
    nlohmann::ordered_json messages = onyx::io::parse_ordered_json(messages_json, "messages");
    for (bool gen : {false, true}) {
      auto vars = onyx::data::chat_template_vars(
          messages, gen, {{"bos_token", "<s>"}, {"eos_token", "</s>"}},
          nlohmann::ordered_json{{"tools", nlohmann::ordered_json::array()}});
      t.render(vars);
    }
  } catch (const onyx::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  const std::string source = input.substr(0, nul);
  const std::string messages = nul == std::string::npos ? kMessages : input.substr(nul + 1);
  render_all(source, messages);
  const std::string fixed = repaired(source);
  if (fixed != source) render_all(fixed, messages);
  return 0;
}
