// autodiff/gradient.h — builds the training graph: forward + loss + backward in one ir::Graph.
//
// The builder walks from the loss back to the trainable tensors. Each op's backward is a small
// declarative rule (DESIGN decision 6) that emits IR nodes through a GradContext; fused gradient
// kernels (LayerNormGrad, SoftmaxGrad, GeluGrad, ...) are ops in the "onyx" domain. Shapes are
// static per input signature (DESIGN decision 2), so rules see every forward value's meta and emit
// static-shape nodes (e.g. ReduceSum with constant axes to undo broadcasting).
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "onyx/loss.h"  // LossSpec
#include "onyx/tensor.h"

namespace onyx::autodiff {

struct GradientOptions {
  LossSpec loss;
  std::set<std::string> frozen;        // initializers that get no gradient and no backward work
  std::vector<std::string> trainable;  // empty: every float initializer not frozen
  // Forward values kept as outputs of the training graph, after the loss and the gradients (the
  // updated BatchNormalization running statistics, train::TrainingSession).
  std::vector<std::string> keep_outputs;
};

// BatchNormalization's running statistics: float initializers of `g` that are read by at least
// one node and only ever as input 3 (input_mean) or 4 (input_var) of a BatchNormalization. They
// are PyTorch's buffers, not parameters: trainable_parameters leaves them out, and in training
// mode train::TrainingSession writes the node's updated statistics (outputs 1, 2) back into them.
// In initializer order.
std::vector<std::string> batch_norm_buffers(const ir::Graph& g);

// The parameters trained by default: float initializers (0-d ones too: a temperature, a gate), in
// file order, except frozen ones, rotary inv_freq buffers, BatchNormalization running statistics
// (batch_norm_buffers) and the exporters' folded constants ("onnx::..." and val_<n>: PyTorch
// stores constants such as a Pow exponent as initializers; they are not model weights).
std::vector<std::string> trainable_parameters(const ir::Graph& forward,
                                              const GradientOptions& opts);

struct TrainingGraph {
  std::shared_ptr<ir::Graph> graph;  // inputs: forward inputs (+ labels); outputs: loss, grads
  std::string loss;                  // name of the scalar loss value
  std::vector<std::pair<std::string, std::string>> gradients;  // (parameter, gradient value)
  int backward_nodes = 0;
};

// What the builder differentiates, found without building anything: the parameters and every
// value computed from one that can carry a gradient (`carries_gradient(value)`: in
// build_training_graph, float and not a plan-time constant) form `requires_grad`; node i of `g`
// is `on_path` when one of its outputs in requires_grad reaches `loss`, i.e. it lies on a path
// from a trainable parameter to the loss and needs a gradient rule. `order` is
// ir::topological_order(g). Also used by check_coverage (coverage.h) on the graph as loaded.
struct GradientPaths {
  std::vector<int> order;
  std::set<std::string> requires_grad;
  std::vector<bool> on_path;  // by index into g.nodes
};
GradientPaths gradient_paths(const ir::Graph& g, const std::vector<std::string>& params,
                             const std::string& loss,
                             const std::function<bool(const std::string&)>& carries_gradient);

// Throws onyx::Error naming the op and node when a node on the path to the loss has no rule,
// before anything runs; and when the loss is not a scalar.
TrainingGraph build_training_graph(const ir::Graph& forward,
                                   const std::map<std::string, TensorMeta>& signature,
                                   const GradientOptions& opts);

// The forward graph with the loss appended (no backward): outputs are the loss followed by the
// forward graph's own outputs (minus the loss if it was one). For evaluation.
struct LossGraph {
  std::shared_ptr<ir::Graph> graph;
  std::string loss;
};
LossGraph build_loss_graph(const ir::Graph& forward, const GradientOptions& opts,
                           const std::map<std::string, TensorMeta>& signature);

// ---- what a gradient rule sees -------------------------------------------------------------

struct Builder;  // the builder's state (gradient.cc)

class GradContext {
 public:
  GradContext(Builder& b, int node_index);
  const ir::Node& node() const;
  int64_t opset() const;
  int num_inputs() const;
  int num_outputs() const;
  const std::string& I(int i) const;  // forward input name ("" if absent)
  const std::string& O(int i) const;  // forward output name
  // Ensures forward output i exists (adds a name to an optional output, e.g. LayerNorm's Mean or
  // Dropout's mask) and returns it.
  std::string ensure_output(int i);
  std::string GO(int i) const;  // gradient flowing into output i; "" when none
  bool needs(int i) const;      // does input i need a gradient?
  const TensorMeta& meta(const std::string& value) const;  // forward value's static dtype/shape
  const Tensor* constant(const std::string& value) const;  // value if known at build time

