// tests/real_exports.h — where the tests find the benchmark's three models as PyTorch exports them
// (opset 14: LayerNorm and GELU decomposed, shape subgraphs, Dropout nodes): made by
// bench/make_exports.py, which scripts/test.sh runs before ctest, into <build>/bench-exports.
#pragma once
#include <filesystem>
#include <string>

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

}  // namespace onyx::test_exports
