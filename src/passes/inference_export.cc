// inference_export.cc — see inference_export.h.
#include "passes/inference_export.h"

#include <set>

namespace onyx::passes {

ir::Graph make_inference_graph(const ir::Graph& src, const InferenceExportOptions& opts) {
  ir::Graph g = src;
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
  if (!opts.loss_output.empty() && !opts.keep_loss) {
    std::vector<ir::ValueInfo> outs;
    for (auto& o : g.outputs)
      if (o.name != opts.loss_output) outs.push_back(o);
    ONYX_CHECK(!outs.empty(), "the model's only output is the loss '", opts.loss_output,
               "'; export it with the loss kept, or add a logits output");
    g.outputs = outs;
  }
  eliminate_dead_nodes(g);
  for (auto& n : g.nodes)
    ONYX_CHECK(n.domain.empty() || n.domain == "ai.onnx" || n.domain == "com.microsoft", n.describe(),
               ": op of domain '", n.domain, "' is not a standard ONNX op");
  return g;
}

}  // namespace onyx::passes
