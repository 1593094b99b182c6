// shape.cc — gradient rules for data-movement ops. Integer inputs (shapes, indices, axes,
// repeats) get no gradient; their values must be known at build time where the rule needs them
// (Slice starts/ends/axes/steps, Tile repeats, Split sizes come from the static output shapes).
//   Reshape Flatten Squeeze Unsqueeze → Reshape dy back        Transpose → inverse permutation
//   Expand → reduced over broadcast dims (GradContext::set)    Concat → Slice of dy per input
//   Split → Concat of the output grads (zeros where absent)    Slice → onyx SliceGrad (scatter)
//   Gather → onyx GatherGrad (scatter-add: the embedding backward)
//   GatherElements → onyx GatherElementsGrad                   Tile → Reshape + ReduceSum
//   GatherND → ScatterND(zeros, indices, dy, reduction=add) (batch_dims: batch coordinates
//              prepended to the indices)
//   ScatterElements / Scatter / ScatterND, reduction none: data gets dy with the scattered
//              positions zeroed (the same scatter of zeros into dy), updates get the gather of dy
//              at the indices (GatherElements / GatherND); reduction add: data gets dy, updates
//              the same gather. With repeated indices and reduction none, every duplicate gets
//              the gather (as PyTorch's scatter backward), not only the one written last.
//              Reductions mul / max / min are refused.
//   Einsum → Einsum of dy with the other operands (gradients/einsum.cc)
#include <algorithm>

#include "autodiff/gradient.h"

