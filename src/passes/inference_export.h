// passes/inference_export.h — turns a training-time forward graph into an inference model:
// Dropout replaced by Identity, the loss output (and everything only it needs, labels included)
// removed unless asked to keep it, dead nodes / unused inputs / unused initializers dropped.
#pragma once
#include <string>

#include "ir/graph.h"
#include "passes/pass.h"

namespace onyx::passes {

struct InferenceExportOptions {
  std::string loss_output;  // graph output that is the loss ("" = none)
  bool keep_loss = false;
};

ir::Graph make_inference_graph(const ir::Graph& g, const InferenceExportOptions& opts);

}  // namespace onyx::passes
