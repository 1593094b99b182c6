// ir/graph.h — onyx's own thin graph IR: nodes refer to values by name, as ONNX does.
// ONNX is read and written only at the edges (onnx_import.cc, onnx_export.cc); everything inside
// (autodiff, passes, planner, executor) works on this.
#pragma once
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "onyx/tensor.h"

namespace onyx::ir {

struct Graph;

struct Attribute {
  enum class Kind { Float, Int, String, Tensor, Graph, Floats, Ints, Strings, Tensors, Graphs };
  Kind kind = Kind::Int;
  float f = 0;
  int64_t i = 0;
  std::string s;
  onyx::Tensor t;
  std::vector<float> floats;
  std::vector<int64_t> ints;
  std::vector<std::string> strings;
  std::vector<onyx::Tensor> tensors;
  std::shared_ptr<Graph> g;  // subgraphs are parsed but not executed

  // Factories: one attribute of each kind, e.g. `{{"axis", ir::Attribute::of_int(-1)}}`.
  static Attribute of_int(int64_t v) {
    Attribute a;
    a.kind = Kind::Int;
    a.i = v;
    return a;
  }
  static Attribute of_float(float v) {
    Attribute a;
    a.kind = Kind::Float;
    a.f = v;
    return a;
  }
  static Attribute of_string(std::string v) {
    Attribute a;
    a.kind = Kind::String;
    a.s = std::move(v);
    return a;
  }
  static Attribute of_tensor(onyx::Tensor v) {
    Attribute a;
    a.kind = Kind::Tensor;
    a.t = std::move(v);
    return a;
  }
  static Attribute of_ints(std::vector<int64_t> v) {
    Attribute a;
    a.kind = Kind::Ints;
    a.ints = std::move(v);
    return a;
  }
  static Attribute of_floats(std::vector<float> v) {
    Attribute a;
    a.kind = Kind::Floats;
    a.floats = std::move(v);
    return a;
  }
  static Attribute of_strings(std::vector<std::string> v) {
    Attribute a;
    a.kind = Kind::Strings;
    a.strings = std::move(v);
    return a;
  }
};

struct Node {
  std::string name;
  std::string op_type;
  std::string domain;                // "" (= ai.onnx), "onyx", "com.microsoft", ...
  std::vector<std::string> inputs;   // "" marks an absent optional input
  std::vector<std::string> outputs;  // "" marks an absent optional output
  std::map<std::string, Attribute> attrs;

  bool has_attr(const std::string& k) const { return attrs.count(k) != 0; }
  int64_t attr_int(const std::string& k, int64_t def) const;
  float attr_float(const std::string& k, float def) const;
  std::string attr_string(const std::string& k, const std::string& def) const;
  std::vector<int64_t> attr_ints(const std::string& k, std::vector<int64_t> def = {}) const;
  std::vector<float> attr_floats(const std::string& k, std::vector<float> def = {}) const;
  const onyx::Tensor* attr_tensor(const std::string& k) const;  // nullptr if absent
  // Throws if absent, naming the node and attribute.
  int64_t attr_int_required(const std::string& k) const;
  std::vector<int64_t> attr_ints_required(const std::string& k) const;

  int num_inputs() const { return (int)inputs.size(); }
  bool has_input(int i) const { return i < (int)inputs.size() && !inputs[i].empty(); }
  // "node 'name' (Op)" for error messages
  std::string describe() const;
};

// One graph input/output declaration. A dimension < 0 is unknown (symbolic dims keep their name).
struct ValueInfo {
  std::string name;
  DType dtype = DType::Undefined;
  std::vector<int64_t> shape;           // -1 for an unknown / symbolic dimension
  std::vector<std::string> dim_params;  // symbolic names ("batch"), "" where concrete
  bool has_shape = false;
  bool is_tensor = true;  // false for sequence / map / optional types (not supported)
};

struct Graph {
  std::string name;
  std::vector<Node> nodes;
  std::vector<ValueInfo> inputs;  // excludes initializers
  std::vector<ValueInfo> outputs;
  std::vector<ValueInfo> value_infos;
  std::map<std::string, onyx::Tensor> initializers;
  std::vector<std::string> initializer_order;  // file order, for stable export

  // Model-level facts kept for export.
  std::map<std::string, int64_t> opsets;  // domain ("" = ai.onnx) -> version
  int64_t ir_version = 8;
  std::string producer_name;
  std::string doc_string;

  int64_t opset(const std::string& domain = "") const;  // 0 if not imported
  const ValueInfo* find_input(const std::string& name) const;
  bool is_initializer(const std::string& name) const { return initializers.count(name) != 0; }
  void add_initializer(const std::string& name, onyx::Tensor t);
  int64_t parameter_count() const;  // elements in float initializers
};

// Nodes in an order where every producer precedes its consumers; throws on a cycle or on a value
// consumed but never produced (naming both).
std::vector<int> topological_order(const Graph& g);

}  // namespace onyx::ir
