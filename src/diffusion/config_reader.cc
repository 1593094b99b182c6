// diffusion/config_reader.cc — see config_reader.h.
#include "diffusion/config_reader.h"

#include <cmath>
#include <string>

#include "io/json.h"
#include "onyx/error.h"

namespace onyx::diffusion {

using json = nlohmann::json;

namespace {

// Python's json module writes float('inf') and float('nan') as the bare words Infinity, -Infinity
// and NaN, which JSON does not have (diffusers' DPMSolverMultistepScheduler saves
// "lambda_min_clipped": -Infinity). Outside strings they become the strings "Infinity",
// "-Infinity" and "NaN", which number() reads back as the values.
std::string quote_python_non_finite(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      out += c;
      if (c == '\\' && i + 1 < text.size())
        out += text[++i];
      else if (c == '"')
        in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    bool replaced = false;
    for (const char* word : {"-Infinity", "Infinity", "NaN"}) {
      const size_t n = std::char_traits<char>::length(word);
      if (text.compare(i, n, word) == 0) {
        out += cat("\"", word, "\"");
        i += n - 1;
        replaced = true;
        break;
      }
    }
    if (!replaced) out += c;
  }
  return out;
}

}  // namespace

ConfigReader::ConfigReader(const std::string& text, std::string what)
    : j_(io::parse_json(quote_python_non_finite(text), what)), what_(std::move(what)) {
  ONYX_CHECK(j_.is_object(), what_, ": expected a JSON object at the top level");
}

const json* ConfigReader::find(const char* key) const {
  auto it = j_.find(key);
  return it == j_.end() || it->is_null() ? nullptr : &*it;
}

void ConfigReader::integer(const char* key, int64_t& v) const {
  if (const json* x = find(key)) {
    ONYX_CHECK(x->is_number_integer(), what_, ": '", key, "' must be an integer, got ", x->dump());
    v = x->get<int64_t>();
  }
}

void ConfigReader::number(const char* key, double& v) const {
  if (const json* x = find(key)) {
    if (x->is_string()) {  // Python's non-finite floats (quote_python_non_finite)
      const std::string s = x->get<std::string>();
      ONYX_CHECK(s == "Infinity" || s == "-Infinity" || s == "NaN", what_, ": '", key,
                 "' must be a number, got ", x->dump());
      v = s == "NaN" ? NAN : s == "Infinity" ? INFINITY : -INFINITY;
      return;
    }
    ONYX_CHECK(x->is_number(), what_, ": '", key, "' must be a number, got ", x->dump());
    v = x->get<double>();
  }
}

void ConfigReader::boolean(const char* key, bool& v) const {
  if (const json* x = find(key)) {
    ONYX_CHECK(x->is_boolean(), what_, ": '", key, "' must be true or false, got ", x->dump());
    v = x->get<bool>();
  }
}

void ConfigReader::string(const char* key, std::string& v) const {
  if (const json* x = find(key)) {
    ONYX_CHECK(x->is_string(), what_, ": '", key, "' must be a string, got ", x->dump());
    v = x->get<std::string>();
  }
}

namespace {
template <class T>
void read_list(const ConfigReader& r, const char* key, std::vector<T>& v) {
  const json* x = r.find(key);
  if (!x) return;
  ONYX_CHECK(x->is_array() && !x->empty(), r.what(), ": '", key, "' must be a non-empty list, got ",
             x->dump());
  v.clear();
  for (auto& e : *x) {
    const bool ok = std::is_same_v<T, std::string> ? e.is_string() : e.is_number_integer();
    ONYX_CHECK(ok, r.what(), ": '", key, "' has an element of the wrong type: ", e.dump());
    v.push_back(e.get<T>());
  }
}
}  // namespace

void ConfigReader::strings(const char* key, std::vector<std::string>& v) const {
  read_list(*this, key, v);
}

void ConfigReader::integers(const char* key, std::vector<int64_t>& v) const {
  read_list(*this, key, v);
}

void ConfigReader::only(const char* key, const std::vector<std::string>& allowed) const {
  const json* x = find(key);
  if (!x) return;  // absent or null: the default
  one_of(key, x->is_string() ? x->get<std::string>() : x->dump(), allowed);
}

void ConfigReader::one_of(const char* key, const std::string& v,
                          const std::vector<std::string>& allowed) const {
  std::string list;
  for (auto& a : allowed) {
    if (v == a) return;
    list += (list.empty() ? "" : ", ") + a;
  }
  throw Error(cat(what_, ": ", key, " '", v, "' is not supported (onyx builds: ", list, ")"));
}

}  // namespace onyx::diffusion
