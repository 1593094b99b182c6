// config/config_values.cc — see config_values.h.
#include "config/config_values.h"

#include <cmath>
#include <filesystem>

#include "onyx/error.h"

namespace fs = std::filesystem;

namespace onyx::config {

std::string scalar(const YAML::Node& n, const std::string& key, const std::string& what) {
  if (n.IsNull()) return "none";
  ONYX_CHECK(n.IsScalar(), what, ": '", key, "' must be a single value, not a ",
             n.IsSequence() ? "list" : "mapping");
  return n.as<std::string>();
}

std::string resolve(const std::string& base_dir, const std::string& p) {
  if (p.empty() || fs::path(p).is_absolute()) return p;
  fs::path candidate = fs::path(base_dir) / p;
  return fs::exists(candidate) || !fs::exists(p) ? candidate.string() : p;
}

double finite_number(const std::string& text, const std::string& key, const std::string& what) {
  size_t used = 0;
  try {
    const double x = std::stod(text, &used);
    if (used == text.size() && std::isfinite(x)) return x;
  } catch (...) {
  }
  throw Error(cat(what, ": '", key, "' must be a finite number, got '", text, "'"));
}

bool true_or_false(const std::string& text, const std::string& key, const std::string& what) {
  ONYX_CHECK(text == "true" || text == "false", what, ": '", key, "' must be true or false, got '",
             text, "'");
  return text == "true";
}

train::GrpoOptions grpo_options(const RunConfig& c) {
  train::GrpoOptions o = c.grpo;
  o.loss.temperature = o.temperature;
  o.loss.max_completion_length = o.max_completion_length;
  o.loss.old_logps_input = o.num_iterations > 1;
  o.reward_dir = c.dir;
  return o;
}

}  // namespace onyx::config
