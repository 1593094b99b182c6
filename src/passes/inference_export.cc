// inference_export.cc — see inference_export.h.
#include "passes/inference_export.h"

#include <cmath>
#include <set>

#include "onyx/custom_ops.h"

namespace onyx::passes {

int batch_norm_to_inference(ir::Graph& g) {
  if (g.opset("") < 14) return 0;  // no training_mode before opset 14
  std::set<std::string> read;
  for (auto& n : g.nodes)
    for (auto& i : n.inputs) read.insert(i);
  for (auto& o : g.outputs) read.insert(o.name);
  int changed = 0;
  for (auto& n : g.nodes) {
    if (n.op_type != "BatchNormalization" || !(n.domain.empty() || n.domain == "ai.onnx")) continue;
    if (n.attr_int("training_mode", 0) == 0) continue;
    for (size_t i = 1; i < n.outputs.size(); i++)
      ONYX_CHECK(n.outputs[i].empty() || !read.count(n.outputs[i]), n.describe(),
                 ": its running statistics output '", n.outputs[i],
                 "' is read by the graph; cannot put it in inference mode");
    n.attrs.erase("training_mode");
    n.attrs.erase("onyx_unbiased_var");
    n.outputs.resize(1);
    changed++;
  }
  return changed;
}

ir::Graph make_inference_graph(const ir::Graph& src, const InferenceExportOptions& opts) {
  ir::Graph g = src;
  batch_norm_to_inference(g);
  std::set<std::string> consumed;
  for (auto& n : g.nodes)
    for (auto& i : n.inputs) consumed.insert(i);
  for (auto& n : g.nodes) {
    if (n.op_type != "Dropout" || !n.domain.empty()) continue;
    if (n.outputs.size() > 1 && !n.outputs[1].empty())
      ONYX_CHECK(!consumed.count(n.outputs[1]), n.describe(),
                 ": its mask is used by other nodes; cannot remove the Dropout");
    n.op_type = "Identity";
    n.inputs.resize(1);
    n.outputs.resize(1);
    n.attrs.clear();
  }
  for (auto& n : g.nodes)  // a gradient stop is the identity without gradients
    if (n.op_type == "StopGradient" && n.domain == "onyx") {
      n.op_type = "Identity";
      n.domain.clear();
    }
  if (!opts.loss_output.empty() && !opts.keep_loss) {
    std::vector<ir::ValueInfo> outs;
    for (auto& o : g.outputs)
      if (o.name != opts.loss_output) outs.push_back(o);
    ONYX_CHECK(!outs.empty(), "the model's only output is the loss '", opts.loss_output,
               "'; export it with the loss kept, or add a logits output");
    g.outputs = outs;
  }
  eliminate_dead_nodes(g);
  // Custom ops (onyx/custom_ops.h) stay: the exported file needs the same library wherever it runs.
  std::set<std::string> custom;
  for (auto& c : custom_ops()) custom.insert(c.domain + "." + c.name);
  for (auto& n : g.nodes)
    ONYX_CHECK(
        n.domain.empty() || n.domain == "ai.onnx" || n.domain == "com.microsoft" ||
            custom.count(n.domain + "." + n.op_type),
        n.describe(), ": op of domain '", n.domain, "' is not a standard ONNX op",
        n.domain == "onyx" ? "" : " (nor a custom op of a library loaded with --custom-ops)");
  return g;
}

}  // namespace onyx::passes
