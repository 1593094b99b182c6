// ir/bf16_storage.cc — see bf16_storage.h.
#include "ir/bf16_storage.h"

#include <cmath>
#include <set>

namespace onyx::ir {

void store_initializer_bf16(ir::Graph& g, const std::string& name) {
  auto it = g.initializers.find(name);
  ONYX_CHECK(it != g.initializers.end() && it->second.dtype() == DType::Float32, "initializer '",
             name, "' is not a float32 initializer");
  Tensor& t = it->second;
  Tensor b(DType::BFloat16, t.shape());
  const float* x = t.data<float>();
  uint16_t* y = b.data<uint16_t>();
  for (int64_t i = 0; i < t.numel(); i++) y[i] = float_to_bf16(x[i]);
  t = b;
  const std::string f32 = name + "/float32";
  for (auto& n : g.nodes)
    for (auto& in : n.inputs)
      if (in == name) in = f32;
  Node c;
  c.name = name + "/to_float32";
  c.op_type = "Cast";
  c.inputs = {name};
  c.outputs = {f32};
  c.attrs["to"] = Attribute::of_int((int64_t)DType::Float32);
  g.nodes.insert(g.nodes.begin(), std::move(c));
}

std::vector<std::string> store_weights_bf16(ir::Graph& g, int64_t min_elements) {
  std::set<std::string> io;
  for (auto& v : g.inputs) io.insert(v.name);
  for (auto& v : g.outputs) io.insert(v.name);
  constexpr float kBf16Max = 3.38953139e38f;  // (2 - 2^-7) * 2^127
  std::vector<std::string> names;
  for (auto& [name, t] : g.initializers) {
    if (t.dtype() != DType::Float32 || t.numel() < min_elements || io.count(name)) continue;
    const float* x = t.data<float>();
    bool fits = true;
    for (int64_t i = 0; i < t.numel() && fits; i++) fits = std::fabs(x[i]) <= kBf16Max;
    if (fits) names.push_back(name);  // (NaN fails the comparison too)
  }
  for (const std::string& n : names) store_initializer_bf16(g, n);
  return names;
}

}  // namespace onyx::ir