  // Contributes `grad` (same shape as input i, or broadcastable to it: it is reduced) to input i.
  void set(int i, const std::string& grad);
  // Emits a node; returns its output names (num_outputs of them).
  std::vector<std::string> emit(const std::string& op, const std::vector<std::string>& inputs,
                                std::map<std::string, ir::Attribute> attrs = {},
                                const std::string& domain = "", int num_outputs = 1);
  std::string emit1(const std::string& op, const std::vector<std::string>& inputs,
                    std::map<std::string, ir::Attribute> attrs = {},
                    const std::string& domain = "") {
    return emit(op, inputs, std::move(attrs), domain, 1)[0];
  }
  // New constant initializers.
  std::string const_i64(const std::vector<int64_t>& v);  // 1-D int64
  std::string const_scalar(double v, DType dtype);       // 0-D of dtype
  // Reshape to a static shape (no node when it already has it; allowzero for zero-sized dims).
  std::string reshape(const std::string& v, const Shape& shape);
  // ReduceSum over static axes, with axes as an input (opset >= 13) or an attribute (before);
  // no node for empty axes.
  std::string reduce_sum(const std::string& v, const std::vector<int64_t>& axes, bool keepdims);
  // Sums `grad` (whose shape is grad_shape) over broadcast axes so it has `target`'s shape.
  std::string reduce_to_shape(const std::string& grad, const Shape& grad_shape,
                              const Shape& target);

 private:
  Builder& b_;
  int node_;
};

// Short names for the ir::Attribute factories, for the rules' many attribute maps.
inline ir::Attribute attr_i(int64_t v) { return ir::Attribute::of_int(v); }
inline ir::Attribute attr_f(float v) { return ir::Attribute::of_float(v); }
inline ir::Attribute attr_s(const std::string& v) { return ir::Attribute::of_string(v); }
inline ir::Attribute attr_ints(const std::vector<int64_t>& v) { return ir::Attribute::of_ints(v); }

using GradRule = std::function<void(GradContext&)>;

class GradRegistry {
 public:
  // Filled on first use by every rule family registered with ONYX_REGISTER_GRADIENTS.
  static GradRegistry& instance();
  // Registers (or, for custom ops, replaces) a rule.
  void add(const std::string& domain, const std::string& op, GradRule rule);
  const GradRule* find(const std::string& domain, const std::string& op) const;
  std::vector<std::string> op_names() const;  // "Add", "onyx.MatMulT", ...

 private:
  std::map<std::string, GradRule> rules_;
};

// What a rule family's registration function receives: add() as GradRegistry's; an op that two
// families (or one family twice) register is an error naming them.
class GradFamilyRegistrar {
 public:
  GradFamilyRegistrar(GradRegistry& registry, const char* family,
                      std::map<std::string, std::string>& owners)
      : registry_(registry), family_(family), owners_(owners) {}
  void add(const std::string& domain, const std::string& op, GradRule rule);

 private:
  GradRegistry& registry_;
  const char* family_;
  std::map<std::string, std::string>& owners_;
};

// Registers a family of gradient rules from its own file (src/autodiff/gradients/<family>.cc)
// at static initialization, as kernels (ONYX_REGISTER_KERNELS) and fusions do; the registry runs
// them on first use, by name. No central list names them:
//   ONYX_REGISTER_GRADIENTS(attention) { r.add("onyx", "Attention", attention_rule); }
using GradFamilyFn = void (*)(GradFamilyRegistrar&);
struct GradFamilyRegistration {
  GradFamilyRegistration(const char* family, GradFamilyFn fn);
};
#define ONYX_REGISTER_GRADIENTS(family)                                            \
  static void onyx_grads_##family(::onyx::autodiff::GradFamilyRegistrar&);         \
  static const ::onyx::autodiff::GradFamilyRegistration onyx_grad_family_##family( \
      #family, onyx_grads_##family);                                               \
  static void onyx_grads_##family(::onyx::autodiff::GradFamilyRegistrar& r)

}  // namespace onyx::autodiff
