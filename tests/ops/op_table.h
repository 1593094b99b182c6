// op_table.h — the op-case table (ggml test-backend-ops style): one row per case of one op, in
// cases_<family>.inc, run by test_op_table.cc in four modes over the same rows:
//   forward   every row: the op alone on the row's inputs; outputs match the kernel's shape
//             inference; with ONYX_OP_TABLE_DIR set, each row's model and onyx's outputs are
//             written there and tests/ops/test_forward_reference.py compares them with a float64
//             reference (onnx.reference, and NumPy for the onyx-domain ops)
//   gradient  rows with a differentiable input: the loss sum(output_k * W_k) (fixed random W_k),
//             analytic gradients from the training graph against central differences
//   bench     every row, forward (and backward for gradient rows) timed; a smoke run in CI
//   coverage  every registered kernel is some row's op or runs in a gradient row's training graph
//             (the onyx.*Grad kernels), and every gradient rule has a gradient row
//   fusion    rows with a `pattern` (the unfused subgraph a pass rewrites, built over the row's
//             inputs): the forward pipeline turns it into exactly one node of the row's op, with
//             the unfused graph's outputs and, for gradient rows, its gradients
#pragma once
#include <functional>
#include <map>
#include <optional>
#include <ostream>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "autodiff/gradient.h"
#include "onyx/tensor.h"
#include "quant/store_4bit.h"

namespace onyx::optable {

struct In {
  Shape shape;
  bool diff = true;             // differentiate with respect to this input
  float lo = -1.0f, hi = 1.0f;  // uniform range of random values (float inputs)
  float min_abs = 0.0f;         // keep |x| >= min_abs (away from kinks at 0)
  Tensor fixed;                 // when defined: this exact tensor (ints, indices, shapes, masks)
  bool absent = false;          // an absent optional input ("")
};

// A fixed tensor of any dtype from values given as doubles (ints, bools, float tensors).
inline In Vals(DType dt, Shape s, const std::vector<double>& v) {
  In i;
  i.shape = s;
  i.diff = false;
  i.fixed = Tensor(dt, s);
  ONYX_CHECK((int64_t)v.size() == i.fixed.numel(), "Vals: ", v.size(), " values for ",
             i.fixed.numel());
  auto put = [&](auto* p) {
    for (size_t k = 0; k < v.size(); k++) p[k] = (std::remove_pointer_t<decltype(p)>)v[k];
  };
  switch (dt) {
    case DType::Float32:
      put(i.fixed.data<float>());
      break;
    case DType::Float64:
      put(i.fixed.data<double>());
      break;
    case DType::Int64:
      put(i.fixed.data<int64_t>());
      break;
    case DType::Int32:
      put(i.fixed.data<int32_t>());
      break;
    case DType::Int8:
      put(i.fixed.data<int8_t>());
      break;
    case DType::UInt8:
      put(i.fixed.data<uint8_t>());
      break;
    case DType::UInt32:
      put(i.fixed.data<uint32_t>());
      break;
    case DType::Bool:
      for (size_t k = 0; k < v.size(); k++) i.fixed.data<uint8_t>()[k] = v[k] != 0;
      break;
    default:
      ONYX_CHECK(false, "Vals: dtype ", dtype_name(dt), " not handled");
  }
  return i;
}
inline In Bool(Shape s, const std::vector<double>& v) { return Vals(DType::Bool, std::move(s), v); }

inline In F(Shape s, float lo = -1, float hi = 1, float min_abs = 0) {
  In i;
  i.shape = std::move(s);
  i.lo = lo;
  i.hi = hi;
  i.min_abs = min_abs;
  return i;
}
inline In NoGrad(Shape s, float lo = -1, float hi = 1) {
  In i = F(std::move(s), lo, hi);
  i.diff = false;
  return i;
}
inline In I64(Shape s, std::vector<int64_t> v) {
  In i;
  i.shape = s;
  i.diff = false;
  i.fixed = Tensor::from_vector<int64_t>(DType::Int64, s, v);
  return i;
}
inline In Fixed(Tensor t) {
  In i;
  i.shape = t.shape();
  i.diff = false;
  i.fixed = t;
  return i;
}
// Differentiable input of distinct values at least `step` apart, in a fixed shuffled order
// (MaxPool-style ops: no two window entries within the finite-difference step of each other).
inline In Distinct(Shape s, float step = 0.05f) {
  int64_t n = shape_numel(s);
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; i++) v[i] = ((float)i - (float)n / 2) * step;
  uint64_t r = 0x9E3779B97F4A7C15ull;
  for (int64_t i = n - 1; i > 0; i--) {  // Fisher-Yates with a fixed xorshift stream
    r ^= r << 13;
    r ^= r >> 7;
    r ^= r << 17;
    std::swap(v[i], v[(int64_t)(r % (uint64_t)(i + 1))]);
  }
  In in;
  in.shape = s;
  in.fixed = Tensor::from_vector<float>(DType::Float32, s, v);
  return in;
}
inline In F32(Shape s, std::vector<float> v) {  // a fixed float tensor (scales, roi)
  In i;
  i.shape = s;
  i.diff = false;
  i.fixed = Tensor::from_vector<float>(DType::Float32, s, v);
  return i;
}
inline In Absent() {
  In i;
  i.absent = true;
  i.diff = false;
  return i;
}

