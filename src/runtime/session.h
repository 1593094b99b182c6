// runtime/session.h — runs an ir::Graph on CPU: plans once per input signature, then executes.
//
// A Plan is compiled for one input signature (each graph input's dtype and shape): topological
// order, constants folded (initializers, Constant nodes, and everything computable from them and
// from input *shapes*, which folds PyTorch's Shape→Gather→Concat→Reshape subgraphs), inferred
// output metas of every static node, and the step after which each value can be freed.
// Plans are cached by signature (DESIGN decision 2).
#pragma once
#include <map>
#include <set>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "ir/graph.h"
#include "runtime/kernel.h"

namespace onyx::runtime {

struct RunOptions {
  bool training = false;  // Dropout active (when its own training_mode input allows)
  uint64_t seed = 0;
  // Reject inputs whose shape disagrees with the model's declared input shape. The conformance
  // runner turns this off: a few onnx 1.12 suite cases ship data that contradicts their model.
  bool check_declared_shapes = true;
  // Values written straight into caller-owned storage (e.g. views of the flat gradient buffer,
  // DESIGN decision 3) instead of freshly allocated tensors. Metas must match.
  std::map<std::string, Tensor> bound_outputs;
  // Kernels that support it (onyx.AccumulateGrad) add into a bound output instead of overwriting.
  bool accumulate = false;
};

struct PlanStep {
  int node;                               // index into graph.nodes
  const OpKernel* kernel;
  bool dynamic;                           // infer re-run at run time (shapes depend on run-time values)
  std::vector<TensorMeta> output_metas;   // valid when !dynamic
  std::vector<std::string> free_after;    // values whose last use is this step
};

struct Plan {
  std::vector<PlanStep> steps;
  std::unordered_map<std::string, Tensor> constants;  // folded values (incl. initializers)
  std::unordered_map<std::string, TensorMeta> metas;  // every value with a static meta
  int folded_nodes = 0;
};

class Session {
 public:
  // `parameters`: initializers that change between runs (trainable weights). They are never
  // folded into constants; a run may pass a new value for each by name (else the initializer).
  explicit Session(std::shared_ptr<const ir::Graph> graph,
                   std::set<std::string> parameters = {});
  // Checks every op has a kernel before anything runs; throws naming the first that does not.
  void check_supported() const;

  // Runs the graph; inputs by graph-input name. Returns every graph output by name.
  std::map<std::string, Tensor> run(const std::map<std::string, Tensor>& inputs,
                                    const RunOptions& opts = {});
  // The plan for an input signature (compiled on first use, then cached).
  const Plan& plan_for(const std::map<std::string, TensorMeta>& signature);
  size_t cached_plans() const { return plans_.size(); }
  const ir::Graph& graph() const { return *graph_; }

 private:
  std::shared_ptr<const ir::Graph> graph_;
  std::set<std::string> parameters_;
  std::vector<int> order_;
  std::map<std::string, std::unique_ptr<Plan>> plans_;
};

// Runs one node on concrete inputs (nullptr-free; pass an undefined Tensor for an absent optional
// input). For kernel tests and constant folding.
std::vector<Tensor> run_node(const ir::Node& node, int64_t opset, const std::vector<Tensor>& inputs,
                             const RunOptions& opts = {});

}  // namespace onyx::runtime
