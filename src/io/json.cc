// io/json.cc — bounded JSON parsing (io/json.h).
#include "io/json.h"

#include <fstream>
#include <sstream>

#include "onyx/error.h"

namespace onyx::io {

std::string json_error_text(const std::exception& e) {
  std::string m = e.what();
  if (m.rfind("[json.exception.", 0) == 0) {
    const size_t close = m.find("] ");
    if (close != std::string::npos) m = m.substr(close + 2);
  }
  return m;
}

namespace {

template <class Json>
Json parse_bounded(const std::string& text, const std::string& what, int max_depth) {
  typename Json::parser_callback_t cb = [&](int depth, nlohmann::json::parse_event_t ev, Json&) {
    if ((ev == nlohmann::json::parse_event_t::object_start ||
         ev == nlohmann::json::parse_event_t::array_start) &&
        depth >= max_depth)
      throw Error(cat(what, ": JSON nests deeper than ", max_depth,
                      " levels (onyx's bound on nesting in input files)"));
    return true;
  };
  try {
    return Json::parse(text, cb);
  } catch (const nlohmann::json::exception& e) {
    throw Error(cat(what, " is not valid JSON: ", json_error_text(e)));
  }
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  ONYX_CHECK(f.good(), "cannot open '", path, "'");
  std::ostringstream ss;
  ss << f.rdbuf();
  ONYX_CHECK(!f.bad(), "error reading '", path, "'");
  return ss.str();
}

}  // namespace

nlohmann::json parse_json(const std::string& text, const std::string& what, int max_depth) {
  return parse_bounded<nlohmann::json>(text, what, max_depth);
}
nlohmann::ordered_json parse_ordered_json(const std::string& text, const std::string& what,
                                          int max_depth) {
  return parse_bounded<nlohmann::ordered_json>(text, what, max_depth);
}
nlohmann::json read_json_file(const std::string& path, int max_depth) {
  return parse_json(read_file(path), "'" + path + "'", max_depth);
}
nlohmann::ordered_json read_ordered_json_file(const std::string& path, int max_depth) {
  return parse_ordered_json(read_file(path), "'" + path + "'", max_depth);
}

}  // namespace onyx::io
