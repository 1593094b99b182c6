// nn_spatial.cc — gradient rules for the image ops:
//   MaxPool, GlobalMaxPool   → onyx MaxPoolGrad(dY, X): dY added at each window's argmax,
//                              recomputed from X with the forward's attributes (no Indices kept)
//   AveragePool              → onyx AveragePoolGrad(dY): dY / divisor spread over each window
//   GlobalAveragePool        → Expand(dY / spatial size) (existing ops)
//   Resize                   → onyx ResizeGrad(dY, roi, scales, sizes): the transposed per-axis
//                              interpolation maps (every mode the forward kernel runs)
//   GroupNormalization       → onyx GroupNormGrad(dY, X, scale) -> dX, dscale, dbias
//   InstanceNormalization    → the same kernel with num_groups = C, per-channel scale
//   ConvTranspose            → dX = Conv(dY, W) and dW = onyx ConvGradWeight(X, dY) (the
//                              transposed convolution is Conv's input gradient, so its gradients
//                              are Conv and Conv's weight gradient with the roles swapped); dB =
//                              ReduceSum(dY) over N and the spatial dims
//   Pad                      → onyx PadGrad(dY) for every mode (constant, reflect, edge, wrap):
//                              dX gathers the dY positions that copied it
// BatchNormalization (training and inference mode) is in nn.cc. Integer inputs (Indices, roi,
// scales, sizes, pads, axes) get no gradient; Pad's constant_value gets none either.
#include <algorithm>

#include "autodiff/gradient.h"

