// kernels/random/draws.cc — the random draws of diffusion training (diffusion/unet2d.h), "onyx"
// domain, each passing a given tensor through when the batch has one:
//
//   DrawNormal(given, like)              -> y: given when it has elements (its shape must be
//       like's), else standard normal values of like's shape
//   DrawIntegers(given, like)  high      -> y (B) int64: given when it has elements (B = like's
//       first dimension), else uniform integers in [0, high)
//
// Drawn values come from Philox4x32-10 keyed like Dropout's masks (the run seed, which the
// Trainer derives per step and micro-batch, and the node's output name), indexed by element, so
// they do not depend on the thread count and a resumed run draws what the uninterrupted one did.
// Normals by Box–Muller (kernels/cpu/normal_draw.h).
// Hand-written: a dozen lines over the Philox generator the Dropout kernels already use; no
// library draws counter-based normals keyed this way.
#include <cmath>
#include <cstring>

#include "kernels/cpu/dropout_rng.h"
#include "kernels/cpu/normal_draw.h"
#include "kernels/cpu/philox.h"
#include "kernels/kernel_api.h"

namespace onyx::kernels {
namespace {

Philox4x32::Key key_of(const KernelContext& ctx) {
  const ir::Node& n = ctx.node;
  const std::string id = n.outputs.empty() ? n.name : n.outputs[0];
  return Philox4x32::key_from(mix_seed(ctx.seed ^ mix_seed(0xd1ffu) ^ dropout_rng::fnv1a(id)));
}

bool given(const TensorMeta& m) { return shape_product(m.shape) > 0; }

OpKernel make_draw_normal() {
  OpKernel k;
  k.infer = [](InferContext& ctx) {
    const auto& g = ctx.input(0);
    const auto& like = ctx.input(1);
    ONYX_CHECK(!given(g) || g.shape == like.shape, ctx.node.describe(), ": the given ",
               shape_str(g.shape), " is not the shape ", shape_str(like.shape), " it replaces");
    ctx.set_output(0, DType::Float32, like.shape);
  };
  k.compute = [](KernelContext& ctx) {
    const Tensor& g = ctx.input(0);
    Tensor& y = ctx.output(0);
    if (g.numel() > 0) {
      ONYX_CHECK(g.dtype() == DType::Float32, ctx.node.describe(), ": noise must be float32");
      std::memcpy(y.raw(), g.raw(), y.nbytes());
      return;
    }
    philox_normals(key_of(ctx), 0, y.data<float>(), y.numel());
  };
  return k;
}

OpKernel make_draw_integers() {
  OpKernel k;
  k.infer = [](InferContext& ctx) {
    const auto& g = ctx.input(0);
    const auto& like = ctx.input(1);
    ONYX_CHECK(!like.shape.empty(), ctx.node.describe(), ": like must have a batch dimension");
    ONYX_CHECK(!given(g) || g.shape == Shape{like.shape[0]}, ctx.node.describe(), ": the given ",
               shape_str(g.shape), " is not one value per row of ", shape_str(like.shape));
    ctx.set_output(0, DType::Int64, {like.shape[0]});
  };
  k.compute = [](KernelContext& ctx) {
    const Tensor& g = ctx.input(0);
    Tensor& y = ctx.output(0);
    const int64_t high = ctx.node.attr_int("high", 0);
    ONYX_CHECK(high >= 1, ctx.node.describe(), ": high must be >= 1");
    int64_t* out = y.data<int64_t>();
    if (g.numel() > 0) {
      ONYX_CHECK(g.dtype() == DType::Int64, ctx.node.describe(), ": timesteps must be int64");
      const int64_t* in = g.data<int64_t>();
      for (int64_t i = 0; i < y.numel(); i++) {
        ONYX_CHECK(in[i] >= 0 && in[i] < high, ctx.node.describe(), ": timestep ", in[i],
                   " at row ", i, " is outside [0, ", high, ")");
        out[i] = in[i];
      }
      return;
    }
    const auto key = key_of(ctx);
    for (int64_t i = 0; i < y.numel(); i++) {
      auto w = Philox4x32::generate({(uint32_t)i, (uint32_t)(i >> 32), 1, 0}, key);
      out[i] = (int64_t)(((uint64_t)w[0] * (uint64_t)high) >> 32);
    }
  };
  return k;
}

}  // namespace

ONYX_REGISTER_KERNELS(random_draws, Cpu) {
  r.add("onyx", "DrawNormal", make_draw_normal());
  r.add("onyx", "DrawIntegers", make_draw_integers());
}

}  // namespace onyx::kernels