namespace onyx::autodiff {
namespace {

std::string zeros(GradContext& c, DType dt, const Shape& shape) {
  return c.emit1("Expand", {c.const_scalar(0.0, dt), c.const_i64(shape)});
}

std::vector<int64_t> const_ints(GradContext& c, int i, const char* what) {
  const Tensor* t = c.constant(c.I(i));
  ONYX_CHECK(t, c.node().describe(), ": ", what, " must be a constant to differentiate");
  return t->to_int64_vector();
}

// Reshape-like: the gradient is dy with x's shape.
void reshape_rule(GradContext& c) { c.set(0, c.reshape(c.GO(0), c.meta(c.I(0)).shape)); }

void transpose_rule(GradContext& c) {
  int64_t r = (int64_t)c.meta(c.I(0)).shape.size();
  std::vector<int64_t> perm = c.node().attr_ints("perm");
  if (perm.empty())
    for (int64_t i = 0; i < r; i++) perm.push_back(r - 1 - i);
  std::vector<int64_t> inv(r);
  for (int64_t i = 0; i < r; i++) inv[perm[i] < 0 ? perm[i] + r : perm[i]] = i;
  c.set(0, c.emit1("Transpose", {c.GO(0)}, {{"perm", attr_ints(inv)}}));
}

void concat_rule(GradContext& c) {
  const Shape y = c.meta(c.O(0)).shape;
  int64_t r = (int64_t)y.size();
  int64_t axis = c.node().attr_int("axis", 0);
  if (axis < 0) axis += r;
  int64_t off = 0;
  for (int i = 0; i < c.num_inputs(); i++) {
    if (c.I(i).empty()) continue;
    int64_t len = c.meta(c.I(i)).shape[axis];
    if (c.needs(i)) {
      if (len == y[axis]) {
        c.set(i, c.GO(0));
      } else {
        c.set(i, c.emit1("Slice", {c.GO(0), c.const_i64({off}), c.const_i64({off + len}),
                                   c.const_i64({axis})}));
      }
    }
    off += len;
  }
}

void split_rule(GradContext& c) {
  const Shape x = c.meta(c.I(0)).shape;
  int64_t r = (int64_t)x.size();
  int64_t axis = c.node().attr_int("axis", 0);
  if (axis < 0) axis += r;
  DType dt = c.meta(c.I(0)).dtype;
  std::vector<std::string> parts;
  for (int o = 0; o < c.num_outputs(); o++) {
    std::string g = c.GO(o);
    if (g.empty()) g = zeros(c, dt, c.meta(c.ensure_output(o)).shape);
    parts.push_back(g);
  }
  if (parts.size() == 1) return c.set(0, parts[0]);
  c.set(0, c.emit1("Concat", parts, {{"axis", attr_i(axis)}}));
}

// Slice: resolves starts/ends/axes/steps (ONNX clamping rules) to a start and step per dim.
void slice_rule(GradContext& c) {
  const ir::Node& n = c.node();
  const Shape x = c.meta(c.I(0)).shape;
  const Shape y = c.meta(c.O(0)).shape;
  int64_t r = (int64_t)x.size();
  std::vector<int64_t> starts, ends, axes, steps;
  if (c.opset() < 10) {
    starts = n.attr_ints("starts");
    ends = n.attr_ints("ends");
    axes = n.attr_ints("axes");
  } else {
    starts = const_ints(c, 1, "Slice starts");
    ends = const_ints(c, 2, "Slice ends");
    if (c.num_inputs() > 3 && !c.I(3).empty()) axes = const_ints(c, 3, "Slice axes");
    if (c.num_inputs() > 4 && !c.I(4).empty()) steps = const_ints(c, 4, "Slice steps");
  }
  if (axes.empty())
    for (size_t i = 0; i < starts.size(); i++) axes.push_back((int64_t)i);
  if (steps.empty()) steps.assign(starts.size(), 1);
  std::vector<int64_t> st(r, 0), sp(r, 1);
  for (size_t i = 0; i < starts.size(); i++) {
    int64_t ax = axes[i] < 0 ? axes[i] + r : axes[i];
    int64_t dim = x[ax], s = starts[i], step = steps[i];
    if (s < 0) s += dim;
    if (dim == 0)
      s = 0;
    else if (step > 0)
      s = std::clamp<int64_t>(s, 0, dim);
    else
      s = std::clamp<int64_t>(s, 0, dim - 1);
    st[ax] = y[ax] > 0 ? s : 0;
    sp[ax] = step;
  }
  bool identity = x == y;
  for (int64_t d = 0; d < r; d++) identity = identity && sp[d] == 1 && st[d] == 0;
  if (identity) return c.set(0, c.GO(0));
  c.set(0, c.emit1("SliceGrad", {c.GO(0)},
                   {{"shape", attr_ints(x)}, {"starts", attr_ints(st)}, {"steps", attr_ints(sp)}},
                   "onyx"));
}

void gather_rule(GradContext& c) {
  const Shape x = c.meta(c.I(0)).shape;
  int64_t axis = c.node().attr_int("axis", 0);
  if (axis < 0) axis += (int64_t)x.size();
  c.set(0, c.emit1("GatherGrad", {c.GO(0), c.I(1)},
                   {{"axis", attr_i(axis)}, {"shape", attr_ints(x)}}, "onyx"));
}

void gather_elements_rule(GradContext& c) {
  const Shape x = c.meta(c.I(0)).shape;
  int64_t axis = c.node().attr_int("axis", 0);
  if (axis < 0) axis += (int64_t)x.size();
  c.set(0, c.emit1("GatherElementsGrad", {c.GO(0), c.I(1)},
                   {{"axis", attr_i(axis)}, {"shape", attr_ints(x)}}, "onyx"));
}

// y = tile(x, rep): dy viewed as (rep0, d0, rep1, d1, ...) summed over the rep axes.
void tile_rule(GradContext& c) {
  const Shape x = c.meta(c.I(0)).shape;
  std::vector<int64_t> rep = const_ints(c, 1, "Tile repeats");
  Shape view;
  std::vector<int64_t> axes;
  for (size_t i = 0; i < x.size(); i++) {
    if (rep[i] != 1) {
      axes.push_back((int64_t)view.size());
      view.push_back(rep[i]);
    }
    view.push_back(x[i]);
  }
  if (axes.empty()) return c.set(0, c.GO(0));
  std::string g = c.reduce_sum(c.reshape(c.GO(0), view), axes, false);
  c.set(0, c.reshape(g, x));
}

// y = GatherND(x, idx, batch_dims=b): dx = scatter-add of dy at the gathered positions. ScatterND
// has no batch_dims, so for b > 0 each index row gets its b batch coordinates prepended.
void gathernd_rule(GradContext& c) {
  const Shape x = c.meta(c.I(0)).shape;
  const Shape is = c.meta(c.I(1)).shape;
  const std::string dy = c.GO(0);
  std::string idx = c.I(1);
  const int64_t b = c.node().attr_int("batch_dims", 0);
  if (b > 0) {
    Shape rows(is.begin(), is.end() - 1);  // index rows: (batch..., rest...)
    int64_t nrows = 1, nbatch = 1;
    for (int64_t d : rows) nrows *= d;
    for (int64_t d = 0; d < b; d++) nbatch *= is[d];
    const int64_t per_batch = nrows ? nrows / nbatch : 0;
    std::vector<int64_t> coords;
    coords.reserve(nrows * b);
    for (int64_t r = 0; r < nrows; r++) {
      int64_t bi = r / per_batch;  // flat batch index, split into its b coordinates
      std::vector<int64_t> bc(b);
      for (int64_t d = b - 1; d >= 0; d--) {
        bc[d] = bi % is[d];
        bi /= is[d];
      }
      coords.insert(coords.end(), bc.begin(), bc.end());
    }
    Shape cs = rows;
    cs.push_back(b);
    idx = c.emit1("Concat", {c.reshape(c.const_i64(coords), cs), idx}, {{"axis", attr_i(-1)}});
  }
  std::string z = zeros(c, c.meta(c.I(0)).dtype, x);
  c.set(0, c.emit1("ScatterND", {z, idx, dy}, {{"reduction", attr_s("add")}}));
}

// ScatterElements(x, idx, upd, axis, reduction) / Scatter (opset < 11) / ScatterND(x, idx, upd,
// reduction).
void scatter_rule(GradContext& c, bool nd) {
  const std::string x = c.I(0), idx = c.I(1), upd = c.I(2), dy = c.GO(0);
  const std::string red = c.node().attr_string("reduction", "none");
  ONYX_CHECK(red == "none" || red == "add", c.node().describe(), ": no gradient for ",
             c.node().op_type, " with reduction '", red, "' (only 'none' and 'add')");
  std::map<std::string, ir::Attribute> axis;
  if (!nd) {
    int64_t a = c.node().attr_int("axis", 0);
    if (a < 0) a += (int64_t)c.meta(x).shape.size();
    axis["axis"] = attr_i(a);
  }
  if (c.needs(0)) {
    if (red == "add") {
      c.set(0, dy);
    } else {
      std::string z = zeros(c, c.meta(upd).dtype, c.meta(upd).shape);
      c.set(0, c.emit1(nd ? "ScatterND" : "ScatterElements", {dy, idx, z}, axis));
    }
  }
  if (c.needs(2)) c.set(2, c.emit1(nd ? "GatherND" : "GatherElements", {dy, idx}, axis));
}

}  // namespace

ONYX_REGISTER_GRADIENTS(shape) {
  r.add("", "Reshape", reshape_rule);
  r.add("", "Flatten", reshape_rule);
  r.add("", "Squeeze", reshape_rule);
  r.add("", "Unsqueeze", reshape_rule);
  r.add("", "Transpose", transpose_rule);
  r.add("", "Expand", [](GradContext& c) { c.set(0, c.GO(0)); });
  r.add("", "Concat", concat_rule);
  r.add("", "Split", split_rule);
  r.add("", "Slice", slice_rule);
  r.add("", "Gather", gather_rule);
  r.add("", "GatherElements", gather_elements_rule);
  r.add("", "Tile", tile_rule);
  r.add("", "GatherND", gathernd_rule);
  r.add("", "ScatterElements", [](GradContext& c) { scatter_rule(c, false); });
  r.add("", "Scatter", [](GradContext& c) { scatter_rule(c, false); });
  r.add("", "ScatterND", [](GradContext& c) { scatter_rule(c, true); });
}

}  // namespace onyx::autodiff
