// kernels/dropout/dropout_add.cc — onyx.DropoutAdd, the residual connection after a dropout, formed
// by passes/dropout_add_fusion.cc from Add(Dropout(y, ratio, training_mode), residual):
//
//   DropoutAdd(y, residual, [ratio], [training_mode])  attrs seed, rng_key  -> out, [mask]
//     y, residual float32 of one shape; ratio a scalar (absent: 0.5, as Dropout's default);
//     training_mode a scalar (absent: false, as Dropout's). Active when training_mode is true AND
//     the run is a training run (KernelContext::training) AND ratio != 0; then
//       out = (keep ? y · (float)(1/(1-ratio)) : 0) + residual,   mask = keep (bool)
//     with keep drawn exactly as the Dropout kernel draws it for a node with this seed attribute
//     and rng_key (kernels/cpu/dropout_rng.h), so fused and unfused graphs train bit-identically.
//     Otherwise out = y + residual and mask is all true.
//   The gradient (autodiff/gradients/dropout_add.cc) is onyx.DropoutGrad(dout, mask, ratio,
//   training_mode) for y and dout itself for the residual.
//
// Hand-written because it replaces two passes over a (tokens × C) activation (the Dropout's
// y → y' and the Add's y' + residual → out) by one, with the same Philox draw of 32 elements per
// call as the Dropout kernel (simd/dropout.cc, per SIMD path); threaded over 32-element groups
// (masks depend only on the element index, so any thread split gives the same bits).
#include <algorithm>
#include <cstring>

#include "kernels/cpu/dropout_rng.h"
#include "kernels/cpu/simd/simd.h"
#include "kernels/kernel_api.h"

namespace onyx::kernels {
namespace {

OpKernel make_dropout_add_kernel() {
  OpKernel k;
  k.infer = [](InferContext& ctx) {
    const TensorMeta& y = ctx.input(0);
    const TensorMeta& r = ctx.input(1);
    ONYX_CHECK(y.dtype == DType::Float32 && r.dtype == DType::Float32, ctx.node.describe(),
               ": y and residual must be float32, got ", dtype_name(y.dtype), " and ",
               dtype_name(r.dtype));
    ONYX_CHECK(y.shape == r.shape, ctx.node.describe(), ": y ", shape_str(y.shape),
               " and residual ", shape_str(r.shape), " must have the same shape");
    ctx.set_output(0, DType::Float32, y.shape);
    if (ctx.num_outputs() > 1) ctx.set_output(1, DType::Bool, y.shape);
  };
  k.compute = [](KernelContext& ctx) {
    const ir::Node& node = ctx.node;
    const float* y = ctx.input(0).data<float>();
    const float* res = ctx.input(1).data<float>();
    float* out = ctx.output(0).data<float>();
    bool* mask = ctx.has_output(1) ? ctx.output(1).data<bool>() : nullptr;
    const int64_t n = ctx.input(0).numel();
    double ratio = 0.5;
    bool training = false;
    if (ctx.has_input(2)) {
      const Tensor& r = ctx.input(2);
      ONYX_CHECK(r.numel() == 1, node.describe(), ": ratio must be a scalar, got shape ",
                 shape_str(r.shape()));
      ratio = r.get_as_double(0);
    }
    if (ctx.has_input(3)) {
      const Tensor& t = ctx.input(3);
      ONYX_CHECK(t.numel() == 1, node.describe(), ": training_mode must be a scalar, got shape ",
                 shape_str(t.shape()));
      training = t.get_as_double(0) != 0 && ctx.training;
    }
    if (!training || ratio == 0) {  // out = y + residual, mask all true
      parallel_for(n, 16384,
                   [&](int64_t b, int64_t e) { simd::add_arrays(y + b, res + b, out + b, e - b); });
      if (mask) std::memset(mask, 1, (size_t)n);
      return;
    }
    ONYX_CHECK(ratio >= 0 && ratio <= 1, node.describe(), ": ratio must be in [0, 1), got ", ratio);
    const dropout_rng::Draw d = dropout_rng::make_draw(ctx.seed, node.attr_int("seed", 0),
                                                       dropout_rng::rng_key_of(node), ratio);
    // Element i draws word (i % 32) / 8 of counter (i / 32) * 8 + i % 8 (as the Dropout kernel).
    const int64_t ngroups = (n + 31) / 32;
    parallel_for(ngroups, 1024, [&](int64_t gb, int64_t ge) {
      const int64_t i0 = gb * 32, cnt = std::min(ge * 32, n) - i0;
      simd::dropout_range(d.key[0], d.key[1], d.t24, d.scale, i0, cnt, y + i0, res + i0, out + i0,
                          mask ? mask + i0 : nullptr);
    });
  };
  return k;
}

}  // namespace

ONYX_REGISTER_KERNELS(dropout_add, Cpu) { r.add("onyx", "DropoutAdd", make_dropout_add_kernel()); }

}  // namespace onyx::kernels
