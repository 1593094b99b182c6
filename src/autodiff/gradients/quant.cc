// quant.cc — gradient rules for bitsandbytes' 4-bit weights (kernels/quant/matmul_4bit.cc). The
// weights are frozen (QLoRA trains adapters beside them): only the activations get gradients.
//   MatMul4Bit:  Y = X · op(W) + b   dX = onyx.MatMul4Bit(dY, W..., transB flipped)   db = ΣdY
//   Dequantize4Bit has no rule: its inputs are the frozen codes and scales
#include "autodiff/gradient.h"

namespace onyx::autodiff {
namespace {

void matmul_4bit_rule(GradContext& c) {
  std::string dy = c.GO(0);
  if (dy.empty()) return;
  for (int i = 1; i <= 4; i++)
    ONYX_CHECK(!c.needs(i), c.node().describe(),
               ": a 4-bit weight is frozen (quantized): it has no gradient; train adapters (LoRA) "
               "beside it");
  const bool has_bias = c.num_inputs() > 5 && !c.I(5).empty();
  if (c.needs(0)) {
    std::map<std::string, ir::Attribute> at;
    for (auto& [k, v] : c.node().attrs)
      if (k != "transB") at[k] = v;
    at["transB"] = attr_i(c.node().attr_int("transB", 1) != 0 ? 0 : 1);
    std::vector<std::string> in = {dy};
    for (int i = 1; i <= 4; i++) in.push_back(i < c.num_inputs() ? c.I(i) : "");
    c.set(0, c.emit1("MatMul4Bit", in, at, "onyx"));
  }
  if (has_bias && c.needs(5)) c.set(5, c.emit1("BiasGrad", {dy}, {}, "onyx"));
}

}  // namespace

ONYX_REGISTER_GRADIENTS(quant) { r.add("onyx", "MatMul4Bit", matmul_4bit_rule); }

}  // namespace onyx::autodiff