namespace onyx::autodiff {
namespace {

std::vector<int64_t> const_ints(GradContext& c, int i, const char* what) {
  const Tensor* t = c.constant(c.I(i));
  ONYX_CHECK(t, c.node().describe(), ": ", what, " must be a constant to differentiate");
  return t->to_int64_vector();
}

bool has_in(GradContext& c, int i) { return c.num_inputs() > i && !c.I(i).empty(); }

// Max pooling: the grad kernel recomputes the window argmax from X.
void max_pool_rule(GradContext& c, bool global) {
  std::string dy = c.GO(0);
  if (dy.empty() || !c.needs(0)) return;
  auto attrs = c.node().attrs;
  attrs.erase("storage_order");
  if (global) attrs["global"] = attr_i(1);
  std::string x = c.I(0);
  c.set(0, c.emit1("MaxPoolGrad", {dy, x}, attrs, "onyx"));
}

void average_pool_rule(GradContext& c) {
  std::string dy = c.GO(0);
  if (dy.empty() || !c.needs(0)) return;
  auto attrs = c.node().attrs;
  attrs["input_shape"] = attr_ints(c.meta(c.I(0)).shape);
  c.set(0, c.emit1("AveragePoolGrad", {dy}, attrs, "onyx"));
}

// y = mean over the spatial dims (keepdims): dx = dy / S broadcast back.
void global_average_pool_rule(GradContext& c) {
  std::string dy = c.GO(0);
  if (dy.empty() || !c.needs(0)) return;
  const Shape x = c.meta(c.I(0)).shape;
  int64_t S = 1;
  for (size_t i = 2; i < x.size(); i++) S *= x[i];
  std::string g =
      c.emit1("Mul", {dy, c.const_scalar(1.0 / (double)std::max<int64_t>(1, S), c.meta(dy).dtype)});
  c.set(0, c.emit1("Expand", {g, c.const_i64(x)}));
}

void resize_rule(GradContext& c) {
  std::string dy = c.GO(0);
  if (dy.empty() || !c.needs(0)) return;
  ONYX_CHECK(c.opset() >= 11, c.node().describe(), ": the gradient of Resize needs opset >= 11");
  auto attrs = c.node().attrs;
  attrs["input_shape"] = attr_ints(c.meta(c.I(0)).shape);
  attrs["resize_opset"] = attr_i(c.opset());
  std::vector<std::string> in{dy};
  for (int i = 1; i < 4; i++) in.push_back(has_in(c, i) ? c.I(i) : "");
  while (in.back().empty()) in.pop_back();
  c.set(0, c.emit1("ResizeGrad", in, attrs, "onyx"));
}

void group_norm_grads(GradContext& c, int64_t groups, bool per_channel) {
  std::string dy = c.GO(0);
  if (dy.empty() || (!c.needs(0) && !c.needs(1) && !c.needs(2))) return;
  std::string x = c.I(0), scale = c.I(1);
  auto g = c.emit("GroupNormGrad", {dy, x, scale},
                  {{"num_groups", attr_i(groups)},
                   {"epsilon", attr_f(c.node().attr_float("epsilon", 1e-5f))},
                   {"per_channel", attr_i(per_channel ? 1 : 0)}},
                  "onyx", 3);
  c.set(0, g[0]);
  c.set(1, g[1]);
  c.set(2, g[2]);
}

// Opset 18: scale and bias per group; opset 21: per channel.
void group_norm_rule(GradContext& c) {
  group_norm_grads(c, c.node().attr_int_required("num_groups"), c.opset() >= 21);
}

void instance_norm_rule(GradContext& c) {
  const Shape x = c.meta(c.I(0)).shape;
  ONYX_CHECK(x.size() >= 2, c.node().describe(), ": input must have rank >= 2");
  group_norm_grads(c, x[1], true);
}

// ConvTranspose Y = convT(X, W) is Conv's input gradient: for the Conv that maps Y-shaped
// tensors to X-shaped ones with weight W (C_in, M/group, k...), <convT(X, W), G> =
// <X, Conv(G, W)>. So dX = Conv(dY, W) and dW = ConvGradWeight(X, dY) of that Conv, with pads
// (pb, st·(in−1) + (k−1)·dil + 1 − out − pb) per dim; output positions no input reaches
// (output_padding, output_shape) are cropped from dY first.
void conv_transpose_rule(GradContext& c) {
  std::string dy = c.GO(0);
  if (dy.empty() || (!c.needs(0) && !c.needs(1) && !(has_in(c, 2) && c.needs(2)))) return;
  const ir::Node& n = c.node();
  std::string X = c.I(0), W = c.I(1);
  const Shape x = c.meta(X).shape, w = c.meta(W).shape, y = c.meta(c.O(0)).shape;
  int nsp = (int)x.size() - 2;
  auto st = n.attr_ints("strides", std::vector<int64_t>(nsp, 1));
  auto dl = n.attr_ints("dilations", std::vector<int64_t>(nsp, 1));
  auto op = n.attr_ints("output_padding", std::vector<int64_t>(nsp, 0));
  int64_t group = n.attr_int("group", 1);
  std::string auto_pad = n.attr_string("auto_pad", "NOTSET");
  bool same = auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER";
  std::vector<int64_t> pads = n.attr_ints("pads");
  std::vector<int64_t> pb(nsp), pe(nsp);
  for (int s = 0; s < nsp; s++) {
    int64_t ek = (w[2 + s] - 1) * dl[s] + 1;
    int64_t natural = st[s] * (x[2 + s] - 1) + op[s] + ek;
    int64_t out = y[2 + s];
    if (pads.empty() && same) {
      int64_t total = natural - out;
      int64_t half = total >= 0 ? total / 2 : -((-total + 1) / 2);  // Python's //
      pb[s] = auto_pad == "SAME_UPPER" ? half : total - half;
    } else {
      pb[s] = !pads.empty() && auto_pad != "VALID" ? pads[s] : 0;
    }
    pe[s] = st[s] * (x[2 + s] - 1) + ek - out - pb[s];
  }
  // Crop dY where the conv would need negative pads (output positions no input reaches).
  std::vector<int64_t> starts, ends, axes;
  for (int s = 0; s < nsp; s++) {
    if (pb[s] >= 0 && pe[s] >= 0) continue;
    int64_t b = std::max<int64_t>(0, -pb[s]), e = y[2 + s] - std::max<int64_t>(0, -pe[s]);
    starts.push_back(b);
    ends.push_back(e);
    axes.push_back(2 + s);
    pb[s] = std::max<int64_t>(0, pb[s]);
    pe[s] = std::max<int64_t>(0, pe[s]);
  }
  std::string g = dy;
  if (!axes.empty()) {
    if (c.opset() >= 10)
      g = c.emit1("Slice", {dy, c.const_i64(starts), c.const_i64(ends), c.const_i64(axes)});
    else
      g = c.emit1(
          "Slice", {dy},
          {{"starts", attr_ints(starts)}, {"ends", attr_ints(ends)}, {"axes", attr_ints(axes)}});
  }
  std::vector<int64_t> conv_pads(pb);
  conv_pads.insert(conv_pads.end(), pe.begin(), pe.end());
  std::map<std::string, ir::Attribute> at{
      {"strides", attr_ints(st)},
      {"dilations", attr_ints(dl)},
      {"pads", attr_ints(conv_pads)},
      {"group", attr_i(group)},
      {"kernel_shape", attr_ints(Shape(w.begin() + 2, w.end()))}};
  if (c.needs(0)) c.set(0, c.emit1("Conv", {g, W}, at));
  if (c.needs(1)) c.set(1, c.emit1("ConvGradWeight", {X, g}, at, "onyx"));
  if (has_in(c, 2) && c.needs(2)) {
    std::vector<int64_t> red{0};
    for (int s = 0; s < nsp; s++) red.push_back(2 + s);
    c.set(2, c.reduce_sum(dy, red, false));
  }
}

// Pad: the begin/end pads of every dim (pads attribute before opset 11, else the constant pads
// input, over the axes input at opset >= 18).
void pad_rule(GradContext& c) {
  std::string dy = c.GO(0);
  if (dy.empty() || !c.needs(0)) return;
  const Shape x = c.meta(c.I(0)).shape;
  int64_t r = (int64_t)x.size();
  std::string mode = c.node().attr_string("mode", "constant");
  std::vector<int64_t> pads =
      c.opset() < 11 ? c.node().attr_ints_required("pads") : const_ints(c, 1, "Pad pads");
  std::vector<int64_t> axes;
  if (c.opset() >= 18 && has_in(c, 3)) {
    axes = const_ints(c, 3, "Pad axes");
  } else {
    for (int64_t i = 0; i < r; i++) axes.push_back(i);
  }
  ONYX_CHECK(pads.size() == 2 * axes.size(), c.node().describe(), ": pads ", shape_str(pads),
             " do not fit axes ", shape_str(axes));
  std::vector<int64_t> full(2 * r, 0);
  for (size_t i = 0; i < axes.size(); i++) {
    int64_t a = axes[i] < 0 ? axes[i] + r : axes[i];
    full[a] = pads[i];
    full[a + r] = pads[i + axes.size()];
  }
  if (std::all_of(full.begin(), full.end(), [](int64_t v) { return v == 0; })) return c.set(0, dy);
  c.set(0,
        c.emit1("PadGrad", {dy},
                {{"mode", attr_s(mode)}, {"pads", attr_ints(full)}, {"input_shape", attr_ints(x)}},
                "onyx"));
}

}  // namespace

ONYX_REGISTER_GRADIENTS(nn_spatial) {
  r.add("", "MaxPool", [](GradContext& c) { max_pool_rule(c, false); });
  r.add("", "GlobalMaxPool", [](GradContext& c) { max_pool_rule(c, true); });
  r.add("", "AveragePool", average_pool_rule);
  r.add("", "GlobalAveragePool", global_average_pool_rule);
  r.add("", "Resize", resize_rule);
  r.add("", "GroupNormalization", group_norm_rule);
  r.add("", "InstanceNormalization", instance_norm_rule);
  r.add("", "ConvTranspose", conv_transpose_rule);
  r.add("", "Pad", pad_rule);
}

}  // namespace onyx::autodiff
