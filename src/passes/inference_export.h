// passes/inference_export.h — turns a training-time forward graph into an inference model:
// Dropout replaced by Identity, BatchNormalization in training mode put in inference mode (it
// normalizes with its running statistics, as PyTorch's eval()), the loss output (and everything
// only it needs, labels included) removed unless asked to keep it, dead nodes / unused inputs /
// unused initializers dropped.
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

// Stores float32 initializer `name` as bfloat16 (rounded to nearest even) under the same name, read
// through one Cast(name, to=FLOAT) node (inserted first) whose output `name/float32` replaces it in
// every consumer. Used by models::store_frozen_weights_bf16 and by store_weights_bf16.
void store_initializer_bf16(ir::Graph& g, const std::string& name);

// `onyx export --dtype bfloat16`: every float32 initializer of at least `min_elements` elements
// whose values bfloat16 holds (finite, |x| below bf16's largest finite value) and that is not a
// graph input or output is stored bf16 through store_initializer_bf16, so the file holds half the
// bytes and runs anywhere a float32 model does (the arithmetic stays float32). Small constants
// (scalars, epsilons, scales) and additive masks at float32's extremes stay float32. Returns the
// converted names.
std::vector<std::string> store_weights_bf16(ir::Graph& g, int64_t min_elements = 16);

}  // namespace onyx::passes
