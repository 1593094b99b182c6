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

// The input with every byte that is not part of well-formed UTF-8 replaced by '?': a template
// that is not UTF-8 is refused at once, so the engine itself is fuzzed on the repaired text too.
std::string repaired(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = s[i];
    const int n = c < 0x80                   ? 1
                  : (c >= 0xC2 && c <= 0xDF) ? 2
                  : (c >> 4) == 14           ? 3
                  : (c >= 0xF0 && c <= 0xF4) ? 4
                                             : 0;
    bool ok = n > 0 && i + n <= s.size();
    for (int k = 1; ok && k < n; k++) ok = ((unsigned char)s[i + k] & 0xC0) == 0x80;
    if (ok && n == 3)
      ok = !(c == 0xE0 && (unsigned char)s[i + 1] < 0xA0) &&
           !(c == 0xED && (unsigned char)s[i + 1] >= 0xA0);
    if (ok && n == 4)
      ok = !(c == 0xF0 && (unsigned char)s[i + 1] < 0x90) &&
           !(c == 0xF4 && (unsigned char)s[i + 1] >= 0x90);
    out += ok ? s.substr(i, n) : "?";
    i += ok ? n : 1;
  }
  return out;
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
