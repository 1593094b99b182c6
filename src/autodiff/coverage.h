// autodiff/coverage.h — can this model be trained? Before any data is read or any graph planned,
// every op type of the forward graph (with the loss appended, as build_loss_graph appends it) is
// looked up: does a forward kernel exist (runtime::KernelRegistry), does some node of that type
// lie on a path from a trainable parameter to the loss (gradient_paths), and if so, does a
// gradient rule exist (GradRegistry). `onyx check` prints the report; the Trainer's constructor
// calls require_coverage, so a model with missing ops fails before step 1 naming all of them at
// once, instead of one at a time when the first batch's training graph is built.
//
// The graph checked is the one as loaded: the optimization passes run per batch signature and
// only introduce "onyx" ops that have kernels and rules. Without a signature, which values are
// float is found from the graph alone (declared dtypes, initializers, Cast's `to`, comparisons
// are bool, Shape is int64, ...); a value of unknown dtype counts as float, as the builder would
// see it if it were.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "autodiff/gradient.h"
#include "ir/graph.h"

namespace onyx::autodiff {

struct OpCoverage {
  std::string domain;  // "" = ai.onnx
  std::string op_type;
  int64_t opset = 0;                     // the graph's version of the domain
  int count = 0;                         // nodes of this type
  bool forward = false;                  // a kernel is registered
  bool gradient = false;                 // a gradient rule is registered
  std::vector<const ir::Node*> nodes;    // every node of this type (pointers into the graph)
  std::vector<const ir::Node*> on_path;  // those on a parameter -> loss path (need a rule)
  std::string key() const { return domain.empty() ? op_type : domain + "." + op_type; }
  bool missing_forward() const { return !forward; }
  bool missing_gradient() const { return !on_path.empty() && !gradient; }
};

struct CoverageReport {
  std::shared_ptr<ir::Graph> graph;     // forward + loss: what `ops` points into
  std::string loss;                     // the scalar loss value
  int forward_nodes = 0;                // nodes of the graph as loaded (the rest are the loss's)
  std::vector<std::string> parameters;  // trainable_parameters()
  std::vector<OpCoverage> ops;          // sorted by domain ("" first), then op_type
  bool ok() const;                      // no forward kernel and no needed gradient missing
  // "N op types: all supported", or "missing: forward kernel for X (opset 17: node 'a' (X)),
  // gradient for Y (...)": every missing op type with (up to 4 of) its nodes.
  std::string summary() const;
};

// Appends the loss of opts.loss to a copy of `forward` (labels not among the graph's inputs are
// taken as int64 for cross entropy, float32 for MSE) and fills the report. Throws only what the
// loss and the trainable set throw (a loss output that does not exist, a frozen name that is not
// an initializer); a missing op is reported, not thrown.
CoverageReport check_coverage(const ir::Graph& forward, const GradientOptions& opts);

// check_coverage, then throws onyx::Error "the model cannot be trained: missing: ..." when an op
// has no forward kernel or a needed gradient rule is missing. With `gradients` false (a Trainer
// that only evaluates or predicts) only the forward kernels of the graph as loaded are required:
// "the model cannot run: missing: forward kernel for ...".
void require_coverage(const ir::Graph& forward, const GradientOptions& opts, bool gradients = true);

}  // namespace onyx::autodiff
