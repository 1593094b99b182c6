// passes/pass.h — what every graph pass sees: the graph, its static metas for one input
// signature, which initializers are variables (trainable weights, never folded), and small helpers
// to find producers/consumers and rewrite uses. One pass per file (DESIGN decision 7); the
// pipeline (pipeline.cc) runs them in order and records how often each one fired.
//
// A pass is `int run(ir::Graph&, PassContext&)` returning how many rewrites it applied (fusions
// made, nodes removed). Passes run on a graph specialized to one input signature (DESIGN decision
// 2): shape subgraphs have been folded into initializers, so a pass reads Reshape targets, axes
// and scalar constants with ctx.constant / ctx.scalar, and any value's shape with ctx.meta.
#pragma once
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "ir/graph.h"
#include "onyx/tensor.h"

namespace onyx::passes {

struct PassContext {
  std::map<std::string, TensorMeta> signature;        // graph input metas
  std::set<std::string> variables;                    // trainable initializers: never folded
  std::unordered_map<std::string, TensorMeta> metas;  // static meta of every value
  int counter = 0;                                    // for fresh names

  // Recomputes `metas` for the graph as it is now (the kernels' own infer functions). The
  // pipeline calls it before every pass; a pass that adds values and needs their metas calls it.
  void refresh(const ir::Graph& g);
  bool has_meta(const std::string& v) const { return metas.count(v) != 0; }
  const TensorMeta& meta(const std::string& v) const;  // throws naming the value
  // The value of a non-variable initializer, or nullptr (also for variables and node outputs).
  const Tensor* constant(const ir::Graph& g, const std::string& name) const;
  // A one-element float or int constant as a double, if `name` is one.
  std::optional<double> scalar(const ir::Graph& g, const std::string& name) const;
  // A value or node name not yet used in the graph: "<base>_onyx<N>".
  std::string fresh(const ir::Graph& g, const std::string& base);
};

// Producers and consumers of every value of a graph (rebuild after rewriting; node indices stay
// valid while a pass only replaces nodes in place or appends them). passes/match.h has the op
// tests and node builders that go with it.
class GraphIndex {
 public:
  explicit GraphIndex(const ir::Graph& g);
  int producer(const std::string& v) const;  // node index, -1 for inputs/initializers
  const std::vector<int>& consumers(const std::string& v) const;  // node indices (repeats if a
                                                                  // node reads it twice)
  bool is_graph_output(const std::string& v) const { return outputs_.count(v) != 0; }
  // Number of reads: consuming node inputs plus graph outputs.
  int uses(const std::string& v) const;
  // Read exactly once (by one node input, or only as a graph output).
  bool single_use(const std::string& v) const { return uses(v) == 1; }
  // The one node reading v when v is read exactly once by a node input and is not a graph
  // output (so a pattern may absorb it), else -1.
  int sole_consumer(const std::string& v) const;
  // Nobody reads v ("" counts as unread: an absent optional output).
  bool unused(const std::string& v) const { return v.empty() || uses(v) == 0; }
  // Node n's outputs from index `from` on are all unread (Dropout's mask, LayerNormalization's
  // statistics, Attention's log-sum-exp).
  bool outputs_unused(const ir::Node& n, size_t from = 1) const;
  // The node producing v in g (the graph this index was built from), or nullptr.
  const ir::Node* producer_node(const ir::Graph& g, const std::string& v) const;

