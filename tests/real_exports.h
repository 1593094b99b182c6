// tests/real_exports.h — where the tests find the benchmark's three models as PyTorch exports them
// (opset 14: LayerNorm and GELU decomposed, shape subgraphs, Dropout nodes): made by
// bench/make_exports.py, which scripts/test.sh runs before ctest, into <build>/bench-exports.
#pragma once
#include <filesystem>
#include <map>
#include <set>
#include <string>

#include "autodiff/gradient.h"
#include "passes/pass.h"

namespace onyx::test_exports {

// "<build>/bench-exports/<model>/model.onnx", or "" when it has not been made.
inline std::string real_export(const std::string& model) {
  std::string p = std::string(ONYX_BINARY_DIR) + "/bench-exports/" + model + "/model.onnx";
  return std::filesystem::exists(p) ? p : std::string();
}

// The reason a test skips without it.
inline std::string real_export_missing(const std::string& model) {
  return "no " + model + " export in " + ONYX_BINARY_DIR +
         "/bench-exports (run: /usr/bin/python3 bench/make_exports.py <build>/bench-exports)";
}

// An export specialized to `feeds` (its input signature) and run through the forward pipeline
// with its default trainable weights as variables, as the trainer does.
struct OptimizedExport {
  ir::Graph graph;
  passes::PassReport report;
  std::map<std::string, TensorMeta> sig;
  std::set<std::string> vars;
};
inline OptimizedExport optimize_export(const ir::Graph& g,
                                       const std::map<std::string, Tensor>& feeds,
                                       const passes::OptimizeOptions& opts = {}) {
  OptimizedExport o;
  for (auto& [k, t] : feeds) o.sig[k] = t.meta();
  auto params = autodiff::trainable_parameters(g, {});
  o.vars.insert(params.begin(), params.end());
  o.graph = passes::optimize_forward(g, o.sig, o.vars, opts, &o.report);
  return o;
}

}  // namespace onyx::test_exports
