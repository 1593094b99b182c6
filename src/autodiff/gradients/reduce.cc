// reduce.cc — gradient rules for reductions. The reduced axes are static (attribute, or a
// constant input at opsets 13/18), so dy is reshaped to the keepdims shape and expanded back.
#include "autodiff/gradient.h"

namespace onyx::autodiff {
namespace {

// Axes reduced by a Reduce* node, normalized; all axes when none are given (unless
// noop_with_empty_axes).
std::vector<int64_t> reduced_axes(GradContext& c, bool* noop) {
  const ir::Node& n = c.node();
  int64_t rank = (int64_t)c.meta(c.I(0)).shape.size();
  std::vector<int64_t> axes;
  // Axes are an input from opset 13 for ReduceSum and from opset 18 for the others; before
  // that an extra input is ignored, exactly as the kernels do.
  bool input_form = n.op_type == "ReduceSum" ? c.opset() >= 13 : c.opset() >= 18;
  bool from_input = input_form && c.num_inputs() > 1 && !c.I(1).empty();
  if (from_input) {
    const Tensor* t = c.constant(c.I(1));
    ONYX_CHECK(t, n.describe(), ": reduction axes must be a constant to differentiate");
    axes = t->to_int64_vector();
  } else {
    axes = n.attr_ints("axes");
  }
  *noop = axes.empty() && n.attr_int("noop_with_empty_axes", 0) != 0;
  if (axes.empty() && !*noop)
    for (int64_t i = 0; i < rank; i++) axes.push_back(i);
  for (auto& a : axes) a = a < 0 ? a + rank : a;
  std::sort(axes.begin(), axes.end());
  return axes;
}

// dy (reduced shape) -> keepdims shape, then broadcast to x's shape.
std::string expand_back(GradContext& c, const std::string& dy, const std::vector<int64_t>& axes) {
  Shape xs = c.meta(c.I(0)).shape;
  Shape kd = xs;
  for (int64_t a : axes) kd[a] = 1;
  std::string r = dy;
  if (c.meta(dy).shape != kd) r = c.emit1("Reshape", {dy, c.const_i64(kd)});
  return c.emit1("Expand", {r, c.const_i64(xs)});
}

}  // namespace

ONYX_REGISTER_GRADIENTS(reduce) {
  r.add("", "ReduceSum", [](GradContext& c) {
    bool noop;
    auto axes = reduced_axes(c, &noop);
    if (noop) return c.set(0, c.GO(0));
    c.set(0, expand_back(c, c.GO(0), axes));
  });
  r.add("", "ReduceMean", [](GradContext& c) {
    bool noop;
    auto axes = reduced_axes(c, &noop);
    if (noop) return c.set(0, c.GO(0));
    Shape xs = c.meta(c.I(0)).shape;
    int64_t count = 1;
    for (int64_t a : axes) count *= xs[a];
    std::string scaled =
        c.emit1("Mul", {c.GO(0), c.const_scalar(1.0 / (double)count, c.meta(c.GO(0)).dtype)});
    c.set(0, expand_back(c, scaled, axes));
  });
  // Max/Min: the gradient goes to the elements equal to the result, shared equally among ties.
  auto extreme = [](GradContext& c) {
    bool noop;
    auto axes = reduced_axes(c, &noop);
    if (noop) return c.set(0, c.GO(0));
    std::string y = expand_back(c, c.O(0), axes);
    DType dt = c.meta(c.I(0)).dtype;
    std::string hit =
        c.emit1("Cast", {c.emit1("Equal", {c.I(0), y})}, {{"to", attr_i((int64_t)dt)}});
    std::string count =
        c.opset() >= 13
            ? c.emit1("ReduceSum", {hit, c.const_i64(axes)}, {{"keepdims", attr_i(1)}})
            : c.emit1("ReduceSum", {hit}, {{"keepdims", attr_i(1)}, {"axes", attr_ints(axes)}});
    std::string dy = expand_back(c, c.GO(0), axes);
    c.set(0, c.emit1("Div", {c.emit1("Mul", {dy, hit}), count}));
  };
  r.add("", "ReduceMax", extreme);
  r.add("", "ReduceMin", extreme);
}

}  // namespace onyx::autodiff
