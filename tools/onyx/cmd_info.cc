// cmd_info.cc — `onyx info MODEL.onnx`: inputs, outputs, opsets, parameter count, op histogram.
#include <iostream>
#include <map>

#include "commands.h"
#include "ir/onnx_io.h"

namespace onyx::cli {

static std::string describe_value(const ir::ValueInfo& v) {
  std::string s = cat(v.name, "  ", dtype_name(v.dtype));
  if (!v.has_shape) return s + " (shape unknown)";
  s += " [";
  for (size_t i = 0; i < v.shape.size(); i++) {
    s += i ? ", " : "";
    s += v.shape[i] >= 0 ? std::to_string(v.shape[i])
                         : (v.dim_params[i].empty() ? "?" : v.dim_params[i]);
  }
  return s + "]";
}

Action add_info_command(CLI::App& app) {
  auto* cmd =
      app.add_subcommand("info", "print a model's inputs, outputs, opsets and op histogram");
  auto path = std::make_shared<std::string>();
  cmd->add_option("model", *path, "an .onnx file")->required();
  return [path]() {
    ir::Graph g = ir::load_onnx(*path);
    std::cout << "model: " << *path << "\n";
    std::cout << "producer: " << (g.producer_name.empty() ? "?" : g.producer_name)
              << ", ir_version " << g.ir_version << "\n";
    std::cout << "opsets:";
    for (auto& [d, v] : g.opsets) std::cout << " " << (d.empty() ? "ai.onnx" : d) << "=" << v;
    std::cout << "\ninputs:\n";
    for (auto& v : g.inputs) std::cout << "  " << describe_value(v) << "\n";
    std::cout << "outputs:\n";
    for (auto& v : g.outputs) std::cout << "  " << describe_value(v) << "\n";
    int64_t bytes = 0;
    for (auto& [k, t] : g.initializers) bytes += (int64_t)t.nbytes();
    std::cout << "initializers: " << g.initializers.size() << " (" << bytes << " bytes)\n";
    std::cout << "parameters: " << g.parameter_count() << " (elements of float initializers)\n";
    std::map<std::string, int> hist;
    for (auto& n : g.nodes) hist[(n.domain.empty() ? "" : n.domain + ".") + n.op_type]++;
    std::cout << "nodes: " << g.nodes.size() << "\nop histogram:\n";
    std::vector<std::pair<int, std::string>> sorted;
    for (auto& [k, c] : hist) sorted.push_back({-c, k});
    std::sort(sorted.begin(), sorted.end());
    for (auto& [c, k] : sorted) std::cout << "  " << k << ": " << -c << "\n";
    return 0;
  };
}

}  // namespace onyx::cli
