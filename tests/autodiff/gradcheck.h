// gradcheck.h — finite-difference gradient checking of one op at a time, ggml test-backend-ops
// style: a table of cases (gradcheck_*.inc), each built into a one-node model whose loss is
// sum(output_k * W_k) with fixed random W_k; analytic gradients from the training graph are compared
// with central differences of the loss.
#pragma once
#include <functional>
#include <ostream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "autodiff/gradient.h"
#include "onyx/tensor.h"

namespace onyx::gradcheck {

struct In {
  Shape shape;
  bool diff = true;            // differentiate with respect to this input
  float lo = -1.0f, hi = 1.0f;  // uniform range of random values (float inputs)
  float min_abs = 0.0f;        // keep |x| >= min_abs (away from kinks at 0)
  Tensor fixed;                // when defined: this exact tensor (ints, indices, shapes, masks)
  bool absent = false;         // an absent optional input ("")
};

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

struct Case {
  std::string name;
  std::string op;
  std::vector<In> inputs;
  std::map<std::string, ir::Attribute> attrs = {};
  int num_outputs = 1;      // outputs created; float ones feed the loss
  std::string domain = "";
  int64_t opset = 17;
  double rtol = 2e-2, atol = 2e-3;
  float eps = 1e-2f;
  std::vector<int> loss_outputs = {};  // which outputs feed the loss (default: all float ones)
};

inline void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

}  // namespace onyx::gradcheck
