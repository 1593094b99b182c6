// data/chat_template.h — Hugging Face chat templates: a Jinja2 subset, rendered as Transformers'
// tokenizer.apply_chat_template(messages, tokenize=False, ...) renders them.
//
// Written here because no C++ Jinja library packaged in Debian 12 follows Jinja2's semantics
// (Python's str(), repr() and truthiness, default Undefined, loop scoping, trim_blocks /
// lstrip_blocks, the sandbox's str/dict methods), and a chat template rendered slightly
// differently trains the model on a different prompt format.
//
// The environment is Transformers' (transformers/utils/chat_template_utils.py):
// ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) with the loopcontrols
// extension (break, continue), its {% generation %} tag, a tojson that does not escape HTML
// (ensure_ascii=False, indent / separators / sort_keys as json.dumps), raise_exception(msg),
// strftime_now(fmt), namespace(...) and dict(...).
//
// Supported: {{ }} {% %} {# #}, '-' and '+' whitespace control, {% raw %}; for (tuple targets,
// an 'if' filter, else, loop.index/index0/revindex/revindex0/first/last/length/previtem/nextitem/
// cycle), if/elif/else, set (names, tuples, ns.attr, block form), macro (positional, keyword and
// default arguments), break/continue, generation; literals (strings with Python escapes, ints,
// floats, true/false/none in either case, lists, tuples, dicts), . and [] access, slices,
// + - * / // % ** ~, comparisons (chained), and/or/not, in/not in, 'a if c else b', the tests
// and filters listed in templates/filters.cc (an unknown one is an error naming its line and column
// when the template is parsed), the str / dict / list methods templates call (.strip() .split()
// .startswith() .get() .items() ...). Values are Python's: str() and repr() of lists, dicts,
// floats and None as Python prints them; strings index and measure by code point.
// Not supported (an error naming the tag): extends/block/include/import, call/filter blocks,
// with, do, recursive loops; '%' string formatting and str.format. Case mapping is the C
// library's one-to-one tables plus the common one-to-many ones of upper() / lower() ('ß' -> 'SS');
// title() and capitalize() use upper case where Python uses title case (they differ for 'ǆ', 'ß').
// Python's repr() of unprintable characters is approximated (controls, C1, a few format chars).
#pragma once
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "templates/template.h"

namespace onyx::data {

using TemplateLimits = templates::TemplateLimits;  // (templates/template.h)

class ChatTemplate {
 public:
  // Parses `source` (errors name `name`, the line and the column).
  explicit ChatTemplate(const std::string& source, std::string name = "chat template");
  struct Rendered {
    std::string text;
    // Byte ranges [begin, end) of `text` written inside {% generation %} ... {% endgeneration %}.
    std::vector<std::pair<size_t, size_t>> generation_spans;
  };
  // Renders with `vars` as the template's variables (JSON object; key order is kept, as Python's
  // dicts keep it). Errors (raise_exception, an undefined variable's attribute, a type error)
  // name the template, line and column.
  Rendered render(const nlohmann::ordered_json& vars) const;
  bool has_generation_markers() const;
  const std::string& name() const;

 private:
  std::shared_ptr<const templates::Template> impl_;
};

// The variables apply_chat_template passes: messages (keys whose value is null dropped, reasoning
// fields aliased as Transformers does), tools and documents (null when absent),
// add_generation_prompt, the tokenizer's special tokens (bos_token, eos_token, ...), then
// `extra_vars` (which override). `messages` must be a JSON array of objects.
nlohmann::ordered_json chat_template_vars(const nlohmann::ordered_json& messages,
                                          bool add_generation_prompt,
                                          const std::map<std::string, std::string>& special_tokens,
                                          const nlohmann::ordered_json& extra_vars = nullptr);

// tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=...): empty
// bos/eos tokens are left undefined.
std::string render_chat(const std::string& template_source, const nlohmann::ordered_json& messages,
                        bool add_generation_prompt, const std::string& bos_token,
                        const std::string& eos_token,
                        const nlohmann::ordered_json& extra_vars = nullptr);

// A model or tokenizer folder's chat template, found as Transformers finds it:
// chat_template.jinja (what Transformers 5 saves), else tokenizer_config.json's "chat_template"
// (a string, or a list of {name, template} whose "default" is used). `path` may also name a file
// in that folder (tokenizer.json) or a .jinja file. special_tokens: bos/eos/unk/sep/pad/cls/mask
// tokens from tokenizer_config.json (strings or {"content": ...}), overridden by a legacy
// special_tokens_map.json when the config has no added_tokens_decoder (as Transformers reads them).
struct ChatTemplateFiles {
  std::string source;  // empty: the folder has no chat template
  std::string origin;  // the file it came from
  std::map<std::string, std::string> special_tokens;
};
ChatTemplateFiles find_chat_template(const std::string& path);

}  // namespace onyx::data
