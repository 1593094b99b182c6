// models/loss_graph.cc — see loss_graph.h.
#include "models/loss_graph.h"

#include <algorithm>
#include <set>

namespace onyx::models {

namespace {

std::pair<std::string, std::string> lm_head_of(const ir::Graph& g, const std::string& what) {
  const ir::Node* mm = nullptr;
  for (auto& n : g.nodes)
    if (!n.outputs.empty() && n.outputs[0] == "logits") mm = &n;
  ONYX_CHECK(mm && mm->op_type == "MatMul" && mm->inputs.size() == 2, what,
             ": the model has no LM head "
             "(a MatMul computing 'logits'): a causal LM built by onyx (gpt2, llama, mistral, "
             "qwen2) is needed");
  for (auto& n : g.nodes)
    if (n.outputs[0] == mm->inputs[1] && n.op_type == "Transpose")
      return {mm->inputs[0], n.inputs[0]};
  throw Error(cat(what, ": the LM head's weight is not a transposed table"));
}

void drop_token_loss(ir::Graph& g) {
  std::set<std::string> dead = {"logits"};
  std::vector<ir::Node> kept;
  for (auto& n : g.nodes) {
    bool reads = std::any_of(n.inputs.begin(), n.inputs.end(),
                             [&](const std::string& i) { return dead.count(i) != 0; });
    bool is_head = !n.outputs.empty() && n.outputs[0] == "logits";
    if (reads || is_head) {
      for (auto& o : n.outputs) dead.insert(o);
      continue;
    }
    kept.push_back(n);
  }
  g.nodes = std::move(kept);
  g.outputs.clear();
}

void disable_dropout(ir::Graph& g) {
  for (auto& n : g.nodes)
    if (n.op_type == "Dropout" && n.domain.empty()) {
      n.op_type = "Identity";
      n.inputs.resize(1);
      n.outputs.resize(1);
      n.attrs.clear();
    }
}

}  // namespace

LmHead take_lm_head(ir::Graph& g, const std::string& what, bool no_dropout) {
  auto [h, table] = lm_head_of(g, what);
  ONYX_CHECK(g.initializers.count(table) && g.initializers.at(table).rank() == 2, what,
             ": the LM head's weight '", table, "' is not a 2-D weight");
  LmHead head{h, table, g.initializers.at(table).dim(1)};
  drop_token_loss(g);
  if (no_dropout) disable_dropout(g);
  g.opsets["onyx"] = 1;
  return head;
}

ShiftedScores shifted_scores(Emit& e, const LmHead& head, int outputs, double temperature) {
  ShiftedScores s;
  std::string hs = e.op("Slice", {head.h, e.i64s({0}), e.i64s({-1}), e.i64s({1})});
  s.labels = e.op("Slice", {"labels", e.i64s({1}), e.i64s({INT64_MAX}), e.i64s({1})});
  s.shape = e.op("Shape", {s.labels});
  std::map<std::string, ir::Attribute> attrs = {{"ignore_index", ir::Attribute::of_int(-100)}};
  if (temperature != 1.0) attrs["temperature"] = ir::Attribute::of_float((float)temperature);
  e.op("LinearLogProbs",
       {e.op("Reshape", {hs, e.i64s({-1, head.hidden})}), head.table,
        e.op("Reshape", {s.labels, e.i64s({-1})})},
       attrs, "", "onyx", outputs);
  s.flat = e.g.nodes.back().outputs;
  return s;
}

void add_float_input(ir::Graph& g, const std::string& name, Shape shape) {
  ir::ValueInfo vi;
  vi.name = name;
  vi.dtype = DType::Float32;
  vi.shape = std::move(shape);
  g.inputs.push_back(vi);
}

void add_float_output(ir::Graph& g, const std::string& name, Shape shape) {
  ir::ValueInfo vi;
  vi.name = name;
  vi.dtype = DType::Float32;
  vi.shape = std::move(shape);
  g.outputs.push_back(vi);
}

}  // namespace onyx::models
