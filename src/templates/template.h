// templates/template.h — onyx's Jinja2 subset (the one Hugging Face chat templates are written
// in; data/chat_template.h says what is supported and renders chat templates on top): a template
// parsed once, rendered with variables from JSON, within bounds.
//
// Written here because no C++ Jinja library packaged in Debian 12 follows Jinja2's semantics
// (Python's str(), repr() and truthiness, default Undefined, loop scoping, trim_blocks /
// lstrip_blocks, the sandbox's str/dict methods). The engine's rooms: value.h (values and
// Python's semantics), syntax.h (lexer.cc, parser.cc), builtins.h (attributes, methods,
// arithmetic), filters.cc (filters and tests: name -> function tables), renderer.cc.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace onyx::templates {

// What one template may do. A chat template is code from a downloaded folder, so parsing and
// rendering are bounded; each bound reached is an error that names it, and a real template
// reaches none (the largest Hugging Face templates nest ~10 deep and render in ~10^4 steps).
struct TemplateLimits {
  static constexpr size_t kMaxSourceBytes = 4u << 20;  // the template's text
  // Blocks and expressions inside each other when parsing (jinja2 itself stops near 80, at
  // Python's recursion limit), and statements, expressions and macro calls inside each other
  // while rendering.
  static constexpr int kMaxNesting = 256;
  static constexpr int kMaxRenderDepth = 256;
  static constexpr int kMaxMacroDepth = 100;        // a macro calling itself
  static constexpr int kMaxValueDepth = 512;        // lists, dicts and namespaces inside each other
  static constexpr int64_t kMaxSteps = 20'000'000;  // statements, expressions, items visited
  static constexpr int64_t kMaxBytes = 1ll << 30;   // bytes of strings made in one render
  static constexpr int64_t kMaxString = 64ll << 20;  // one string value, and the rendered text
  static constexpr int64_t kMaxItems = 1'000'000;    // one list or dict
};

struct Template;  // parsed (syntax.h)

// Parses `source` as Transformers' environment reads a chat template (trim_blocks, lstrip_blocks,
// \r\n as \n, one trailing newline dropped); errors name `name`, the line and the column.
std::shared_ptr<const Template> parse(const std::string& source, std::string name);

struct Rendered {
  std::string text;
  // Byte ranges [begin, end) of `text` written inside {% generation %} ... {% endgeneration %}.
  std::vector<std::pair<size_t, size_t>> generation_spans;
};
// Renders with `vars` (a JSON object) as the template's variables; errors name the template,
// line and column.
Rendered render(const Template& t, const nlohmann::ordered_json& vars);
bool has_generation_markers(const Template& t);
const std::string& template_name(const Template& t);

}  // namespace onyx::templates
