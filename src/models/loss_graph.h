// models/loss_graph.h — what the heads that replace a causal LM's token loss share
// (preference_head.cc: DPO; grpo_head.cc: GRPO): a node emitter with elementwise and reduction
// helpers, the LM head's hidden states and weight table, and the graph surgery around them.
// Internal to src/models.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "ir/graph.h"
#include "onyx/error.h"

namespace onyx::models {

// Appends nodes to a graph: constants as Constant nodes (no initializers: nothing the trainer
// would take for a weight), node names under `prefix` ("dpo/", "grpo/").
struct Emit {
  ir::Graph& g;
  std::string prefix;
  int n = 0;
  std::string op(const std::string& type, std::vector<std::string> in,
                 std::map<std::string, ir::Attribute> attrs = {}, std::string out = "",
                 const std::string& domain = "", int outputs = 1) {
    ir::Node nd;
    nd.name = cat(prefix, type, "_", n++);
    nd.op_type = type;
    nd.domain = domain;
    nd.inputs = std::move(in);
    nd.outputs.push_back(out.empty() ? nd.name + "/out" : out);
    for (int k = 1; k < outputs; k++) nd.outputs.push_back(cat(nd.name, "/out", k));
    nd.attrs = std::move(attrs);
    g.nodes.push_back(nd);
    return nd.outputs[0];
  }
  std::string constant(Tensor t) {
    return op("Constant", {}, {{"value", ir::Attribute::of_tensor(std::move(t))}});
  }
  std::string f32(double v) { return constant(Tensor::scalar_f32((float)v)); }
  std::string i64s(const std::vector<int64_t>& v) {
    return constant(Tensor::from_vector<int64_t>(DType::Int64, {(int64_t)v.size()}, v));
  }
  // elementwise helpers
  std::string add(const std::string& a, const std::string& b) { return op("Add", {a, b}); }
  std::string sub(const std::string& a, const std::string& b) { return op("Sub", {a, b}); }
  std::string mul(const std::string& a, const std::string& b) { return op("Mul", {a, b}); }
  std::string div(const std::string& a, const std::string& b) { return op("Div", {a, b}); }
  std::string scale(double s, const std::string& x) { return mul(f32(s), x); }
  std::string neg(const std::string& x) { return op("Neg", {x}); }
  std::string sigmoid(const std::string& x) { return op("Sigmoid", {x}); }
  // log σ(x) = −softplus(−x) (PyTorch's F.logsigmoid)
  std::string logsigmoid(const std::string& x) { return neg(op("Softplus", {neg(x)})); }
  std::string square(const std::string& x) { return mul(x, x); }
  std::string mean(const std::string& x) {
    return op("ReduceMean", {x}, {{"keepdims", ir::Attribute::of_int(0)}});
  }
  std::string total(const std::string& x) {
    return op("ReduceSum", {x}, {{"keepdims", ir::Attribute::of_int(0)}});
  }
  std::string row_sums(const std::string& x) {  // (R, T) -> (R)
    return op("ReduceSum", {x, i64s({1})}, {{"keepdims", ir::Attribute::of_int(0)}});
  }
  std::string at_least_one(const std::string& x) { return op("Max", {x, f32(1.0)}); }
  std::string to_f32(const std::string& x) {
    return op("Cast", {x}, {{"to", ir::Attribute::of_int((int64_t)DType::Float32)}});
  }
  // 1.0 where an int64 label is not -100, else 0.0
  std::string not_ignored(const std::string& labels) {
    return to_f32(op("Not", {op("Equal", {labels, constant(Tensor::scalar_i64(-100))})}));
  }
  // rows [0, half) and [half, end) of a 1-D value
  std::pair<std::string, std::string> halves(const std::string& x, const std::string& half) {
    return {op("Slice", {x, i64s({0}), half, i64s({0})}),
            op("Slice", {x, half, i64s({INT64_MAX}), i64s({0})})};
  }
};

// The LM head of a causal LM built by build_hf_model ("logits" = MatMul(h, Transpose(table))),
// taken off: "logits", the nodes that read it (the token cross-entropy) and the outputs dropped,
// the Dropout nodes made identities when asked (TRL's disable_dropout), the onyx opset added.
// `what` ("DPO", "GRPO") names the caller in errors.
struct LmHead {
  std::string h, table;  // the hidden states (B, T, C) and the (V, C) weight
  int64_t hidden = 0;    // C
};
LmHead take_lm_head(ir::Graph& g, const std::string& what, bool no_dropout);

// onyx.LinearLogProbs over the shifted rows — h[:, :-1] scored against labels[:, 1:]
// (ignore_index -100, the logits divided by `temperature`) — with its first `outputs` outputs
// (logps, entropy, mean_logits, is_top1), each flat over the rows' B × (T − 1) positions.
struct ShiftedScores {
  std::vector<std::string> flat;
  std::string labels;  // labels[:, 1:]
  std::string shape;   // (B, T − 1)
  std::string rows(Emit& e, const std::string& flat_value) const {
    return e.op("Reshape", {flat_value, shape});
  }
};
ShiftedScores shifted_scores(Emit& e, const LmHead& head, int outputs, double temperature = 1.0);
// A float32 graph input / output of the given shape (-1: any).
void add_float_input(ir::Graph& g, const std::string& name, Shape shape);
void add_float_output(ir::Graph& g, const std::string& name, Shape shape);

}  // namespace onyx::models
