// nn.cc — gradient rules for Softmax, LogSoftmax, LayerNormalization, onyx.RMSNorm, Dropout,
// BatchNormalization, SoftmaxCrossEntropyLoss and NegativeLogLikelihoodLoss. Each rule emits one
// fused "onyx"-domain kernel (in kernels/softmax, norm, dropout and loss: next to the forward)
// and reuses what the forward saved: softmax outputs, LayerNorm's Mean/InvStdDev, RMSNorm's inverse
// RMS, Dropout's mask (optional forward outputs requested with ensure_output). Note: rules copy
// value names into locals; references into the node (c.I, c.node()) do not survive emitting, which
// may grow the node list.
#include "autodiff/gradient.h"

namespace onyx::autodiff {
namespace {

// Softmax / LogSoftmax attributes for the grad kernel: opset >= 13 reduces over one axis; opsets
// < 13 coerce the input to 2-D at `axis` (default 1) and reduce over every axis from there on.
std::map<std::string, ir::Attribute> softmax_grad_attrs(GradContext& c) {
  if (c.opset() >= 13) return {{"axis", attr_i(c.node().attr_int("axis", -1))}};
  return {{"axis", attr_i(c.node().attr_int("axis", 1))}, {"flatten", attr_i(1)}};
}

template <bool LOG>
void softmax_rule(GradContext& c) {
  std::string dy = c.GO(0);
  if (dy.empty() || !c.needs(0)) return;
  std::string y = c.O(0);
  auto attrs = softmax_grad_attrs(c);
  c.set(0, c.emit1(LOG ? "LogSoftmaxGrad" : "SoftmaxGrad", {dy, y}, attrs, "onyx"));
}

std::string cast_to(GradContext& c, const std::string& v, DType dt) {
  if (c.meta(v).dtype == dt) return v;
  return c.emit1("Cast", {v}, {{"to", attr_i((int64_t)dt)}});
}

// y = (x - mean) * inv * scale + bias over axes [axis, rank).
void layer_norm_rule(GradContext& c) {
  std::string x = c.I(0), scale = c.I(1);
  bool has_bias = c.num_inputs() > 2 && !c.I(2).empty();
  const Shape xs = c.meta(x).shape;
  const DType xt = c.meta(x).dtype;
  int64_t rank = (int64_t)xs.size();
  int64_t axis = c.node().attr_int("axis", -1);
  ONYX_CHECK(axis >= -rank && axis < rank, c.node().describe(), ": axis ", axis,
             " is out of range for rank ", rank);
  if (axis < 0) axis += rank;
  int64_t cols = 1;
  for (int64_t i = axis; i < rank; i++) cols *= xs[i];
  std::string dy = c.GO(0), dmean = c.GO(1), dinv = c.GO(2);
  std::string mean = c.ensure_output(1), inv = c.ensure_output(2);
  if (!dy.empty() && (c.needs(0) || c.needs(1) || (has_bias && c.needs(2)))) {
    auto g =
        c.emit("LayerNormGrad", {dy, x, scale, mean, inv}, {{"axis", attr_i(axis)}}, "onyx", 3);
    c.set(0, g[0]);
    c.set(1, g[1]);
    if (has_bias) c.set(2, g[2]);
  }
  // Mean and InvStdDev used downstream: d mean / dx = 1/cols,
  // d inv / dx = -inv^3 (x - mean) / cols.
  if (!c.needs(0)) return;
  if (!dmean.empty()) {
    std::string t =
        c.emit1("Mul", {dmean, c.const_scalar(1.0 / (double)cols, c.meta(dmean).dtype)});
    c.set(0, c.emit1("Expand", {cast_to(c, t, xt), c.const_i64(xs)}));
  }
  if (!dinv.empty()) {
    DType st = c.meta(dinv).dtype;
    std::string inv3 = c.emit1("Mul", {c.emit1("Mul", {inv, inv}), inv});
    std::string k = c.emit1("Mul", {c.emit1("Mul", {dinv, cast_to(c, inv3, st)}),
                                    c.const_scalar(-1.0 / (double)cols, st)});
    std::string centered = c.emit1("Sub", {x, cast_to(c, mean, xt)});
    c.set(0, c.emit1("Mul", {centered, cast_to(c, k, xt)}));
  }
}

// onyx.RMSNorm (rms_norm_fusion): y = x * inv * scale over the last axis, inv = 1 / RMS(x), which
// the forward saves as output 1 for RMSNormGrad. The fusion never exposes that output to other
// nodes, so a gradient flowing into it is refused rather than half-handled.
void rms_norm_rule(GradContext& c) {
  std::string x = c.I(0), scale = c.I(1);
  ONYX_CHECK(!c.meta(x).shape.empty(), c.node().describe(), ": x must have at least one axis");
  if (!c.GO(1).empty())
    ONYX_UNSUPPORTED(c.node().describe(), ": a gradient into inv_rms (output 1) is not supported");
  std::string dy = c.GO(0);
  if (dy.empty() || (!c.needs(0) && !c.needs(1))) return;
  std::string inv = c.ensure_output(1);
  auto g = c.emit("RMSNormGrad", {dy, x, scale, inv}, {}, "onyx", 2);
  c.set(0, g[0]);
  c.set(1, g[1]);
}

// Dropout: the identity unless training_mode (opset >= 12 input 2) is on and ratio != 0; then
// dx = dy * mask / (1 - ratio) with the mask the forward drew. A training_mode or ratio that is not
// known at build time is passed to the kernel, which decides at run time.
void dropout_rule(GradContext& c) {
  std::string dy = c.GO(0);
  if (dy.empty() || !c.needs(0)) return;
  if (c.opset() < 12) return c.set(0, dy);  // opsets < 12: the forward runs as the identity
  std::string ratio = c.num_inputs() > 1 ? c.I(1) : "";
  std::string training = c.num_inputs() > 2 ? c.I(2) : "";
  if (training.empty()) return c.set(0, dy);
  const Tensor* tv = c.constant(training);
  if (tv && tv->numel() == 1 && tv->get_as_double(0) == 0) return c.set(0, dy);
  if (!ratio.empty()) {
    const Tensor* rv = c.constant(ratio);
    if (rv && rv->numel() == 1 && rv->get_as_double(0) == 0) return c.set(0, dy);
  }
  std::string mask = c.ensure_output(1);
  std::vector<std::string> in{dy, mask, ratio};
  if (!tv)
    in.push_back(training);
  else if (ratio.empty())
    in.pop_back();
  c.set(0, c.emit1("DropoutGrad", in, {}, "onyx"));
}

// reduction and ignore_index, copied to the grad kernel.
std::map<std::string, ir::Attribute> loss_attrs(GradContext& c) {
  std::map<std::string, ir::Attribute> a;
  a["reduction"] = attr_s(c.node().attr_string("reduction", "mean"));
  if (c.node().has_attr("ignore_index"))
    a["ignore_index"] = attr_i(c.node().attr_int("ignore_index", 0));
  return a;
}

// Class weights get no gradient (they are constants in practice); labels are integers.
void sce_rule(GradContext& c) {
  if (!c.needs(0)) return;
  std::string logits = c.I(0), labels = c.I(1);
  std::string weights = c.num_inputs() > 2 ? c.I(2) : "";
  std::string dloss = c.GO(0), dlp = c.GO(1);
  // Use log_prob when the forward already produces it; else recompute softmax from the logits
  // (saves materializing a tokens x classes buffer in the forward).
  bool have_lp = c.num_outputs() > 1 && !c.O(1).empty();
  std::string log_prob = have_lp ? c.O(1) : "";
  if (!dloss.empty()) {
    auto attrs = loss_attrs(c);
    attrs["log_prob"] = attr_i(have_lp ? 1 : 0);
    std::vector<std::string> in{dloss, have_lp ? log_prob : logits, labels};
    if (!weights.empty()) in.push_back(weights);
    c.set(0, c.emit1("SoftmaxCrossEntropyLossGrad", in, attrs, "onyx"));
  }
  if (!dlp.empty())  // log_prob used downstream: log-softmax over the class axis
    c.set(0, c.emit1("LogSoftmaxGrad", {dlp, log_prob}, {{"axis", attr_i(1)}}, "onyx"));
}

void nll_rule(GradContext& c) {
  std::string dloss = c.GO(0);
  if (dloss.empty() || !c.needs(0)) return;
  std::string x = c.I(0), labels = c.I(1);
  std::string weights = c.num_inputs() > 2 ? c.I(2) : "";
  auto attrs = loss_attrs(c);
  attrs["input_shape"] = attr_ints(c.meta(x).shape);
  std::vector<std::string> in{dloss, labels};
  if (!weights.empty()) in.push_back(weights);
  c.set(0, c.emit1("NLLLossGrad", in, attrs, "onyx"));
}

// BatchNormalization: training mode (opset >= 14, training_mode=1) normalizes with the batch
// statistics, which the kernel recomputes; otherwise with the running mean/var inputs. The running
// statistics (inputs 3, 4 and outputs 1, 2) get no gradient.
void batch_norm_rule(GradContext& c) {
  std::string dy = c.GO(0);
  if (dy.empty()) return;
  if (!c.needs(0) && !c.needs(1) && !c.needs(2)) return;
  bool training = c.opset() >= 14 && c.node().attr_int("training_mode", 0) != 0;
  std::string x = c.I(0), scale = c.I(1), mean = c.I(3), var = c.I(4);
  auto g = c.emit("BatchNormGrad", {dy, x, scale, mean, var},
                  {{"epsilon", attr_f(c.node().attr_float("epsilon", 1e-5f))},
                   {"training_mode", attr_i(training ? 1 : 0)}},
                  "onyx", 3);
  c.set(0, g[0]);
  c.set(1, g[1]);
  c.set(2, g[2]);
}

}  // namespace

ONYX_REGISTER_GRADIENTS(nn) {
  r.add("", "Softmax", softmax_rule<false>);
  r.add("", "LogSoftmax", softmax_rule<true>);
  r.add("", "LayerNormalization", layer_norm_rule);
  r.add("onyx", "LayerNormalization", layer_norm_rule);  // layer_norm_fusion's, below opset 17
  r.add("onyx", "RMSNorm", rms_norm_rule);               // rms_norm_fusion's
  r.add("", "Dropout", dropout_rule);
  r.add("", "SoftmaxCrossEntropyLoss", sce_rule);
  r.add("", "NegativeLogLikelihoodLoss", nll_rule);
  r.add("", "BatchNormalization", batch_norm_rule);
}

}  // namespace onyx::autodiff
