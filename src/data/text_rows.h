// data/text_rows.h — the row reading and chat-template rendering the text datasets share
// (text_datasets.cc: SFT; preference_dataset.cc: DPO); internal to src/data.
#pragma once
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/chat_template.h"
#include "data/text_datasets.h"

namespace onyx::data {

// One JSON object of a JSONL / JSON / CSV / TSV dataset and the line (item) it came from.
struct Row {
  int64_t line;
  nlohmann::json obj;
};
std::vector<Row> read_rows(const std::string& path, const TextClassificationOptions& o);

// The row's value under key, nullptr when absent or null.
const nlohmann::json* row_field(const Row& r, const char* key);
// A list of {role, content, ...} messages.
bool is_messages(const nlohmann::json* v);
// TRL's maybe_convert_to_chatml: "conversations" of {from, value} -> "messages".
void conversations_to_messages(Row& r, const std::string& path);
bool ends_with(const std::string& s, const std::string& tail);
// Where a completion starts: the first position at which the ids of the prompt alone and of the
// whole sequence differ (TRL's common prefix); warns once per dataset (warned) when the prompt is
// not a prefix.
size_t completion_start(const std::vector<int64_t>& prompt, const std::vector<int64_t>& all,
                        bool& warned, const std::string& path);
// The row's "tools" and "chat_template_kwargs" as the template's extra variables (TRL passes
// them to apply_chat_template).
nlohmann::ordered_json template_extras(const Row& r, const std::string& path);
// msgs rendered with the template; errors name the dataset and line.
ChatTemplate::Rendered render_messages(const ChatTemplate& tmpl, const nlohmann::json& msgs,
                                       bool add_generation_prompt,
                                       const std::map<std::string, std::string>& special_tokens,
                                       const nlohmann::ordered_json& extra, const std::string& path,
                                       int64_t line);

}  // namespace onyx::data