// Builds the unfused form of a fused op over existing values (a row's inputs x0, x1, ...).
struct PatternBuilder {
  ir::Graph& g;
  int n = 0;
  std::string add(const std::string& op, std::vector<std::string> in,
                  std::map<std::string, ir::Attribute> attrs = {}) {
    ir::Node nd;
    nd.name = op + "_p" + std::to_string(n++);
    nd.op_type = op;
    nd.inputs = std::move(in);
    nd.outputs = {nd.name + "_out"};
    nd.attrs = std::move(attrs);
    g.nodes.push_back(nd);
    return nd.outputs[0];
  }
  std::string scalar(float v) {  // a 0-d float32 constant
    std::string name = "c" + std::to_string(n++);
    g.add_initializer(name, Tensor::scalar_f32(v));
    return name;
  }
};
// Returns the values standing for the row's outputs y0, y1, ...
using Pattern =
    std::function<std::vector<std::string>(PatternBuilder&, const std::vector<std::string>& x)>;

struct Case {
  std::string name;
  std::string op;
  std::vector<In> inputs;
  std::map<std::string, ir::Attribute> attrs = {};
  int num_outputs = 1;  // outputs created; float ones feed the loss
  std::string domain = "";
  int64_t opset = 17;
  double rtol = 2e-2, atol = 2e-3;
  float eps = 1e-2f;
  std::vector<int> loss_outputs = {};  // which outputs feed the loss (default: all float ones)
  bool nonfinite_ok = false;           // forward outputs may hold inf/NaN (Log(0), Div by 0, ...)
  Pattern pattern = {};                // fusion mode: the unfused form the pipeline fuses into op
};

// A row with its unfused form: {"Row", "Op", ...} plus the pattern a fusion pass rewrites into Op.
inline Case fused(Case c, Pattern p) {
  c.pattern = std::move(p);
  return c;
}

inline void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

// A weight (n, k) of fixed random values in bitsandbytes' 4-bit format (quant/store_4bit.h): the
// inputs of onyx.Dequantize4Bit / the weight inputs of onyx.MatMul4Bit (codes, absmax, and with
// double quantization nested_absmax and nested_quant_map, else two absent inputs) and the
// attributes that describe it.
struct Weight4Row {
  std::vector<In> inputs;
  std::map<std::string, ir::Attribute> attrs;
};
inline Weight4Row weight4(int64_t n, int64_t k, bool nested, const char* type, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0, 0.5f);
  std::vector<float> w(n * k);
  for (auto& x : w) x = d(g);
  quant::Quant4 q =
      quant::quantize_4bit(w.data(), {n, k}, quant::parse_code4(type, "row"), 64, nested, "row");
  ir::Graph graph;
  graph.add_initializer("W", Tensor::from_vector(DType::Float32, {n, k}, w));
  quant::store_initializer_4bit(graph, "W", q);
  const ir::Node& dq = graph.nodes[0];
  Weight4Row r;
  for (size_t i = 0; i < 4; i++) {
    In in;
    in.diff = false;
    if (i < dq.inputs.size()) {
      in = Fixed(graph.initializers.at(dq.inputs[i]));
    } else {
      in.absent = true;
    }
    r.inputs.push_back(in);
  }
  r.attrs = dq.attrs;
  return r;
}
inline Case dequantize4(std::string name, Weight4Row w) {
  return Case{std::move(name), "Dequantize4Bit", w.inputs, w.attrs, 1, "onyx"};
}
// onyx.MatMul4Bit(X, weight..., [bias]) with the weight's attributes and transB.
inline Case matmul4(std::string name, In x, Weight4Row w, bool transB, std::optional<In> bias,
                    const std::string& compute = "float32") {
  Case c{std::move(name), "MatMul4Bit", {std::move(x)}, w.attrs, 1, "onyx"};
  c.inputs.insert(c.inputs.end(), w.inputs.begin(), w.inputs.end());
  if (bias) c.inputs.push_back(*bias);
  c.attrs["transB"] = ir::Attribute::of_int(transB);
  c.attrs["compute_dtype"] = ir::Attribute::of_string(compute);
  return c;
}

}  // namespace onyx::optable
