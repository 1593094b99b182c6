// dropout_add.cc — gradient rule for onyx.DropoutAdd (passes/dropout_add_fusion.cc forms it from
// Add(Dropout(y, ratio, training_mode), residual); kernels/dropout/dropout_add.cc runs it).
// Hand-written like every rule here. out = Dropout(y) + residual, so
//   dresidual = dout                                  (same shape: no reduction)
//   dy        = onyx.DropoutGrad(dout, mask, ratio, training_mode)
// with the mask the forward drew (DropoutAdd's optional second output, requested here): exactly
// the nodes the unfused Add and Dropout rules emit, so fused and unfused backward are the same.
#include "autodiff/gradient.h"

namespace onyx::autodiff {
namespace {

void dropout_add_rule(GradContext& c) {
  std::string dout = c.GO(0);
  if (dout.empty()) return;
  if (c.needs(1)) c.set(1, dout);
  if (!c.needs(0)) return;
  // Copies: references into the node do not survive emitting.
  std::string ratio = c.num_inputs() > 2 ? c.I(2) : "";
  std::string training = c.num_inputs() > 3 ? c.I(3) : "";
  // Inert forward (no training_mode, or a constant false one, or a constant zero ratio): identity.
  if (training.empty()) return c.set(0, dout);
  const Tensor* tv = c.constant(training);
  if (tv && tv->numel() == 1 && tv->get_as_double(0) == 0) return c.set(0, dout);
  if (!ratio.empty()) {
    const Tensor* rv = c.constant(ratio);
    if (rv && rv->numel() == 1 && rv->get_as_double(0) == 0) return c.set(0, dout);
  }
  std::string mask = c.ensure_output(1);
  c.set(0, c.emit1("DropoutGrad", {dout, mask, ratio, training}, {}, "onyx"));
}

}  // namespace

ONYX_REGISTER_GRADIENTS(dropout_add) { r.add("onyx", "DropoutAdd", dropout_add_rule); }

}  // namespace onyx::autodiff
