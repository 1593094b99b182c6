// runtime/session.h — runs an ir::Graph on CPU: plans once per input signature, then executes.
//
// A Plan is compiled for one input signature (each graph input's dtype and shape): topological
// order, constants folded (initializers, Constant nodes, and everything computable from them and
// from input *shapes*, which folds PyTorch's Shape→Gather→Concat→Reshape subgraphs), inferred
// output metas of every static node, and the step after which each value can be freed.
// Plans are cached by signature (DESIGN decision 2). Each plan also carries a memory plan
// (runtime/memory_plan.h): static activations and temporaries live at planned offsets of one
// arena that the session keeps across runs; view ops alias their input; declared in-place
// kernels write over an input that dies at that step.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "ir/graph.h"
#include "runtime/kernel.h"
#include "runtime/memory_plan.h"

namespace onyx::runtime {

struct RunOptions {
  bool training = false;  // Dropout active (when its own training_mode input allows)
  uint64_t seed = 0;
  // Mixed precision (TrainingArguments.bf16): the linear layers' GEMMs (onyx.MatMulT,
  // MatMulGradB, LinearCrossEntropy) take their float32 operands rounded to bf16 and accumulate in
  // float32 (KernelContext::bf16_gemm).
  bool bf16_gemm = false;
  // TrainingArguments.fp16: the same kernels take their float32 operands rounded to float16
  // (emulated: the rounded values multiplied by float32 GEMMs, float32 accumulation;
  // KernelContext::fp16_gemm). Not with bf16_gemm.
  bool fp16_gemm = false;
  // Reject inputs whose shape disagrees with the model's declared input shape. The conformance
  // runner turns this off: a few onnx 1.12 suite cases ship data that contradicts their model.
  bool check_declared_shapes = true;
  // Values written straight into caller-owned storage (e.g. views of the flat gradient buffer,
  // DESIGN decision 3) instead of freshly allocated tensors. Metas must match.
  std::map<std::string, Tensor> bound_outputs;
  // Kernels that support it (onyx.AccumulateGrad) add into a bound output instead of overwriting.
  bool accumulate = false;
  // Called with a bound output's name as soon as the node producing it has run (data-parallel
  // training starts reducing a gradient bucket while backward goes on).
  std::function<void(const std::string&)> on_bound_output;
};

struct PlanStep {
  int node;  // index into graph.nodes
  const OpKernel* kernel;
  bool dynamic;  // infer re-run at run time (shapes depend on run-time values)
  std::vector<TensorMeta> output_metas;  // valid when !dynamic
  std::vector<std::string> free_after;   // values whose last use is this step
  // Memory plan, per output: byte offset in the session's arena, or -1 (allocated at run time:
  // graph outputs, dynamic steps). When `alias`, output 0 is a view of input 0 (no kernel runs).
  std::vector<int64_t> output_offsets;
  bool alias = false;
};

struct Plan {
  std::vector<PlanStep> steps;
  std::unordered_map<std::string, Tensor> constants;  // folded values (incl. initializers)
  std::unordered_map<std::string, TensorMeta> metas;  // every value with a static meta
  int folded_nodes = 0;
  MemoryPlan memory;  // arena offsets and planned peak bytes (printable before anything runs)
};

class Session {
 public:
  // `parameters`: initializers that change between runs (trainable weights). They are never
  // folded into constants; a run may pass a new value for each by name (else the initializer).
  explicit Session(std::shared_ptr<const ir::Graph> graph, std::set<std::string> parameters = {});
  // Checks every op has a kernel before anything runs; throws naming the first that does not.
  void check_supported() const;

  // Runs the graph; inputs by graph-input name. Returns every graph output by name.
  std::map<std::string, Tensor> run(const std::map<std::string, Tensor>& inputs,
                                    const RunOptions& opts = {});
  // The plan for an input signature (compiled on first use, then cached). Nothing runs:
  // plan_for(sig).memory.planned_peak_bytes is the memory the run will need (`onyx plan`).
  const Plan& plan_for(const std::map<std::string, TensorMeta>& signature);
  // The arena shared by this session's plans (they never run at the same time); grown to the
  // largest plan run so far and kept across runs. Null before the first run.
  const void* arena_data() const { return arena_.get(); }
  size_t arena_bytes() const { return arena_bytes_; }
  // Frees the arena (the next run allocates it again). For long pauses between runs: after an
  // evaluation pass, at the end of training before the final save.
  void release_arena() {
    arena_.reset();
    arena_bytes_ = 0;
  }
  // Memory planning on (default) or off (ONYX_MEMORY_PLAN=0): off allocates every value on the
  // heap and copies in view ops, as before the planner existed. Clears the cached plans.
  void set_memory_planning(bool on) {
    memory_planning_ = on;
    plans_.clear();
    reported_.clear();
  }
  size_t cached_plans() const { return plans_.size(); }
  const ir::Graph& graph() const { return *graph_; }

 private:
  std::shared_ptr<const ir::Graph> graph_;
  std::set<std::string> parameters_;
  std::vector<int> order_;
  std::map<std::string, std::unique_ptr<Plan>> plans_;
  std::shared_ptr<uint8_t> arena_;
  size_t arena_bytes_ = 0;
  bool memory_planning_ = true;
  std::set<const Plan*> reported_;  // plans whose memory summary ONYX_PROFILE printed

  struct RunValues;
  std::map<std::string, TensorMeta> signature(const std::map<std::string, Tensor>& inputs,
                                              const RunOptions& opts) const;
  void check_parameter(const std::string& name, const Tensor& t) const;
  void reserve_arena(const Plan& plan);
  void run_step(const PlanStep& step, RunValues& rv, const RunOptions& opts);
  void allocate_outputs(const PlanStep& step, const std::vector<TensorMeta>& metas,
                        const RunOptions& opts, KernelContext& kc, std::vector<Tensor>& outs);
  std::map<std::string, Tensor> collect_outputs(const RunValues& rv) const;
};

// Ops whose results are random or depend on the run (Dropout, Random*, onyx.AccumulateGrad): never
// folded at plan time, never merged by common-subexpression elimination.
bool never_fold(const ir::Node& n);

// Runs one node on concrete inputs (nullptr-free; pass an undefined Tensor for an absent optional
// input). For kernel tests and constant folding.
std::vector<Tensor> run_node(const ir::Node& node, int64_t opset, const std::vector<Tensor>& inputs,
                             const RunOptions& opts = {});

}  // namespace onyx::runtime
