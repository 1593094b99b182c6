// sequence_lowering.cc — rewrites the one use of ONNX sequences that exporters emit in transformer
// models into tensor ops, at load time: torch.split / chunk exported by the dynamo exporter as
//   seq = SplitToSequence(x, split, axis=a)   and   y_k = SequenceAt(seq, position_k)
// (Hugging Face GPT-2's fused c_attn, split into q, k, v). Each SequenceAt with a constant position
// becomes one Slice of x along a (plus a Squeeze for keepdims=0 without a split), so the rest of
// onyx (planner, passes, autodiff: Slice has a gradient) sees tensors only. Any other use of a
// sequence is left alone and reported as the unsupported op it is.
#include <set>

#include "ir/graph.h"
#include "ir/onnx_io.h"

namespace onyx::ir {
namespace {

const Tensor* constant_value(const Graph& g, const std::string& name,
                             const std::map<std::string, const Node*>& constants) {
  auto it = g.initializers.find(name);
  if (it != g.initializers.end()) return &it->second;
  auto c = constants.find(name);
  if (c != constants.end()) return c->second->attr_tensor("value");
  return nullptr;
}

}  // namespace

int lower_split_to_sequence(Graph& g) {
  // Slice/Squeeze take their parameters as inputs from opset 13 (SplitToSequence is opset 11+;
  // older graphs keep the sequence ops).
  if (g.opset("") < 13) return 0;
  std::map<std::string, const Node*> constants;  // Constant node outputs with a tensor value
  for (auto& n : g.nodes)
    if (n.op_type == "Constant" && n.domain.empty() && n.outputs.size() == 1 &&
        n.attr_tensor("value"))
      constants[n.outputs[0]] = &n;
  std::map<std::string, std::vector<size_t>> readers;
  for (size_t i = 0; i < g.nodes.size(); i++)
    for (auto& in : g.nodes[i].inputs)
      if (!in.empty()) readers[in].push_back(i);
  std::set<std::string> graph_outputs;
  for (auto& o : g.outputs) graph_outputs.insert(o.name);

  std::set<size_t> replaced;  // SequenceAt nodes turned into Slice (+ Squeeze)
  std::set<size_t> dropped;   // SplitToSequence nodes whose every reader was lowered
  std::map<size_t, std::vector<Node>> insert_at;
  int lowered = 0;
  for (size_t si = 0; si < g.nodes.size(); si++) {
    const Node& s = g.nodes[si];
    if (s.op_type != "SplitToSequence" || !s.domain.empty() || s.outputs.size() != 1) continue;
    const std::string& seq = s.outputs[0];
    if (graph_outputs.count(seq)) continue;
    auto rd = readers.find(seq);
    if (rd == readers.end()) continue;
    int64_t axis = s.attr_int("axis", 0);
    bool keepdims = s.attr_int("keepdims", 1) != 0;
    const Tensor* split = s.has_input(1) ? constant_value(g, s.inputs[1], constants) : nullptr;
    if (s.has_input(1) && !split) continue;  // a data-dependent split: leave it (unsupported)
    std::vector<int64_t> sizes = split ? split->to_int64_vector() : std::vector<int64_t>{};
    bool scalar_split = split && split->rank() == 0;
    std::vector<Node> lowered_nodes;
    bool ok = true;
    for (size_t ri : rd->second) {
      const Node& at = g.nodes[ri];
      if (at.op_type != "SequenceAt" || !at.domain.empty() || at.inputs.size() != 2 ||
          at.inputs[0] != seq) {
        ok = false;
        break;
      }
      const Tensor* pos_t = constant_value(g, at.inputs[1], constants);
      if (!pos_t || pos_t->numel() != 1) {
        ok = false;
        break;
      }
      int64_t k = pos_t->to_int64_vector()[0];
      int64_t start, end;
      if (!split) {  // chunks of one along the axis (a negative k counts from the end)
        start = k;
        end = k == -1 ? INT64_MAX : k + 1;
      } else if (scalar_split) {
        if (k < 0 || sizes[0] <= 0) {  // the last chunk's size depends on the axis length
          ok = false;
          break;
        }
        start = k * sizes[0];
        end = (k + 1) * sizes[0];
      } else {
        int64_t n = (int64_t)sizes.size();
        if (k < -n || k >= n) {
          ok = false;
          break;
        }
        if (k < 0) k += n;
        start = 0;
        for (int64_t j = 0; j < k; j++) start += sizes[j];
        end = start + sizes[k];
      }
      std::string base = at.outputs[0];
      auto add_i64 = [&](const std::string& suffix, int64_t v) {
        std::string nm = base + "/lowered_" + suffix;
        g.add_initializer(nm, Tensor::from_vector<int64_t>(DType::Int64, {1}, {v}));
        return nm;
      };
      Node sl;
      sl.name = at.name.empty() ? base + "/slice" : at.name + "/slice";
      sl.op_type = "Slice";
      bool squeeze = !split && !keepdims;
      sl.inputs = {s.inputs[0], add_i64("start", start), add_i64("end", end),
                   add_i64("axis", axis)};
      sl.outputs = {squeeze ? base + "/lowered_chunk" : base};
      lowered_nodes.push_back(sl);
      if (squeeze) {
        Node sq;
        sq.name = sl.name + "_squeeze";
        sq.op_type = "Squeeze";
        sq.inputs = {sl.outputs[0], add_i64("squeeze_axes", axis)};
        sq.outputs = {base};
        lowered_nodes.push_back(sq);
      }
    }
    if (!ok) continue;
    for (size_t ri : rd->second) replaced.insert(ri);
    dropped.insert(si);
    insert_at[si] = std::move(lowered_nodes);
    lowered++;
  }
  if (!lowered) return 0;
  std::vector<Node> out;
  for (size_t i = 0; i < g.nodes.size(); i++) {
    if (dropped.count(i)) {
      for (auto& n : insert_at[i]) out.push_back(std::move(n));
      continue;
    }
    if (replaced.count(i)) continue;
    out.push_back(std::move(g.nodes[i]));
  }
  g.nodes = std::move(out);
  return lowered;
}

}  // namespace onyx::ir
