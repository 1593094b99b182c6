// io/json.h — reading JSON that comes from outside (model folders, datasets, flags): one parse with
// a bound on nesting depth and errors that name the source. nlohmann's parser itself keeps its own
// stack, but what reads the result afterwards (dump(), the template engine's values, the
// tokenizer's pipeline) recurses, so a file of a million nested '[' must stop at the parse.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

namespace onyx::io {

// Deeper than any real config, tokenizer or conversation (tokenizer.json nests ~6 levels, a tool
// schema ~20); shallow enough for every recursive reader on an 8 MiB stack.
constexpr int kMaxJsonDepth = 256;

// `what` names the source in errors ("'data.jsonl' line 3", "tokenizer.json"); the message keeps
// nlohmann's line/column but not its "[json.exception...]" tag.
nlohmann::json parse_json(const std::string& text, const std::string& what,
                          int max_depth = kMaxJsonDepth);
nlohmann::ordered_json parse_ordered_json(const std::string& text, const std::string& what,
                                          int max_depth = kMaxJsonDepth);
// The file at `path` parsed as above (named by its path).
nlohmann::json read_json_file(const std::string& path, int max_depth = kMaxJsonDepth);
nlohmann::ordered_json read_ordered_json_file(const std::string& path,
                                              int max_depth = kMaxJsonDepth);

// "[json.exception.type_error.302] type must be string, but is number" -> "type must be ...".
std::string json_error_text(const std::exception& e);

}  // namespace onyx::io