 private:
  std::unordered_map<std::string, int> producer_;
  std::unordered_map<std::string, std::vector<int>> consumers_;
  std::set<std::string> outputs_;
  std::vector<int> none_;
};

// Replaces every node input named `from` by `to` (graph outputs are left alone).
void replace_uses(ir::Graph& g, const std::string& from, const std::string& to);
// Removes the nodes whose index is marked; keeps the order of the others.
void remove_nodes(ir::Graph& g, const std::vector<bool>& dead);
// Reorders g.nodes into a topological order (stable: file order among ready nodes). The runtime
// schedules in vector order when it is valid, so passes that insert nodes call this at the end.
void sort_topologically(ir::Graph& g);

struct Pass {
  const char* name;
  std::function<int(ir::Graph&, PassContext&)> run;
  bool until_fixpoint = false;  // run again (after CSE and DCE) until it applies nothing
  int order = 0;                // fusions run by increasing order (ONYX_REGISTER_FUSION)
};

// Registers a fusion pass from its own file, at static initialization:
//   ONYX_REGISTER_FUSION(fuse_silu, "silu_fusion", 250);
// `order` places it among the others (layer_norm 100, rms_norm 110, gelu 200, silu 250, swiglu
// 260, rotary 270, linear 300, attention 400, dropout_add 500, cross_entropy 600, bf16_weight 650,
// token_pruning 1000: last, it moves token selections through the fused ops). The pipeline and
// `onyx plan` read fusion_passes(); nothing else lists them. (onyx_core is an OBJECT library, so
// every pass file is linked and its registration runs.)
struct FusionRegistration {
  explicit FusionRegistration(Pass p);
};
#define ONYX_FUSION_CAT2(a, b) a##b
#define ONYX_FUSION_CAT(a, b) ONYX_FUSION_CAT2(a, b)
#define ONYX_REGISTER_PASS_(fn, name, order, until_fixpoint)       \
  static const ::onyx::passes::FusionRegistration ONYX_FUSION_CAT( \
      onyx_fusion_, __LINE__)(::onyx::passes::Pass{name, fn, until_fixpoint, order})
#define ONYX_REGISTER_FUSION(fn, name, order) ONYX_REGISTER_PASS_(fn, name, order, false)
// ... run again (after CSE and dead-node elimination) until it applies nothing.
#define ONYX_REGISTER_FUSION_TO_FIXPOINT(fn, name, order) ONYX_REGISTER_PASS_(fn, name, order, true)

struct PassStat {
  std::string pass;
  int applied = 0;
};
// What mixed_precision.cc did: GEMM nodes reading bf16 operands, values stored bf16 by their
// producer (the cast fused), values given a Cast to bf16.
struct MixedPrecisionStats {
  int gemms = 0, fused = 0, casts = 0;
  int bias_grads = 0;   // Casts fused into the BiasGrad that reads the same gradient
  int norm_copies = 0;  // Casts fused into the LayerNorm writing v (its bf16 copy, output 4)
  int outputs = 0;      // MatMulT outputs written bf16
  int weights = 0;      // weights read through their bf16 copy (OptimizeOptions::bf16_weights)
  int normalized = 0;   // LayerNorm / RMSNorm gradients reading the forward's bf16 xhat
};

struct PassReport {
  std::vector<PassStat> stats;  // in the order the passes ran (a pass may run more than once)
  int nodes_before = 0, nodes_after = 0;
  int recomputed_layers = 0;  // gradient checkpointing: layers whose activations are recomputed
  MixedPrecisionStats mixed_precision;         // bf16 training graphs (OptimizeOptions::bf16)
  int applied(const std::string& pass) const;  // summed over runs
};

// ---- the passes (one file each) ---------------------------------------------------------------
// Folds every node computable from non-variable initializers and from input *shapes* (PyTorch's
// Shape→Gather→Concat→Reshape subgraphs) into initializers. Random ops never fold.
int fold_constants(ir::Graph& g, PassContext& ctx);
// Removes nodes whose outputs reach no graph output; then unused inputs and initializers.
int eliminate_dead_nodes(ir::Graph& g);
// Merges nodes with the same op, domain, attributes and inputs (random ops excepted).
int eliminate_common_subexpressions(ir::Graph& g, PassContext& ctx);
// Identity; Dropout that cannot drop (ratio 0 or training_mode false, mask unused); Cast to the
// same dtype; Reshape/Flatten/Squeeze/Unsqueeze to the input's own shape; chains of reshapes
// collapsed into one Reshape; Transpose∘Transpose composed (removed when the identity).
int eliminate_no_ops(ir::Graph& g, PassContext& ctx);
// ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div[/Mul gamma][/Add beta] over the last axis (PyTorch's
// opset-14 LayerNorm) → LayerNormalization(x, gamma, beta) {axis -1, epsilon}.
int fuse_layer_norm(ir::Graph& g, PassContext& ctx);
// Mul(x, x) | Pow(x, 2) / ReduceMean / Add eps / Sqrt / Reciprocal (or Div) / Mul x [/ Mul w] over
// the last axis (Llama's RMSNorm) → onyx.RMSNorm(x, w) {epsilon}.
int fuse_rms_norm(ir::Graph& g, PassContext& ctx);
// 0.5·x·(1 + erf(x/√2)) → Gelu; 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))) → Gelu {tanh}.
int fuse_gelu(ir::Graph& g, PassContext& ctx);
// Mul(onyx.Silu(g), u) (either order, g and u of one shape) → onyx.SwiGLU(g, u).
int fuse_swiglu(ir::Graph& g, PassContext& ctx);
// Add(Mul(x, cos), Mul(Concat(Neg(x2), x1), sin)), x1/x2 the halves of x's last axis (Split or two
// Slices) → onyx.Rotary(x, cos, sin).
int fuse_rotary(ir::Graph& g, PassContext& ctx);
// MatMul(X, Transpose(W, [1,0])) [+ b] → onyx.MatMulT(X, W[, b]) {transB 1};
// MatMul(X, W) + b → onyx.MatMulT(X, W, b) (W 2-D, b 1-D of the last dim).
int fuse_linear(ir::Graph& g, PassContext& ctx);
// Reshape/Transpose/MatMul/scale/mask/Softmax/MatMul/Transpose/Reshape multi-head attention (BERT
// padding mask, GPT-2 causal Where, ViT none) -> onyx.Attention(Q, K, V[, mask]).
int fuse_attention(ir::Graph& g, PassContext& ctx);
// SoftmaxCrossEntropyLoss over a linear layer's logits (LM head: MatMul/MatMulT/Gemm, optional
// bias, time-shift Slice and row Reshape) → onyx.LinearCrossEntropy, which never materializes the
// (tokens × vocab) logits and computes the loss gradient chunk by chunk (cross_entropy_fusion.cc).
int fuse_cross_entropy(ir::Graph& g, PassContext& ctx);
// onyx.MatMulT / onyx.LinearCrossEntropy reading Cast(W_bf16, to=FLOAT) of a bfloat16 initializer
// (a frozen weight stored in bf16) → reading W_bf16 itself (bf16_weight_fusion.cc).
int fuse_bf16_weights(ir::Graph& g, PassContext& ctx);
// onyx.MatMulT (transA = 0, alpha = 1) reading onyx.Dequantize4Bit of a 4-bit weight →
// onyx.MatMul4Bit on the 4-bit tensors (quant4_weight_fusion.cc).
int fuse_quant4_weights(ir::Graph& g, PassContext& ctx);
// Add(Dropout(y, ratio, training_mode), residual) (either order) → onyx.DropoutAdd(y, residual,
// ratio, training_mode) {seed, rng_key}: the Dropout's mask, drawn in the add's pass.
int fuse_dropout_add(ir::Graph& g, PassContext& ctx);

// Gather(per-token op(x, ...), tokens, axis=1) → per-token op(Gather(x, tokens, 1), ...): a
// read-out of a few tokens ([CLS] pooling) is computed for those tokens only (token_pruning.cc).
int prune_tokens(ir::Graph& g, PassContext& ctx);

// Training graph: AccumulateGrad(g) -> p_grad removed where g's producer can add into its output
// (OpKernel::accumulate_outputs), which then writes p_grad itself (gradient_into_buffer.cc).
int write_gradients_into_buffer(ir::Graph& g, PassContext& ctx);
// The graph output through which the second contribution to a tied weight's gradient `grad` is
// added into the same storage (write_gradients_into_buffer): the caller binds it to grad's.
std::string tied_gradient_output(const std::string& grad);

// Training graph under bf16 (mixed_precision.cc): the float32 activations and gradients read by
// onyx.MatMulT / MatMulGradB stored or cast to bf16 once (producers that can write bf16 do, else
// one Cast), those GEMMs given output_dtype = FLOAT; with `outputs`, MatMulT outputs read only by
// the GELU and attention written bf16 too. The `weights` (float32 initializers whose bf16 copy
// the caller feeds, e.g. the optimizer's bf16 shadow of the parameters) are read by onyx.MatMulT
// and onyx.LinearCrossEntropy through a new bf16 graph input named bf16_weight_input(w).
// Returns the values now stored or read as bf16.
int convert_to_mixed_precision(ir::Graph& g, PassContext& ctx, bool outputs,
                               const std::set<std::string>& weights, MixedPrecisionStats* stats);
// The graph input through which convert_to_mixed_precision reads weight `w`'s bf16 copy.
std::string bf16_weight_input(const std::string& w);

// Gradient checkpointing per transformer layer (recompute.cc): `n_forward` = how many leading
// nodes of the training graph are forward nodes (autodiff appends the backward after them).
// Returns the number of nodes cloned.
struct RecomputeStats {
  int layers = 0;
  int nodes_cloned = 0;
};
int recompute_layers(ir::Graph& g, int n_forward, RecomputeStats* stats);

// ---- the pipelines ----------------------------------------------------------------------------
struct OptimizeOptions {
  bool fusions = true;        // false: folding and elimination only
  bool recompute = false;     // gradient checkpointing per transformer layer (recompute.cc)
  bool token_pruning = true;  // compute read-out tokens only (token_pruning.cc)
  bool gradient_into_buffer =
      true;                  // producers write parameter gradients (gradient_into_buffer.cc)
  bool bf16 = false;         // mixed precision: GEMM operands stored bf16 (mixed_precision.cc)
  bool bf16_outputs = true;  // ... and the GEMM outputs the GELU and attention read
  // ... and these float32 weights read by the GEMMs through a bf16 copy the caller feeds as the
  // graph input bf16_weight_input(w) (train::TrainingSession's bf16 shadow of the parameters).
  std::set<std::string> bf16_weights;
};
// The forward (+ loss) graph, specialized to `signature`, before autodiff: fold, eliminate,
// fuse. `variables` are the trainable initializers.
ir::Graph optimize_forward(const ir::Graph& g, const std::map<std::string, TensorMeta>& signature,
                           const std::set<std::string>& variables, const OptimizeOptions& opts,
                           PassReport* report);
// The training graph (forward + backward) after autodiff: CSE and dead-node elimination.
void optimize_training(ir::Graph& g, const std::map<std::string, TensorMeta>& signature,
                       const std::set<std::string>& variables, const OptimizeOptions& opts,
                       PassReport* report);
// The fusion passes, in pipeline order (for `onyx plan` and tests).
const std::vector<Pass>& fusion_passes();
// One of them by name ("gelu_fusion"); throws naming the registered ones when there is none.
const Pass& fusion_pass(const std::string& name);

}  // namespace onyx::passes
