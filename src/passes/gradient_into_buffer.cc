// gradient_into_buffer.cc — training-graph pass: parameter gradients written straight into the
// flat gradient buffer (DESIGN decisions 3/4).
//
// Autodiff ends every parameter gradient with onyx.AccumulateGrad(g) -> p_grad; the trainer binds
// p_grad to the parameter's view of the flat gradient buffer, and AccumulateGrad copies g there
// (or adds it, when micro-batches accumulate). That is one extra pass over every gradient and an
// arena temporary per gradient. When g's producer can add into its output itself (its kernel lists
// the output in OpKernel::accumulate_outputs: MatMulGradB, BiasGrad, GatherGrad, LayerNormGrad's
// dscale/dbias, ConvGradWeight, LinearCrossEntropy's dW/dbias), this pass renames that output to
// p_grad and removes the AccumulateGrad:
//
//   MatMulGradB(A, dY) -> g ; AccumulateGrad(g) -> W_grad   ==>   MatMulGradB(A, dY) -> W_grad
//
// Kept as they are: a g read by anything else (or itself a graph output), a g whose producer
// cannot accumulate (Sum of tied-weight contributions, ReduceSum, Gemm, ...), non-float32
// gradients, and gradients computable from constants alone (the planner would fold their producer
// at plan time and never write the bound buffer).
//
// Hand-written: a dozen lines of graph surgery tied to onyx's kernel registry.
#include <unordered_set>

#include "passes/match.h"
#include "runtime/kernel.h"

namespace onyx::passes {

int write_gradients_into_buffer(ir::Graph& g, PassContext& ctx) {
  // Values computable from non-variable initializers alone (conservatively: random ops count too).
  std::unordered_set<std::string> constant;
  for (auto& [name, t] : g.initializers)
    if (!ctx.variables.count(name)) constant.insert(name);
  for (auto& n : g.nodes) {
    bool all = true;
    for (auto& in : n.inputs) all &= in.empty() || constant.count(in) != 0;
    if (all)
      for (auto& o : n.outputs)
        if (!o.empty()) constant.insert(o);
  }

  const auto& registry = runtime::KernelRegistry::instance();
  GraphIndex index(g);
  std::vector<bool> dead(g.nodes.size(), false);
  int rewrites = 0;
  for (size_t a = 0; a < g.nodes.size(); a++) {
    const ir::Node& acc = g.nodes[a];
    if (!is_op(acc, "onyx", "AccumulateGrad") || acc.inputs.size() != 1 || acc.outputs.size() != 1)
      continue;
    const std::string& grad = acc.inputs[0];
    int p = index.producer(grad);
    if (p < 0 || !index.single_use(grad) || constant.count(grad)) continue;
    if (!ctx.has_meta(grad) || ctx.meta(grad).dtype != DType::Float32) continue;
    ir::Node& prod = g.nodes[p];
    const runtime::OpKernel* k = registry.find(prod.domain, prod.op_type);
    if (!k) continue;
    for (int i : k->accumulate_outputs) {
      if (i < (int)prod.outputs.size() && prod.outputs[i] == grad) {
        prod.outputs[i] = acc.outputs[0];
        dead[a] = true;
        rewrites++;
        break;
      }
    }
  }
  remove_nodes(g, dead);
  return rewrites;
}

}  // namespace onyx::passes
