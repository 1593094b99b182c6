// kernels/accumulate/accumulate.cc — onyx.AccumulateGrad(g) -> out: the last node of every
// parameter gradient. When the executor binds `out` to the parameter's view of the flat gradient
// buffer and the run asks to accumulate (gradient accumulation over micro-batches), out += g;
// otherwise out = g.
#include <cstring>

#include "kernels/kernel_api.h"

namespace onyx::kernels {

ONYX_REGISTER_KERNELS(accumulate, Cpu) {
  OpTraits& t =
      r.add("onyx", "AccumulateGrad",
            OpKernel{[](InferContext& c) { c.set_output(0, c.input(0).dtype, c.input(0).shape); },
                     [](KernelContext& c) {
                       const Tensor& g = c.input(0);
                       Tensor& out = c.output(0);
                       if (out.raw() == g.raw()) return;
                       if (!c.accumulate) {
                         std::memcpy(out.raw(), g.raw(), g.nbytes());
                         return;
                       }
                       ONYX_CHECK(g.dtype() == DType::Float32, c.node.describe(),
                                  ": accumulation supports float32 gradients, got ",
                                  dtype_name(g.dtype()));
                       const float* src = g.data<float>();
                       float* dst = out.data<float>();
                       parallel_for(g.numel(), 1 << 15, [&](int64_t b, int64_t e) {
                         for (int64_t i = b; i < e; i++) dst[i] += src[i];
                       });
                     },
                     {}});
  t.side_effects = true;  // adds into the caller's bound storage: never folded
}

}  // namespace onyx::kernels
