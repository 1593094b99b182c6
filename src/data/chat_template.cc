// chat_template.cc — chat templates on top of onyx's Jinja2 subset (src/templates): a
// ChatTemplate parsed once and rendered with apply_chat_template's variables, and where a model
// folder keeps its template (chat_template.jinja, tokenizer_config.json).
#include "data/chat_template.h"

#include <filesystem>

#include "io/json.h"
#include "onyx/error.h"
#include "tokenizers/tokenizer.h"

namespace fs = std::filesystem;

namespace onyx::data {

using tokenizers::read_text_file;

ChatTemplate::ChatTemplate(const std::string& source, std::string name)
    : impl_(templates::parse(source, std::move(name))) {}

bool ChatTemplate::has_generation_markers() const {
  return templates::has_generation_markers(*impl_);
}
const std::string& ChatTemplate::name() const { return templates::template_name(*impl_); }

ChatTemplate::Rendered ChatTemplate::render(const nlohmann::ordered_json& vars) const {
  templates::Rendered r = templates::render(*impl_, vars);
  return Rendered{std::move(r.text), std::move(r.generation_spans)};
}
nlohmann::ordered_json chat_template_vars(const nlohmann::ordered_json& messages,
                                          bool add_generation_prompt,
                                          const std::map<std::string, std::string>& special_tokens,
                                          const nlohmann::ordered_json& extra_vars) {
  ONYX_CHECK(messages.is_array(), "chat messages must be a JSON array, got ", messages.type_name());
  ONYX_CHECK(!messages.empty(), "cannot apply a chat template to an empty conversation");
  nlohmann::ordered_json msgs = nlohmann::ordered_json::array();
  for (size_t k = 0; k < messages.size(); k++) {
    const auto& m = messages[k];
    ONYX_CHECK(m.is_object(), "chat message ", k, " is not a JSON object (", m.dump(), ")");
    nlohmann::ordered_json out = nlohmann::ordered_json::object();
    for (auto it = m.begin(); it != m.end(); ++it)
      if (!it.value().is_null()) out[it.key()] = it.value();
    // Transformers' _alias_reasoning_fields: the reasoning under its older names is also given as
    // "thinking" (first, unless present) and "reasoning_content".
    const nlohmann::ordered_json* reasoning = nullptr;
    for (const char* f : {"reasoning_content", "thinking", "reasoning"})
      if (!reasoning && out.contains(f)) reasoning = &out[f];
    if (reasoning) {
      const nlohmann::ordered_json r = *reasoning;
      nlohmann::ordered_json aliased = nlohmann::ordered_json::object();
      aliased["thinking"] = r;  // {"thinking": r, **message, "reasoning_content": r}
      for (auto it = out.begin(); it != out.end(); ++it) aliased[it.key()] = it.value();
      aliased["reasoning_content"] = r;
      out = std::move(aliased);
    }
    msgs.push_back(std::move(out));
  }
  nlohmann::ordered_json vars = nlohmann::ordered_json::object();
  vars["messages"] = std::move(msgs);
  vars["tools"] = nullptr;
  vars["documents"] = nullptr;
  vars["add_generation_prompt"] = add_generation_prompt;
  for (auto& [k, v] : special_tokens) vars[k] = v;
  if (extra_vars.is_object())
    for (auto it = extra_vars.begin(); it != extra_vars.end(); ++it) vars[it.key()] = it.value();
  else
    ONYX_CHECK(extra_vars.is_null(), "extra chat template variables must be a JSON object");
  return vars;
}

std::string render_chat(const std::string& template_source, const nlohmann::ordered_json& messages,
                        bool add_generation_prompt, const std::string& bos_token,
                        const std::string& eos_token, const nlohmann::ordered_json& extra_vars) {
  std::map<std::string, std::string> special;
  if (!bos_token.empty()) special["bos_token"] = bos_token;
  if (!eos_token.empty()) special["eos_token"] = eos_token;
  ChatTemplate t(template_source);
  return t.render(chat_template_vars(messages, add_generation_prompt, special, extra_vars)).text;
}

ChatTemplateFiles find_chat_template(const std::string& path) {
  ChatTemplateFiles out;
  fs::path p(path);
  ONYX_CHECK(fs::exists(p), "chat template: '", path, "' does not exist");
  if (fs::is_regular_file(p) && p.extension() == ".jinja") {
    out.source = read_text_file(path);
    out.origin = path;
    p = p.parent_path();
  } else if (fs::is_regular_file(p)) {
    p = p.parent_path();
  }
  if (p.empty()) p = ".";
  const fs::path cfg_path = p / "tokenizer_config.json";
  nlohmann::ordered_json cfg;
  if (fs::exists(cfg_path)) cfg = io::read_ordered_json_file(cfg_path.string());
  // The special tokens: tokenizer_config.json's; an older folder's special_tokens_map.json (read
  // when the config has no added_tokens_decoder, as Transformers' legacy path) overrides them.
  // (Transformers refuses a special token that is neither a string nor an AddedToken)
  auto take_tokens = [&](const nlohmann::ordered_json& j, const fs::path& file) {
    for (const char* k : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                          "cls_token", "mask_token"}) {
      auto it = j.find(k);
      if (it == j.end() || it->is_null()) continue;
      if (it->is_string())
        out.special_tokens[k] = it->get<std::string>();
      else if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
        out.special_tokens[k] = (*it)["content"].get<std::string>();
      else
        throw Error(cat(file.string(), ": '", k,
                        "' must be a string or an AddedToken {\"content\": ...}, got ",
                        it->dump()));
    }
  };
  ONYX_CHECK(cfg.is_null() || cfg.is_object(), cfg_path.string(), ": expected a JSON object, got ",
             cfg.type_name());
  if (cfg.is_object()) take_tokens(cfg, cfg_path);
  const fs::path map_path = p / "special_tokens_map.json";
  if (fs::exists(map_path) && !(cfg.is_object() && cfg.contains("added_tokens_decoder"))) {
    const nlohmann::ordered_json map = io::read_ordered_json_file(map_path.string());
    ONYX_CHECK(map.is_object(), map_path.string(), ": expected a JSON object");
    take_tokens(map, map_path);
  }
  if (!out.source.empty()) return out;
  const fs::path jinja = p / "chat_template.jinja";
  if (fs::exists(jinja)) {
    out.source = read_text_file(jinja.string());
    out.origin = jinja.string();
    return out;
  }
  if (cfg.is_object() && cfg.contains("chat_template")) {
    const auto& ct = cfg["chat_template"];
    out.origin = cfg_path.string();
    if (ct.is_string()) {
      out.source = ct.get<std::string>();
    } else if (ct.is_array()) {
      std::string names;
      for (auto& t : ct) {
        ONYX_CHECK(t.is_object() && t.contains("name") && t.contains("template") &&
                       t["name"].is_string() && t["template"].is_string(),
                   cfg_path.string(), ": chat_template entries must be {name, template} strings");
        names += (names.empty() ? "" : ", ") + t["name"].get<std::string>();
        if (t["name"] == "default") out.source = t["template"].get<std::string>();
      }
      ONYX_CHECK(!out.source.empty(), cfg_path.string(),
                 ": chat_template has several templates and none named 'default' (", names, ")");
      out.origin += " (chat_template 'default')";
    } else if (!ct.is_null()) {
      throw Error(cat(cfg_path.string(),
                      ": chat_template must be a string or a list of {name, "
                      "template}"));
    }
  }
  return out;
}

}  // namespace onyx::data
