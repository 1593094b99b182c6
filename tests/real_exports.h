// tests/real_exports.h — where the tests find the benchmark's three models as PyTorch exports them
// (opset 14: LayerNorm and GELU decomposed, shape subgraphs, Dropout nodes): made by
// bench/make_exports.py, which scripts/test.sh runs before ctest, into <build>/bench-exports
// (ONYX_BENCH_EXPORTS names another folder: the aarch64 run under qemu reads the x86 build's).
#pragma once
#include <cstdlib>
#include <filesystem>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "autodiff/gradient.h"
#include "passes/pass.h"

namespace onyx::test_exports {

// The folder of the exports: $ONYX_BENCH_EXPORTS, else <build>/bench-exports.
inline std::string exports_dir() {
  const char* env = std::getenv("ONYX_BENCH_EXPORTS");
  return env && *env ? std::string(env) : std::string(ONYX_BINARY_DIR) + "/bench-exports";
}

// "<exports_dir>/<model>/model.onnx", or "" when it has not been made.
inline std::string real_export(const std::string& model) {
  std::string p = exports_dir() + "/" + model + "/model.onnx";
  return std::filesystem::exists(p) ? p : std::string();
}

// The reason a test skips without it.
inline std::string real_export_missing(const std::string& model) {
  return "no " + model + " export in " + exports_dir() +
         " (run: /usr/bin/python3 bench/make_exports.py <build>/bench-exports)";
}

// Feeds for an export with the batch dim set to `batch`: floats uniform in [-1, 1), token ids in
// range, a padding mask with real padding, binary labels / token types.
inline std::map<std::string, Tensor> export_feeds(const ir::Graph& g, int64_t batch) {
  std::map<std::string, Tensor> f;
  std::mt19937 rng(3);
  for (auto& in : g.inputs) {
    Shape s = in.shape;
    for (auto& d : s)
      if (d < 0) d = batch;
    if (in.dtype == DType::Float32) {
      std::mt19937 frng(4);
      std::uniform_real_distribution<float> u(-1, 1);
      std::vector<float> v(shape_numel(s));
      for (auto& x : v) x = u(frng);
      f[in.name] = Tensor::from_vector(DType::Float32, s, v);
      continue;
    }
    std::vector<int64_t> v(shape_numel(s));
    int64_t hi = (in.name == "labels" && s.size() == 1) || in.name == "token_type_ids" ? 2 : 100;
    for (auto& x : v) x = (int64_t)(rng() % hi);
    if (in.name == "attention_mask")
      for (size_t i = 0; i < v.size(); i++)
        v[i] = (int64_t)(i % s.back()) < (int64_t)s.back() - 9 * (int64_t)(i / s.back()) ? 1 : 0;
    f[in.name] = Tensor::from_vector<int64_t>(DType::Int64, s, v);
  }
  return f;
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
