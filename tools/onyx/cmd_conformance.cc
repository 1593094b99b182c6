// cmd_conformance.cc — `onyx conformance DIR`: runs every ONNX node-test case folder under DIR
// (model.onnx + test_data_set_*/input_*.pb, output_*.pb) and compares with the suite's tolerances.
// A case is skipped only when it needs an op, dtype or type onyx does not claim (reason printed);
// anything else that goes wrong is a failure. Ends with "N passed, M failed, K skipped".
#include <cmath>
#include <filesystem>
#include <iostream>
#include <map>
#include <sstream>

#include "commands.h"
#include "ir/onnx_io.h"
#include "runtime/session.h"

namespace fs = std::filesystem;

namespace onyx::cli {
namespace {

struct Outcome {
  enum Kind { Pass, Fail, Skip } kind;
  std::string detail;
};

struct Tolerance {
  double rtol, atol;
};

Tolerance tolerance_for(DType t) {
  switch (t) {
    case DType::Float16:
      return {1e-3, 1e-3};
    case DType::BFloat16:
      return {1e-2, 1e-2};
    default:
      return {1e-3, 1e-7};
  }
}

// Compares one output; returns "" when equal within tolerance, else a description of the worst
// element.
std::string compare(const std::string& name, const Tensor& got, const Tensor& want) {
  if (got.dtype() != want.dtype())
    return cat("output '", name, "': dtype ", dtype_name(got.dtype()), ", expected ",
               dtype_name(want.dtype()));
  if (got.shape() != want.shape())
    return cat("output '", name, "': shape ", shape_str(got.shape()), ", expected ",
               shape_str(want.shape()));
  Tolerance tol = tolerance_for(want.dtype());
  bool exact = !is_float(want.dtype());
  double worst_excess = 0, worst_err = 0;
  int64_t worst = -1, bad = 0;
  for (int64_t i = 0; i < want.numel(); i++) {
    double a = got.get_as_double(i), b = want.get_as_double(i);
    if (std::isnan(a) && std::isnan(b)) continue;
    if (std::isinf(b) && a == b) continue;
    double err = std::fabs(a - b);
    double allowed = exact ? 0 : tol.atol + tol.rtol * std::fabs(b);
    if (!(err <= allowed)) {
      bad++;
      double excess = std::isnan(err) ? INFINITY : err - allowed;
      if (worst < 0 || excess > worst_excess) {
        worst_excess = excess;
        worst_err = err;
        worst = i;
      }
    }
  }
  if (worst < 0) return "";
  return cat("output '", name, "': ", bad, " of ", want.numel(), " elements differ; largest error ",
             worst_err, " at index ", worst, " (got ", got.get_as_double(worst), ", expected ",
             want.get_as_double(worst), ")");
}

// Dropout in training mode draws its mask from an RNG nobody else reproduces (the suite's
// expected outputs come from numpy's). Such outputs are checked for structure instead: every
// element is 0 or x / (1 - ratio), and the mask says which.
bool is_random_dropout(const ir::Graph& g, const std::map<std::string, Tensor>& inputs) {
  for (auto& n : g.nodes) {
    if (n.op_type != "Dropout") continue;
    if (n.inputs.size() < 3 || n.inputs[2].empty()) return false;
    auto it = inputs.find(n.inputs[2]);
    bool training = it != inputs.end() ? it->second.get_as_double(0) != 0 : false;
    if (!training) return false;
    double ratio = 0.5;
    if (n.inputs.size() > 1 && !n.inputs[1].empty()) {
      auto r = inputs.find(n.inputs[1]);
      if (r != inputs.end()) ratio = r->second.get_as_double(0);
    }
    return ratio > 0;
  }
  return false;
}

std::string check_dropout_structure(const ir::Graph& g, const std::map<std::string, Tensor>& inputs,
                                    const std::map<std::string, Tensor>& outputs) {
  for (auto& n : g.nodes) {
    if (n.op_type != "Dropout") continue;
    const Tensor& x = inputs.at(n.inputs[0]);
    double ratio = inputs.count(n.inputs[1]) ? inputs.at(n.inputs[1]).get_as_double(0) : 0.5;
    const Tensor& y = outputs.at(n.outputs[0]);
    const Tensor* mask =
        n.outputs.size() > 1 && outputs.count(n.outputs[1]) ? &outputs.at(n.outputs[1]) : nullptr;
    if (y.shape() != x.shape()) return "dropout output shape differs from its input";
    double scale = 1.0 / (1.0 - ratio);
    int64_t dropped = 0;
    for (int64_t i = 0; i < x.numel(); i++) {
      double xv = x.get_as_double(i), yv = y.get_as_double(i);
      bool kept = std::fabs(yv - xv * scale) <= 1e-5 + 1e-5 * std::fabs(xv * scale);
      bool zero = yv == 0;
      if (!kept && !zero)
        return cat("dropout output ", i, " is ", yv, ", neither 0 nor x/(1-ratio)");
      if (mask && (mask->get_as_double(i) != 0) != (kept && !(zero && xv != 0)))
        return cat("dropout mask disagrees with the output at index ", i);
      if (zero && xv != 0) dropped++;
    }
    double frac = x.numel() ? (double)dropped / x.numel() : 0;
    if (x.numel() >= 50 && std::fabs(frac - ratio) > 0.25)
      return cat("dropout dropped a fraction ", frac, " of elements for ratio ", ratio);
  }
  return "";
}

Outcome run_case(const fs::path& dir) {
  ir::Graph g;
  try {
    g = ir::load_onnx((dir / "model.onnx").string());
  } catch (const Unsupported& e) {
    return {Outcome::Skip, e.what()};
  } catch (const Error& e) {
    return {Outcome::Fail, cat("loading: ", e.what())};
  }
  for (auto& v : g.inputs)
    if (!v.is_tensor)
      return {Outcome::Skip, "non-tensor (sequence/optional/map) inputs are not supported"};
  for (auto& v : g.outputs)
    if (!v.is_tensor)
      return {Outcome::Skip, "non-tensor (sequence/optional/map) outputs are not supported"};
  for (auto& v : g.inputs)
    if (v.dtype == DType::String || v.dtype == DType::Undefined)
      return {Outcome::Skip, cat("input dtype '", dtype_name(v.dtype), "' is not supported")};
  for (auto& v : g.outputs)
    if (v.dtype == DType::String || v.dtype == DType::Undefined)
      return {Outcome::Skip, cat("output dtype '", dtype_name(v.dtype), "' is not supported")};
  auto graph = std::make_shared<ir::Graph>(std::move(g));
  runtime::Session session(graph);
  try {
    session.check_supported();
  } catch (const Unsupported& e) {
    std::string msg = e.what();
    auto p = msg.find("unknown op '");
    if (p != std::string::npos) msg = msg.substr(p, msg.find('\'', p + 12) - p + 1);
    return {Outcome::Skip, msg};
  }
  std::vector<fs::path> sets;
  for (auto& e : fs::directory_iterator(dir))
    if (e.is_directory() && e.path().filename().string().rfind("test_data_set_", 0) == 0)
      sets.push_back(e.path());
  std::sort(sets.begin(), sets.end());
  if (sets.empty()) return {Outcome::Fail, "no test_data_set_* folders"};
  for (auto& set : sets) {
    std::map<std::string, Tensor> inputs;
    std::vector<Tensor> expected;
    try {
      // input_j belongs to the j-th graph input (as listed in the model, initializers excluded).
      for (size_t j = 0;; j++) {
        fs::path p = set / cat("input_", j, ".pb");
        if (!fs::exists(p)) break;
        std::string name;
        Tensor t = ir::load_tensor_proto(p.string(), &name);
        ONYX_CHECK(j < graph->inputs.size(), "more input files than graph inputs");
        // onnx 1.12 stores bfloat16 test data as uint16 arrays: same bits, relabel them.
        if (graph->inputs[j].dtype == DType::BFloat16 && t.dtype() == DType::UInt16)
          t = t.reinterpreted(DType::BFloat16);
        inputs[graph->inputs[j].name] = t;
      }
      for (size_t j = 0;; j++) {
        fs::path p = set / cat("output_", j, ".pb");
        if (!fs::exists(p)) break;
        Tensor t = ir::load_tensor_proto(p.string());
        if (j < graph->outputs.size() && graph->outputs[j].dtype == DType::BFloat16 &&
            t.dtype() == DType::UInt16)
          t = t.reinterpreted(DType::BFloat16);
        expected.push_back(t);
      }
    } catch (const Unsupported& e) {
      return {Outcome::Skip, e.what()};
    } catch (const Error& e) {
      return {Outcome::Fail, cat("reading test data: ", e.what())};
    }
    std::map<std::string, Tensor> got;
    try {
      runtime::RunOptions opts;
      opts.check_declared_shapes = false;
      opts.training = true;  // the suite's Dropout cases decide with their own training_mode
      got = session.run(inputs, opts);
    } catch (const Unsupported& e) {
      return {Outcome::Skip, e.what()};
    } catch (const Error& e) {
      return {Outcome::Fail, e.what()};
    }
    bool random = is_random_dropout(*graph, inputs);
    if (random) {
      std::string err = check_dropout_structure(*graph, inputs, got);
      if (!err.empty()) return {Outcome::Fail, err};
      continue;
    }
    for (size_t j = 0; j < expected.size() && j < graph->outputs.size(); j++) {
      const std::string& name = graph->outputs[j].name;
      std::string err = compare(name, got.at(name), expected[j]);
      if (!err.empty()) return {Outcome::Fail, cat(set.filename().string(), ": ", err)};
    }
  }
  return {Outcome::Pass, ""};
}

}  // namespace

Action add_conformance_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("conformance", "run ONNX node test-suite cases and compare");
  struct Opts {
    std::string dir;
    std::vector<std::string> filters;
    bool verbose = false;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("dir", o->dir, "folder of test case folders (e.g. onnx-node-tests/node)")
      ->required();
  cmd->add_option("--filter", o->filters, "run only cases whose name contains one of these")
      ->delimiter(',');
  cmd->add_flag("-v,--verbose", o->verbose, "print passing cases too");
  return [o]() {
    ONYX_CHECK(fs::is_directory(o->dir), "'", o->dir, "' is not a folder");
    std::vector<fs::path> cases;
    for (auto& e : fs::recursive_directory_iterator(o->dir))
      if (e.is_regular_file() && e.path().filename() == "model.onnx") {
        std::string name = e.path().parent_path().filename().string();
        bool keep = o->filters.empty();
        for (auto& f : o->filters)
          if (name.find(f) != std::string::npos) keep = true;
        if (keep) cases.push_back(e.path().parent_path());
      }
    std::sort(cases.begin(), cases.end());
    int passed = 0, failed = 0, skipped = 0;
    std::map<std::string, std::vector<std::string>> skip_reasons;
    for (auto& c : cases) {
      std::string name = c.filename().string();
      Outcome r;
      try {
        r = run_case(c);
      } catch (const std::exception& e) {
        r = {Outcome::Fail, cat("unexpected exception: ", e.what())};
      }
      if (r.kind == Outcome::Pass) {
        passed++;
        if (o->verbose) std::cout << "PASS " << name << "\n";
      } else if (r.kind == Outcome::Fail) {
        failed++;
        std::cout << "FAIL " << name << ": " << r.detail << "\n";
      } else {
        skipped++;
        skip_reasons[r.detail].push_back(name);
        if (o->verbose) std::cout << "SKIP " << name << ": " << r.detail << "\n";
      }
    }
    if (!skip_reasons.empty()) {
      std::cout << "skipped cases, by reason:\n";
      for (auto& [reason, names] : skip_reasons) {
        std::cout << "  " << names.size() << " x " << reason << ":";
        for (size_t i = 0; i < names.size() && i < 4; i++) std::cout << " " << names[i];
        if (names.size() > 4) std::cout << " ...";
        std::cout << "\n";
      }
    }
    std::cout << passed << " passed, " << failed << " failed, " << skipped << " skipped\n";
    return failed == 0 ? 0 : 1;
  };
}

}  // namespace onyx::cli
