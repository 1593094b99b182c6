// diffusion/config_reader.h — reading a diffusers config.json (a model's or a scheduler's): the
// text parsed once with a bound on nesting (io::parse_json), then typed getters that leave a
// default in place for an absent or null key and name the file and key for a wrong type or a
// value onyx does not build.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace onyx::diffusion {

class ConfigReader {
 public:
  // Throws naming `what` for invalid JSON or a top level that is not an object.
  ConfigReader(const std::string& text, std::string what);
  const nlohmann::json& doc() const { return j_; }
  const std::string& what() const { return what_; }
  // The key's value, or null when absent or JSON null.
  const nlohmann::json* find(const char* key) const;
  void integer(const char* key, int64_t& v) const;
  void number(const char* key, double& v) const;
  void boolean(const char* key, bool& v) const;
  void string(const char* key, std::string& v) const;
  void strings(const char* key, std::vector<std::string>& v) const;  // a non-empty list
  void integers(const char* key, std::vector<int64_t>& v) const;     // a non-empty list
  // A key onyx builds only at these values (its text, or its JSON for a non-string; absent or
  // null is the default and passes): anything else is an error listing them.
  void only(const char* key, const std::vector<std::string>& allowed) const;
  // One of `allowed` for a string value already read (`key` names it in the error).
  void one_of(const char* key, const std::string& v, const std::vector<std::string>& allowed) const;

 private:
  nlohmann::json j_;
  std::string what_;
};

}  // namespace onyx::diffusion
