// run_config.cc — YAML/JSON config -> RunConfig via yaml-cpp (JSON is read as YAML).
#include "train/run_config.h"

#include <yaml-cpp/yaml.h>

#include <filesystem>

namespace fs = std::filesystem;

namespace onyx::train {
namespace {

std::string scalar(const YAML::Node& n, const std::string& key, const std::string& what) {
  if (n.IsNull()) return "none";
  ONYX_CHECK(n.IsScalar(), what, ": '", key, "' must be a single value, not a ",
             n.IsSequence() ? "list" : "mapping");
  return n.as<std::string>();
}

std::vector<std::string> string_list(const YAML::Node& n, const std::string& key,
                                     const std::string& what) {
  std::vector<std::string> out;
  if (n.IsScalar()) {
    std::string s = n.as<std::string>();
    size_t p = 0;
    while (p <= s.size()) {
      size_t q = s.find(',', p);
      if (q == std::string::npos) q = s.size();
      if (q > p) out.push_back(s.substr(p, q - p));
      p = q + 1;
    }
    return out;
  }
  ONYX_CHECK(n.IsSequence(), what, ": '", key, "' must be a list");
  for (auto x : n) out.push_back(scalar(x, key, what));
  return out;
}

std::string resolve(const std::string& base_dir, const std::string& p) {
  if (p.empty() || fs::path(p).is_absolute()) return p;
  fs::path candidate = fs::path(base_dir) / p;
  return fs::exists(candidate) || !fs::exists(p) ? candidate.string() : p;
}

void set_key(RunConfig& c, const std::string& key, const YAML::Node& v, const std::string& what) {
  if (key == "model") {
    c.model = scalar(v, key, what);
  } else if (key == "loss") {
    if (v.IsScalar()) {
      c.loss.kind = autodiff::LossSpec::Kind::GraphOutput;
      c.loss.output = v.as<std::string>();
      return;
    }
    ONYX_CHECK(v.IsMap(), what, ": 'loss' must be an output name or a mapping {type, logits, labels}");
    std::string type = "cross_entropy";
    for (auto kv : v) {
      std::string k = kv.first.as<std::string>();
      std::string val = scalar(kv.second, "loss." + k, what);
      if (k == "type") type = val;
      else if (k == "logits" || k == "predictions" || k == "output") c.loss.output = val;
      else if (k == "labels") c.loss.labels = val;
      else if (k == "ignore_index") {
        try {
          c.loss.ignore_index = std::stoll(val);
        } catch (...) {
          throw Error(cat(what, ": 'loss.ignore_index' must be an integer, got '", val, "'"));
        }
      } else
        throw Error(cat(what, ": unknown key 'loss.", k, "' (type, logits, labels, ignore_index)"));
    }
    if (type == "cross_entropy") c.loss.kind = autodiff::LossSpec::Kind::CrossEntropy;
    else if (type == "mse") c.loss.kind = autodiff::LossSpec::Kind::MSE;
    else if (type == "output") c.loss.kind = autodiff::LossSpec::Kind::GraphOutput;
    else throw Error(cat(what, ": 'loss.type' must be cross_entropy, mse or output, got '", type, "'"));
    if (c.loss.kind != autodiff::LossSpec::Kind::GraphOutput)
      ONYX_CHECK(!c.loss.output.empty() && !c.loss.labels.empty(), what, ": loss of type '", type,
                 "' needs 'logits' and 'labels'");
  } else if (key == "train_data") {
    c.train_data = scalar(v, key, what);
  } else if (key == "eval_data") {
    c.eval_data = scalar(v, key, what);
  } else if (key == "test_data") {
    c.test_data = scalar(v, key, what);
  } else if (key == "metrics") {
    c.metrics = string_list(v, key, what);
  } else if (key == "frozen") {
    c.frozen = string_list(v, key, what);
  } else if (key == "predictions") {
    c.predictions = scalar(v, key, what);
  } else if (TrainingArguments::is_key(key)) {
    try {
      c.args.set(key, scalar(v, key, what));
    } catch (const Error& e) {
      throw Error(cat(what, ": ", e.what()));
    }
  } else {
    throw Error(cat(what, ": unknown key '", key, "'"));
  }
}

}  // namespace

std::vector<std::pair<std::string, std::string>> parse_overrides(const std::vector<std::string>& a) {
  std::vector<std::pair<std::string, std::string>> out;
  for (size_t i = 0; i < a.size(); i++) {
    std::string k = a[i];
    ONYX_CHECK(k.rfind("--", 0) == 0, "unexpected argument '", k, "' (overrides are --key value)");
    k = k.substr(2);
    auto eq = k.find('=');
    if (eq != std::string::npos) {
      out.push_back({k.substr(0, eq), k.substr(eq + 1)});
      continue;
    }
    ONYX_CHECK(i + 1 < a.size(), "override '--", k, "' has no value");
    out.push_back({k, a[++i]});
  }
  return out;
}

RunConfig load_run_config(const std::string& path,
                          const std::vector<std::pair<std::string, std::string>>& overrides) {
  RunConfig c;
  c.path = path;
  std::string what = cat("config '", path, "'");
  ONYX_CHECK(fs::exists(path), "config file '", path, "' does not exist");
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::Exception& e) {
    throw Error(cat(what, ": not valid YAML/JSON: ", e.what()));
  }
  ONYX_CHECK(root.IsMap(), what, ": must be a mapping of keys to values");
  for (auto kv : root) set_key(c, kv.first.as<std::string>(), kv.second, what);
  for (auto& [k, v] : overrides) {
    YAML::Node n;
    try {
      n = YAML::Load(v);
    } catch (...) {
      n = YAML::Node(v);
    }
    if (!n.IsScalar() && !n.IsNull() && k != "metrics" && k != "frozen" && k != "loss") n = YAML::Node(v);
    set_key(c, k, n, "command line");
  }
  std::string dir = fs::path(path).parent_path().string();
  c.model = resolve(dir, c.model);
  c.train_data = resolve(dir, c.train_data);
  c.eval_data = resolve(dir, c.eval_data);
  c.test_data = resolve(dir, c.test_data);
  ONYX_CHECK(!c.model.empty(), what, ": 'model' is missing");
  c.args.validate();
  return c;
}

Model model_from_config(const RunConfig& c) {
  Model m = Model::from_onnx(c.model, c.loss);
  m.frozen.insert(c.frozen.begin(), c.frozen.end());
  m.predictions = c.predictions.empty() && c.loss.kind != autodiff::LossSpec::Kind::GraphOutput
                      ? c.loss.output
                      : c.predictions;
  return m;
}

}  // namespace onyx::train
