// onyx/loss.h — the loss a model trains with (onyx::Model::loss): a scalar graph output, or
// cross-entropy / mean squared error appended to a logits or predictions output, with labels read
// from the batch. autodiff/gradient.h builds it into the training graph.
#pragma once
#include <cstdint>
#include <string>

namespace onyx::autodiff {

struct LossSpec {
  enum class Kind { GraphOutput, CrossEntropy, MSE };
  Kind kind = Kind::GraphOutput;
  std::string output;  // the scalar loss output, or the logits / predictions output; "" = auto
  std::string labels;  // graph input holding labels (CrossEntropy, MSE); added if absent
  int64_t ignore_index = -100;
  float label_smoothing = 0.0f;
};

}  // namespace onyx::autodiff
