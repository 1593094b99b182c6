// passes/inference_export.h — turns a training-time forward graph into an inference model:
// Dropout and onyx.StopGradient replaced by Identity, BatchNormalization in training mode put in
// inference mode (it normalizes with its running statistics, as PyTorch's eval()), the loss output
// (and everything only it needs, labels included) removed unless asked to keep it, dead nodes /
// unused inputs / unused initializers dropped.
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

// Every BatchNormalization with training_mode=1 (opset >= 14) becomes an inference-mode one:
// training_mode removed, outputs 1 and 2 (the updated running statistics) dropped; throws when
// another node or a graph output reads them. Returns the number of nodes changed. Used by
// make_inference_graph and by evaluation (train::TrainingSession::forward).
int batch_norm_to_inference(ir::Graph& g);

}  // namespace onyx::passes
