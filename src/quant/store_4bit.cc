// quant/store_4bit.cc — see store_4bit.h.
#include "quant/store_4bit.h"

#include <algorithm>
#include <cstring>

#include "onyx/error.h"

namespace onyx::quant {
namespace {

template <class T>
Tensor tensor_of(DType dt, Shape shape, const std::vector<T>& v) {
  Tensor t(dt, std::move(shape));
  std::memcpy(t.raw(), v.data(), v.size() * sizeof(T));
  return t;
}

std::string state_key(const std::string& name, Code4 type) {
  return name + ".quant_state.bitsandbytes__" + code4_name(type);
}

const Tensor& need(const std::map<std::string, Tensor>& t, const std::string& key, DType dt,
                   int64_t numel, const std::string& what) {
  auto it = t.find(key);
  ONYX_CHECK(it != t.end(), what, ": 4-bit weight tensor '", key, "' is missing");
  ONYX_CHECK(it->second.dtype() == dt, what, ": '", key, "' is ", dtype_name(it->second.dtype()),
             ", expected ", dtype_name(dt));
  ONYX_CHECK(numel < 0 || it->second.numel() == numel, what, ": '", key, "' has ",
             it->second.numel(), " elements, expected ", numel);
  return it->second;
}

template <class T>
std::vector<T> values(const Tensor& t) {
  const T* p = t.data<T>();
  return std::vector<T>(p, p + t.numel());
}

}  // namespace

std::map<std::string, Tensor> hf_tensors_4bit(const std::string& name, const Quant4& q) {
  std::map<std::string, Tensor> out;
  out[name] = tensor_of(DType::UInt8, {(int64_t)q.packed.size(), 1}, q.packed);
  const auto& code = code4_table(q.type);
  out[name + ".quant_map"] =
      tensor_of(DType::Float32, {16}, std::vector<float>(code.begin(), code.end()));
  if (q.nested) {
    out[name + ".absmax"] =
        tensor_of(DType::UInt8, {(int64_t)q.absmax_codes.size()}, q.absmax_codes);
    out[name + ".nested_absmax"] =
        tensor_of(DType::Float32, {(int64_t)q.nested_absmax.size()}, q.nested_absmax);
    const auto& m = dynamic_map();
    out[name + ".nested_quant_map"] =
        tensor_of(DType::Float32, {256}, std::vector<float>(m.begin(), m.end()));
  } else {
    out[name + ".absmax"] = tensor_of(DType::Float32, {(int64_t)q.absmax.size()}, q.absmax);
  }
  const std::string js = quant_state_json(q);
  out[state_key(name, q.type)] =
      tensor_of(DType::UInt8, {(int64_t)js.size()}, std::vector<uint8_t>(js.begin(), js.end()));
  return out;
}

bool is_hf_4bit(const std::map<std::string, Tensor>& tensors, const std::string& name) {
  return tensors.count(state_key(name, Code4::Nf4)) || tensors.count(state_key(name, Code4::Fp4));
}

Quant4 read_hf_4bit(const std::map<std::string, Tensor>& t, const std::string& name,
                    const std::string& what) {
  Quant4 q;
  const bool nf4 = t.count(state_key(name, Code4::Nf4)) != 0;
  const Tensor& js =
      need(t, state_key(name, nf4 ? Code4::Nf4 : Code4::Fp4), DType::UInt8, -1, what);
  const uint8_t* p = js.data<uint8_t>();
  read_quant_state_json(std::string(p, p + js.numel()), q, what + ": '" + name + "'");
  const int64_t blocks = q.blocks();
  q.packed = values<uint8_t>(need(t, name, DType::UInt8, (q.numel() + 1) / 2, what));
  const auto code = values<float>(need(t, name + ".quant_map", DType::Float32, 16, what));
  ONYX_CHECK(std::memcmp(code.data(), code4_table(q.type).data(), 16 * sizeof(float)) == 0, what,
             ": '", name, ".quant_map' is not bitsandbytes' ", code4_name(q.type), " table");
  if (q.nested) {
    q.absmax_codes = values<uint8_t>(need(t, name + ".absmax", DType::UInt8, blocks, what));
    const int64_t nested = (blocks + q.nested_blocksize - 1) / q.nested_blocksize;
    q.nested_absmax = values<float>(need(t, name + ".nested_absmax", DType::Float32, nested, what));
    const auto map = values<float>(need(t, name + ".nested_quant_map", DType::Float32, 256, what));
    ONYX_CHECK(std::memcmp(map.data(), dynamic_map().data(), 256 * sizeof(float)) == 0, what, ": '",
               name, ".nested_quant_map' is not bitsandbytes' dynamic map");
  } else {
    q.absmax = values<float>(need(t, name + ".absmax", DType::Float32, blocks, what));
  }
  return q;
}

Quant4 quant_header(const ir::Node& n) {
  Quant4 q;
  q.type = parse_code4(n.attr_string("quant_type", "nf4"), n.describe());
  q.blocksize = n.attr_int("blocksize", 64);
  q.shape = n.attr_ints("shape");
  q.nested_blocksize = n.attr_int("nested_blocksize", 256);
  q.offset = n.attr_float("offset", 0.0f);
  return q;
}

Quant4View quant_view(const Quant4& h, const Tensor& packed, const Tensor& absmax,
                      const Tensor* nested_absmax, const Tensor* nested_map) {
  Quant4View v;
  v.packed = packed.data<uint8_t>();
  v.code = code4_table(h.type).data();
  v.blocksize = h.blocksize;
  if (absmax.dtype() == DType::UInt8) {
    v.absmax_codes = absmax.data<uint8_t>();
    v.nested_absmax = nested_absmax->data<float>();
    v.nested_code = nested_map->data<float>();
    v.offset = h.offset;
    v.nested_blocksize = h.nested_blocksize;
  } else {
    v.absmax = absmax.data<float>();
  }
  return v;
}

bool holds_4bit_weights(const ir::Graph& g) {
  for (const ir::Node& n : g.nodes)
    if (n.domain == "onyx" && n.op_type == "Dequantize4Bit") return true;
  return false;
}

std::map<std::string, Tensor> hf_state_tensors(const ir::Graph& g) {
  std::map<std::string, Tensor> out;
  for (const ir::Node& n : g.nodes) {
    if (n.op_type != "Dequantize4Bit" || n.domain != "onyx" || n.inputs.empty()) continue;
    Quant4 q = quant_header(n);  // the header only: the tensors are the graph's
    q.nested = n.inputs.size() > 2 && !n.inputs[2].empty();
    for (auto& [k, t] : hf_tensors_4bit(n.inputs[0], q))
      if (k.find(".quant_state.") != std::string::npos || k == n.inputs[0] + ".quant_map")
        out[k] = t;
  }
  return out;
}

void replace_4bit_state(ir::Graph& g, const std::string& name, const Quant4& q) {
  ir::Node* d = nullptr;
  for (ir::Node& n : g.nodes)
    if (n.op_type == "Dequantize4Bit" && n.domain == "onyx" && !n.inputs.empty() &&
        n.inputs[0] == name)
      d = &n;
  ONYX_CHECK(d && d->attr_ints("shape") == q.shape && d->inputs.size() >= 2 &&
                 (d->inputs.size() > 2 && !d->inputs[2].empty()) == q.nested,
             "replace_4bit_state: '", name, "' is not stored 4-bit as ", shape_str(q.shape));
  for (auto& [k, t] : hf_tensors_4bit(name, q))
    if (g.initializers.count(k)) g.initializers[k] = t;
  if (q.nested) d->attrs["offset"] = ir::Attribute::of_float(q.offset);
}

Quant4 quantize_4bit(const Tensor& w, const BnbConfig& c, const std::string& what) {
  return quantize_4bit(w.data<float>(), w.shape(), c.quant_type, c.blocksize, c.double_quant, what);
}

Tensor transposed_2d(const Tensor& w) {
  ONYX_CHECK(w.rank() == 2 && w.dtype() == DType::Float32, "transposed_2d: ", shape_str(w.shape()),
             " ", dtype_name(w.dtype()), " is not a 2-D float32 tensor");
  const int64_t R = w.dim(0), C = w.dim(1);
  Tensor t(DType::Float32, {C, R});
  const float* src = w.data<float>();
  float* dst = t.data<float>();
  for (int64_t r = 0; r < R; r++)
    for (int64_t c = 0; c < C; c++) dst[c * R + r] = src[r * C + c];
  return t;
}

void quantize_initializer_4bit(ir::Graph& g, const std::string& name, const BnbConfig& c,
                               const std::string& what, bool conv1d) {
  const Tensor& w = g.initializers.at(name);
  const Quant4 q = quantize_4bit(conv1d ? transposed_2d(w) : w, c, what);
  store_initializer_4bit(g, name, q, c.compute_dtype, conv1d);
}

void store_initializer_4bit(ir::Graph& g, const std::string& name, const Quant4& q,
                            const std::string& compute_dtype, bool conv1d) {
  auto it = g.initializers.find(name);
  ONYX_CHECK(it != g.initializers.end(), "initializer '", name, "' does not exist");
  std::vector<std::string> inputs = {name, name + ".absmax"};
  if (q.nested) {
    inputs.push_back(name + ".nested_absmax");
    inputs.push_back(name + ".nested_quant_map");
  }
  for (auto& [k, t] : hf_tensors_4bit(name, q)) {
    if (k.find(".quant_state.") != std::string::npos || k == name + ".quant_map") continue;
    if (k == name)
      it->second = t;
    else
      g.add_initializer(k, t);
  }
  const std::string f32 = name + "/float32";
  for (auto& n : g.nodes)
    for (auto& in : n.inputs)
      if (in == name) in = f32;
  ir::Node d;
  d.name = name + "/dequantize";
  d.op_type = "Dequantize4Bit";
  d.domain = "onyx";
  d.inputs = inputs;
  d.outputs = {f32};
  d.attrs["quant_type"] = ir::Attribute::of_string(code4_name(q.type));
  d.attrs["blocksize"] = ir::Attribute::of_int(q.blocksize);
  d.attrs["shape"] = ir::Attribute::of_ints(q.shape);
  if (q.nested) {
    d.attrs["nested_blocksize"] = ir::Attribute::of_int(q.nested_blocksize);
    d.attrs["offset"] = ir::Attribute::of_float(q.offset);
  }
  d.attrs["compute_dtype"] = ir::Attribute::of_string(compute_dtype);
  if (conv1d) d.attrs["transpose"] = ir::Attribute::of_int(1);
  g.nodes.insert(g.nodes.begin(), std::move(d));
  if (!g.opsets.count("onyx")) g.opsets["onyx"] = 1;
}

void restore_float_weights(ir::Graph& g) {
  std::vector<ir::Node> kept;
  std::map<std::string, std::string> rename;  // W/float32 -> W
  for (ir::Node& n : g.nodes) {
    if (n.op_type != "Dequantize4Bit" || n.domain != "onyx") {
      kept.push_back(std::move(n));
      continue;
    }
    const std::string& name = n.inputs[0];
    const Quant4 h = quant_header(n);
    auto input = [&](size_t i) -> const Tensor* {
      return i < n.inputs.size() && !n.inputs[i].empty() ? &g.initializers.at(n.inputs[i])
                                                         : nullptr;
    };
    const Quant4View v = quant_view(h, *input(0), *input(1), input(2), input(3));
    Tensor w(DType::Float32, h.shape);
    v.dequantize(0, w.numel(), w.data<float>());
    for (size_t i = 1; i < n.inputs.size(); i++)
      if (!n.inputs[i].empty()) {
        g.initializers.erase(n.inputs[i]);
        auto& order = g.initializer_order;
        order.erase(std::remove(order.begin(), order.end(), n.inputs[i]), order.end());
      }
    g.initializers[name] = n.attr_int("transpose", 0) ? transposed_2d(w) : w;
    rename[n.outputs[0]] = name;
  }
  g.nodes = std::move(kept);
  for (ir::Node& n : g.nodes)
    for (auto& in : n.inputs)
      if (auto it = rename.find(in); it != rename.end()) in = it->second;
}

}  // namespace onyx::quant
