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
// A tied weight's Sum of two contributions whose producers can both add (a tied LM head's
// LinearCrossEntropy dW and the embedding's GatherGrad) is written into the buffer by both (see
// tied_into_buffer). Kept as they are: a g read by anything else (or itself a graph output), a g
// whose producer cannot accumulate (ReduceSum, Gemm, ...), non-float32
// gradients, and gradients computable from constants alone (the planner would fold their producer
// at plan time and never write the bound buffer).
//
// Hand-written: a dozen lines of graph surgery tied to onyx's kernel registry.
#include <unordered_set>

#include "passes/match.h"
#include "runtime/kernel.h"

namespace onyx::passes {
namespace {

// The index of `prod`'s output `v` when the kernel can add into it (accumulate_outputs), or -1.
int accumulating_output(const runtime::KernelRegistry& registry, const ir::Node& prod,
                        const std::string& v) {
  const runtime::OpKernel* k = registry.find(prod.domain, prod.op_type);
  if (!k) return -1;
  for (int i : k->accumulate_outputs)
    if (i < (int)prod.outputs.size() && prod.outputs[i] == v) return i;
  return -1;
}

// A tied weight's gradient, AccumulateGrad(Sum(g1, g2)) -> P with both contributions written by
// producers that can add into their output, the second (in node order) depending on the first
// (a tied LM head: the embedding's GatherGrad needs LinearCrossEntropy's dH): the first writes P
// (added to it when micro-batches accumulate), the second writes the output tied_gradient_output(P)
// — bound by the caller to P's storage — with onyx_accumulate = 1: it always adds. No
// weight-sized contribution waits in the arena through the backward, and no Sum or copy runs.
// In a plain run the bits are Sum's (g1 + g2, as AccumulateGrad copies them); accumulating a
// micro-batch adds (P + g1) + g2 instead of P + (g1 + g2). Returns whether it rewrote.
bool tied_into_buffer(ir::Graph& g, const GraphIndex& index,
                      const runtime::KernelRegistry& registry, const PassContext& ctx,
                      const std::unordered_set<std::string>& constant, int sum, int acc,
                      std::vector<bool>& dead) {
  const ir::Node& s = g.nodes[sum];
  if (s.inputs.size() != 2 || s.outputs.size() != 1) return false;
  int prod[2], out[2];
  for (int k = 0; k < 2; k++) {
    const std::string& v = s.inputs[k];
    prod[k] = index.producer(v);
    if (prod[k] < 0 || !index.single_use(v) || constant.count(v) || !ctx.has_meta(v) ||
        ctx.meta(v).dtype != DType::Float32 || ctx.meta(v).shape != ctx.meta(s.outputs[0]).shape)
      return false;
    out[k] = accumulating_output(registry, g.nodes[prod[k]], v);
    if (out[k] < 0) return false;
  }
  if (prod[0] == prod[1]) return false;
  const int first = prod[0] < prod[1] ? 0 : 1, second = 1 - first;
  // the second producer must depend on the first, so every order the planner may pick runs the
  // first write before the second's addition
  std::vector<bool> seen(g.nodes.size(), false);
  std::vector<int> todo{prod[first]};
  seen[prod[first]] = true;
  bool reached = false;
  while (!todo.empty() && !reached) {
    const int n = todo.back();
    todo.pop_back();
    for (auto& o : g.nodes[n].outputs)
      for (int c : index.consumers(o))
        if (!seen[c]) {
          seen[c] = true;
          reached = reached || c == prod[second];
          todo.push_back(c);
        }
  }
  if (!reached) return false;
  const std::string P = g.nodes[acc].outputs[0];
  const std::string alias = tied_gradient_output(P);
  if (g.initializers.count(alias) || ctx.has_meta(alias)) return false;
  g.nodes[prod[first]].outputs[out[first]] = P;
  ir::Node& late = g.nodes[prod[second]];
  late.outputs[out[second]] = alias;
  late.attrs["onyx_accumulate"] = ir::Attribute::of_int(1);
  ir::ValueInfo vi;
  vi.name = alias;
  vi.dtype = DType::Float32;
  g.outputs.push_back(vi);
  dead[sum] = dead[acc] = true;
  return true;
}

}  // namespace

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
    if (is_op(prod, "Sum") && tied_into_buffer(g, index, registry, ctx, constant, p, a, dead)) {
      rewrites++;
      continue;
    }
    const int out = accumulating_output(registry, prod, grad);
    if (out < 0) continue;
    prod.outputs[out] = acc.outputs[0];
    dead[a] = true;
    rewrites++;
  }
  remove_nodes(g, dead);
  return rewrites;
}

std::string tied_gradient_output(const std::string& grad) { return grad + ".tied"; }

}  // namespace onyx::passes
