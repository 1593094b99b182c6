// kernels/dropout/dropout.cc — Dropout (ONNX domain "", opsets 6–13) and its fused backward
// onyx.DropoutGrad(dy, mask, [ratio], [training]): dx = dy * mask / (1 - ratio). In training
// mode the mask draws from Philox4x32-10 keyed on the run seed, the node's seed attribute and the
// node's output name (or its rng_key attribute, which recomputed clones carry), indexed by
// element, so masks do not depend on the thread count (DESIGN decision 10).
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cpu/dropout_rng.h"
#include "kernels/cpu/nn_util.h"
#include "kernels/cpu/philox.h"
#include "kernels/cpu/simd/nn.h"
#include "kernels/kernel_api.h"

namespace onyx::kernels {
namespace {

using namespace nnutil;

// ---- Dropout ------------------------------------------------------------------------------------

OpKernel make_dropout_kernel() {
  OpKernel k;
  k.infer = [](InferContext& ctx) {
    const TensorMeta& x = ctx.input(0);
    ctx.set_output(0, x.dtype, x.shape);
    if (ctx.num_outputs() > 1) ctx.set_output(1, ctx.opset >= 10 ? DType::Bool : x.dtype, x.shape);
  };
  k.compute = [](KernelContext& ctx) {
    const ir::Node& node = ctx.node;
    const Tensor& xt = ctx.input(0);
    Tensor& yt = ctx.output(0);
    Tensor* mask = ctx.has_output(1) ? &ctx.output(1) : nullptr;
    double ratio = 0.5;
    bool training = false;
    if (ctx.opset >= 12) {
      if (ctx.has_input(1)) {
        const Tensor& r = ctx.input(1);
        ONYX_CHECK(r.numel() == 1, node.describe(), ": ratio must be a scalar, got shape ",
                   shape_str(r.shape()));
        ratio = r.get_as_double(0);
      }
      if (ctx.has_input(2)) {
        const Tensor& t = ctx.input(2);
        ONYX_CHECK(t.numel() == 1, node.describe(), ": training_mode must be a scalar, got shape ",
                   shape_str(t.shape()));
        // Active only when the node asks for it AND the run is a training run: a model
        // exported in training mode still evaluates without dropout (RunOptions::training).
        training = t.get_as_double(0) != 0 && ctx.training;
      }
    } else {
      ratio = node.attr_float("ratio", 0.5f);
    }
    int64_t n = xt.numel();
    if (!training || ratio == 0) {  // identity, mask all true
      if (yt.raw() != xt.raw()) std::memcpy(yt.raw(), xt.raw(), xt.nbytes());
      if (mask) {
        if (mask->dtype() == DType::Bool)
          std::memset(mask->raw(), 1, mask->nbytes());
        else
          dispatch(mask->dtype(), kFloats, node, [&](auto tag) {
            using T = decltype(tag);
            T one = Elem<T>::store(1.0);
            T* m = mask->data<T>();
            for (int64_t i = 0; i < n; i++) m[i] = one;
          });
      }
      return;
    }
    ONYX_CHECK(ratio >= 0 && ratio <= 1, node.describe(), ": ratio must be in [0, 1), got ", ratio);
    ONYX_CHECK(!mask || mask->dtype() == DType::Bool, node.describe(), ": mask must be bool");
    // The draw fused ops reproduce (dropout_rng.h): key from the run seed, the seed attribute and
    // the rng_key attribute or output name; keep element i iff (word >> 8) >= ratio * 2^24.
    const dropout_rng::Draw draw =
        dropout_rng::make_draw(ctx.seed, node.attr_int("seed", 0),
                               node.has_attr("rng_key") ? node.attr_string("rng_key", "")
                               : node.outputs.empty()   ? node.name
                                                        : node.outputs[0],
                               ratio);
    const uint32_t t24 = draw.t24;
    const double scale = ratio >= 1 ? 0.0 : 1.0 / (1.0 - ratio);
    const Philox4x32::Key pkey = draw.key;
    bool* mp = mask ? mask->data<bool>() : nullptr;
    dispatch(xt.dtype(), kFloats, node, [&](auto tag) {
      using T = decltype(tag);
      const T* x = xt.data<T>();
      T* y = yt.data<T>();
      const float fscale = (float)scale;
      // Element i draws word (i % 32) / 8 of counter (i / 32) * 8 + i % 8: one Philox call
      // (simd/dropout.cc) serves 32 consecutive elements, and the mask depends only on (key, i).
      int64_t ngroups = (n + 31) / 32;
      parallel_for(ngroups, 1024, [&](int64_t b, int64_t e) {
        if constexpr (std::is_same_v<T, float>) {
          const int64_t i0 = b * 32, cnt = std::min(e * 32, n) - i0;
          simd::dropout_range(pkey[0], pkey[1], t24, fscale, i0, cnt, x + i0, nullptr, y + i0,
                              mp ? mp + i0 : nullptr);
        } else {
          uint32_t u[32];
          for (int64_t g = b; g < e; g++) {
            simd::philox_group_words((uint64_t)g, pkey[0], pkey[1], u);
            int64_t i0 = g * 32, cnt = std::min<int64_t>(32, n - i0);
            for (int64_t j = 0; j < cnt; j++) {
              int64_t i = i0 + j;
              bool keep = (u[j] >> 8) >= t24;
              y[i] = keep ? Elem<T>::store(Elem<T>::load(x[i]) * scale) : Elem<T>::store(0.0);
              if (mp) mp[i] = keep;
            }
          }
        }
      });
    });
  };
  return k;
}

// ---- onyx.DropoutGrad ---------------------------------------------------------------------------
// DropoutGrad(dy, mask, [ratio], [training]): mask is bool, as the forward produced it; ratio an
// optional scalar (default 0.5); training_mode an optional bool scalar (absent means the node asks
// for training). Like the forward, dropout is active only when the node asks for it AND the run is
// a training run (RunOptions::training, seen here as ctx.training). Not active or ratio 0: dx = dy,
// as the forward was the identity (its mask is then all true, so it alone cannot tell). Otherwise
// dx = mask ? dy * (float)(1 / (1 - ratio)) : 0, the same float scale the forward multiplied by.
OpKernel make_dropout_grad_kernel() {
  OpKernel k;
  k.infer = [](InferContext& ctx) {
    const TensorMeta& dy = ctx.input(0);
    check_same_shape(ctx.node, dy, ctx.input(1), "dy", "mask");
    ctx.set_output(0, dy.dtype, dy.shape);
  };
  k.compute = [](KernelContext& ctx) {
    const ir::Node& node = ctx.node;
    const Tensor& dyt = ctx.input(0);
    const Tensor& mt = ctx.input(1);
    Tensor& dxt = ctx.output(0);
    double ratio = ctx.has_input(2) ? ctx.input(2).get_as_double(0) : 0.5;
    bool training = (ctx.has_input(3) ? ctx.input(3).get_as_double(0) != 0 : true) && ctx.training;
    int64_t n = dyt.numel();
    if (!training || ratio == 0) {
      if (dxt.raw() != dyt.raw()) std::memcpy(dxt.raw(), dyt.raw(), dyt.nbytes());
      return;
    }
    ONYX_CHECK(mt.dtype() == DType::Bool, node.describe(), ": mask must be bool, got ",
               dtype_name(mt.dtype()));
    const double scale = ratio >= 1 ? 0.0 : 1.0 / (1.0 - ratio);
    const bool* m = mt.data<bool>();
    dispatch(dyt.dtype(), kFloats, node, [&](auto tag) {
      using T = decltype(tag);
      const T* dy = dyt.data<T>();
      T* dx = dxt.data<T>();
      const float fs = (float)scale;
      parallel_for(n, 32768, [&](int64_t b, int64_t e) {
        int64_t i = b;
        if constexpr (std::is_same_v<T, float>) {
          simd::dropout_grad_mask(m + b, dy + b, dx + b, fs, e - b);
        } else {
          for (; i < e; i++)
            dx[i] = m[i] ? Elem<T>::store(Elem<T>::load(dy[i]) * scale) : Elem<T>::store(0.0);
        }
      });
    });
  };
  return k;
}

}  // namespace

ONYX_REGISTER_KERNELS(dropout, Cpu) {
  r.add("", "Dropout", make_dropout_kernel()).random = true;
  r.add("onyx", "DropoutGrad", make_dropout_grad_kernel());
}

}  // namespace onyx::kernels
