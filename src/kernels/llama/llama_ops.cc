// kernels/llama/llama_ops.cc — the fused elementwise ops of Llama-family MLPs and attention, each
// with its backward next to it ("onyx" domain, formed by passes, never exported):
//   SwiGLU(gate, up)                  y = silu(gate) * up, silu(g) = g * sigmoid(g)
//   SwiGLUGrad(dy, gate, up)          -> dgate = dy * up * s * (1 + g (1 - s)), dup = dy * silu(g)
//                                     (mixed precision: bf16 gate / up, float32 dy and grads)
//   Rotary(x, cos, sin)               y = x * cos + rotate_half(x) * sin over the last axis,
//                                     rotate_half(x) = cat(-x2, x1) (x1, x2 its halves)
//                                     (a bf16 x with float32 tables: rotated in float32,
//                                     written bf16 — mixed precision's Q and K)
//   RotaryGrad(dy, cos, sin[, x])     -> dx = dy * cos + rotate_half^T(dy * sin), and with x:
//                                     dcos = dy * x, dsin = dy * rotate_half(x) (x's shape; the
//                                     gradient rule sums them to the tables' shapes)
// swiglu_fusion.cc and rotary_fusion.cc form them; rules in autodiff/gradients/llama_ops.cc.
// Hand-written because no library op does either: ONNX has no SwiGLU or rotary-embedding op at
// the opsets models import, and oneDNN's eltwise primitives take one tensor. Unfused, SwiGLU is
// onyx.Silu + Mul (two passes over F-wide activations, three backward nodes) and rotary is two
// Slices (or a Split), Neg, Concat, two Muls and an Add per q and k (seven (B,h,T,hd) temporaries
// forward, more backward); fused each is one pass. float32 runs the SIMD kernels of simd/nn.h
// (simd/llama.cc: AVX-512, AVX2 or portable code by run-time dispatch; SwiGLU's sigmoid is
// onyx.Silu's); other float types compute in double per element. Both are threaded over fixed
// element/row ranges, so results do not depend on the thread count.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/nn_util.h"
#include "kernels/cpu/simd/nn.h"
#include "kernels/elementwise/elementwise.h"
#include "kernels/kernel_api.h"

namespace onyx::kernels {
namespace {

using namespace nnutil;

constexpr int64_t kGrainMath = 4096;  // elements per parallel chunk (exp per element)

// ---- onyx.SwiGLU --------------------------------------------------------------------------------

void check_same(const ir::Node& node, const TensorMeta& a, const TensorMeta& b, const char* an,
                const char* bn) {
  ONYX_CHECK(a.dtype == b.dtype && a.shape == b.shape, node.describe(), ": ", an, " ",
             dtype_name(a.dtype), shape_str(a.shape), " and ", bn, " ", dtype_name(b.dtype),
             shape_str(b.shape), " must have the same dtype and shape");
  if (!is_float(a.dtype)) ONYX_UNSUPPORTED(node.describe(), ": dtype ", dtype_name(a.dtype));
}

// Mixed precision (passes/mixed_precision.cc): gate and up may each be float32 or bf16 (the GEMMs
// write them bf16 when SwiGLU and SwiGLUGrad are their only readers), computed in float32 blocks.
bool f32_or_bf16(DType t) { return t == DType::Float32 || t == DType::BFloat16; }
constexpr int64_t kBlock = 512;  // elements per widened block

// Elements [i, i + m) of a float32 or bf16 tensor as float32: in place for float32, else widened
// into buf (m <= kBlock).
const float* float_block(const Tensor& t, int64_t i, int64_t m, float* buf) {
  if (t.dtype() == DType::Float32) return t.data<float>() + i;
  ew::to_float(t.data<BFloat16>() + i, buf, m);
  return buf;
}

// gate and up: the same shape and dtype, or float32 / bf16 mixed (mixed precision).
void check_gate_up(const ir::Node& node, const TensorMeta& g, const TensorMeta& u) {
  if (g.dtype != u.dtype && f32_or_bf16(g.dtype) && f32_or_bf16(u.dtype)) {
    ONYX_CHECK(g.shape == u.shape, node.describe(), ": gate ", shape_str(g.shape), " and up ",
               shape_str(u.shape), " must have the same shape");
    return;
  }
  check_same(node, g, u, "gate", "up");
}

OpKernel make_swiglu_kernel() {
  OpKernel k;
  k.infer = [](InferContext& ctx) {
    const TensorMeta &g = ctx.input(0), &u = ctx.input(1);
    check_gate_up(ctx.node, g, u);
    DType y = g.dtype;
    if (ctx.node.attr_int("output_dtype", 0) == (int64_t)DType::BFloat16 && f32_or_bf16(g.dtype) &&
        f32_or_bf16(u.dtype))
      y = DType::BFloat16;  // output_dtype = BFLOAT16, over float32 or bf16 operands
    else if (g.dtype == u.dtype)
      y = nnutil::low_precision_output(ctx.node, g.dtype);
    else
      ONYX_CHECK(false, ctx.node.describe(), ": gate ", dtype_name(g.dtype), " and up ",
                 dtype_name(u.dtype), " of different dtypes need output_dtype = BFLOAT16");
    ctx.set_output(0, y, g.shape);
  };
  k.compute = [](KernelContext& ctx) {
    const Tensor &gt = ctx.input(0), &ut = ctx.input(1);
    Tensor& yt = ctx.output(0);
    const int64_t n = gt.numel();
    if (yt.dtype() == DType::BFloat16 && f32_or_bf16(gt.dtype()) && f32_or_bf16(ut.dtype())) {
      // Mixed precision: float32 blocks (bf16 operands widened), rounded as Cast rounds. y may be
      // written over a bf16 gate or up: each block is read before it is written.
      BFloat16* y = yt.data<BFloat16>();
      parallel_for(n, kGrainMath, [&](int64_t b, int64_t e) {
        float gb[kBlock], ub[kBlock], buf[kBlock];
        for (int64_t i = b; i < e; i += kBlock) {
          const int64_t m = std::min(kBlock, e - i);
          simd::swiglu(float_block(gt, i, m, gb), float_block(ut, i, m, ub), buf, m);
          ew::from_float(buf, y + i, m);
        }
      });
      return;
    }
    if (gt.dtype() == DType::Float32) {
      const float *g = gt.data<float>(), *u = ut.data<float>();
      float* y = yt.data<float>();
      parallel_for(n, kGrainMath,
                   [&](int64_t b, int64_t e) { simd::swiglu(g + b, u + b, y + b, e - b); });
      return;
    }
    dispatch(gt.dtype(), kFloats, ctx.node, [&](auto tag) {
      using T = decltype(tag);
      const T *g = gt.data<T>(), *u = ut.data<T>();
      T* y = yt.data<T>();
      parallel_for(n, kGrainMath, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; i++) {
          double x = Elem<T>::load(g[i]);
          y[i] = Elem<T>::store(x / (1.0 + std::exp(-x)) * Elem<T>::load(u[i]));
        }
      });
    });
  };
  k.inplace = {{0, 0}, {0, 1}};
  return k;
}

OpKernel make_swiglu_grad_kernel() {
  OpKernel k;
  k.infer = [](InferContext& ctx) {
    const TensorMeta &dy = ctx.input(0), &g = ctx.input(1), &u = ctx.input(2);
    if (dy.dtype == DType::Float32 && f32_or_bf16(g.dtype) && f32_or_bf16(u.dtype)) {
      // float32 gradients from float32 or bf16 saved operands (mixed precision)
      ONYX_CHECK(dy.shape == g.shape && g.shape == u.shape, ctx.node.describe(), ": dy ",
                 shape_str(dy.shape), ", gate ", shape_str(g.shape), " and up ", shape_str(u.shape),
                 " must have the same shape");
    } else {
      check_same(ctx.node, dy, g, "dy", "gate");
      check_same(ctx.node, g, u, "gate", "up");
    }
    ctx.set_output(0, dy.dtype, g.shape);
    if (ctx.num_outputs() > 1) ctx.set_output(1, dy.dtype, u.shape);
  };
  k.compute = [](KernelContext& ctx) {
    const Tensor &dyt = ctx.input(0), &gt = ctx.input(1), &ut = ctx.input(2);
    const int64_t n = gt.numel();
    // Both outputs are written; an absent dup goes to scratch.
    Tensor scratch;
    Tensor& dgt = ctx.output(0);
    Tensor* dut = ctx.has_output(1) ? &ctx.output(1) : nullptr;
    if (!dut) {
      scratch = Tensor(dgt.dtype(), gt.shape());
      dut = &scratch;
    }
    if (dyt.dtype() == DType::Float32 &&
        (gt.dtype() == DType::BFloat16 || ut.dtype() == DType::BFloat16)) {
      // bf16 saved operands widened per block; the same arithmetic as the float32 path
      const float* dy = dyt.data<float>();
      float *dg = dgt.data<float>(), *du = dut->data<float>();
      parallel_for(n, kGrainMath, [&](int64_t b, int64_t e) {
        float gb[kBlock], ub[kBlock];
        for (int64_t i = b; i < e; i += kBlock) {
          const int64_t m = std::min(kBlock, e - i);
          simd::swiglu_grad(dy + i, float_block(gt, i, m, gb), float_block(ut, i, m, ub), dg + i,
                            du + i, m);
        }
      });
      return;
    }
    if (gt.dtype() == DType::Float32) {
      const float *dy = dyt.data<float>(), *g = gt.data<float>(), *u = ut.data<float>();
      float *dg = dgt.data<float>(), *du = dut->data<float>();
      // The arithmetic of the unfused onyx.Silu + Mul backward (SiluGrad on dy * up): the same
      // roundings, so fusing does not change the gradients.
      parallel_for(n, kGrainMath, [&](int64_t b, int64_t e) {
        simd::swiglu_grad(dy + b, g + b, u + b, dg + b, du + b, e - b);
      });
      return;
    }
    dispatch(gt.dtype(), kFloats, ctx.node, [&](auto tag) {
      using T = decltype(tag);
      const T *dy = dyt.data<T>(), *g = gt.data<T>(), *u = ut.data<T>();
      T *dg = dgt.data<T>(), *du = dut->data<T>();
      parallel_for(n, kGrainMath, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; i++) {
          double d = Elem<T>::load(dy[i]), x = Elem<T>::load(g[i]), v = Elem<T>::load(u[i]);
          double s = 1.0 / (1.0 + std::exp(-x));
          du[i] = Elem<T>::store(d * x * s);
          dg[i] = Elem<T>::store(d * v * s * (1.0 + x * (1.0 - s)));
        }
      });
    });
  };
  // dgate over dy, dup over up: each element of both is read before either output's is written.
  k.inplace = {{0, 0}, {1, 2}};
  return k;
}

// ---- onyx.Rotary --------------------------------------------------------------------------------
// x (..., D) with D even, h = D / 2; cos and sin of one shape, broadcasting to x's (right-aligned,
// last dim D): the tables (B or 1, 1, T, D) serve every head.

struct RotaryLayout {
  int64_t rows = 0, D = 0;
  std::vector<int64_t> prefix;   // x's dims before the last
  std::vector<int64_t> tstride;  // the tables' stride (in rows) per prefix dim, 0 if broadcast
  // Row offset (in elements) of x's row r in the tables.
  int64_t table_offset(int64_t r) const {
    int64_t off = 0;
    for (int64_t k = (int64_t)prefix.size() - 1; k >= 0; k--) {
      off += (r % prefix[k]) * tstride[k];
      r /= prefix[k];
    }
    return off * D;
  }
};

RotaryLayout rotary_layout(const ir::Node& node, const Shape& x, const Shape& cos,
                           const Shape& sin) {
  ONYX_CHECK(!x.empty() && x.back() % 2 == 0, node.describe(), ": x ", shape_str(x),
             " must have an even last dim");
  ONYX_CHECK(cos == sin, node.describe(), ": cos ", shape_str(cos), " and sin ", shape_str(sin),
             " must have the same shape");
  ONYX_CHECK(!cos.empty() && cos.size() <= x.size() && cos.back() == x.back(), node.describe(),
             ": cos/sin ", shape_str(cos), " must end in x's last dim ", x.back(), " (x ",
             shape_str(x), ")");
  RotaryLayout L;
  L.D = x.back();
  const size_t r = x.size(), off = r - cos.size();
  L.prefix.assign(x.begin(), x.end() - 1);
  L.tstride.assign(r - 1, 0);
  int64_t acc = 1;
  for (int64_t k = (int64_t)r - 2; k >= 0; k--) {
    int64_t d = k >= (int64_t)off ? cos[k - off] : 1;
    ONYX_CHECK(d == x[k] || d == 1, node.describe(), ": cos/sin ", shape_str(cos),
               " do not broadcast to x ", shape_str(x));
    L.tstride[k] = d == 1 ? 0 : acc;
    acc *= d;
  }
  L.rows = shape_numel(x) / std::max<int64_t>(1, L.D);
  return L;
}

// y = x * c + rotate_half(x) * s for one row; the backward's dx is the same with the transposed
// rotation: dx1 = dy1 c1 + dy2 s2, dx2 = dy2 c2 - dy1 s1 (TRANSPOSED). float32 rows run
// simd::rotary_row / rotary_grad_row (each product and sum rounded as the unfused Mul / Add nodes
// round it, no FMA contraction, so fusing does not change the results); this is the generic row.
template <bool TRANSPOSED, class T>
void rotary_row_generic(const T* x, const T* c, const T* s, T* y, int64_t D) {
  const int64_t h = D / 2;
  auto L = [](T v) { return Elem<T>::load(v); };
  for (int64_t i = 0; i < h; i++) {
    double x1 = L(x[i]), x2 = L(x[h + i]);
    double y1 = TRANSPOSED ? x1 * L(c[i]) + x2 * L(s[h + i]) : x1 * L(c[i]) - x2 * L(s[i]);
    double y2 = TRANSPOSED ? x2 * L(c[h + i]) - x1 * L(s[i]) : x2 * L(c[h + i]) + x1 * L(s[h + i]);
    y[i] = Elem<T>::store(y1);
    y[h + i] = Elem<T>::store(y2);
  }
}

template <bool TRANSPOSED>
void rotary_apply(const ir::Node& node, const Tensor& xt, const Tensor& ct, const Tensor& st,
                  Tensor& yt) {
  RotaryLayout L = rotary_layout(node, xt.shape(), ct.shape(), st.shape());
  const bool mixed = xt.dtype() == DType::BFloat16 && ct.dtype() == DType::Float32 &&
                     st.dtype() == DType::Float32 && yt.dtype() == DType::BFloat16;
  ONYX_CHECK(mixed || (ct.dtype() == xt.dtype() && st.dtype() == xt.dtype()), node.describe(),
             ": cos/sin must have x's dtype ", dtype_name(xt.dtype()),
             " (or be float32 for a bfloat16 x)");
  if (L.rows == 0 || L.D == 0) return;
  const int64_t D = L.D;
  if (mixed) {  // mixed precision: bf16 rows widened, float32 rotation, rounded back
    const BFloat16* x = xt.data<BFloat16>();
    const float *c = ct.data<float>(), *s = st.data<float>();
    BFloat16* y = yt.data<BFloat16>();
    parallel_for(L.rows, std::max<int64_t>(1, 8192 / D), [&](int64_t b, int64_t e) {
      std::vector<float> xb((size_t)D), yb((size_t)D);
      for (int64_t r = b; r < e; r++) {
        int64_t t = L.table_offset(r);
        ew::to_float(x + r * D, xb.data(), D);
        (TRANSPOSED ? simd::rotary_grad_row : simd::rotary_row)(xb.data(), c + t, s + t, yb.data(),
                                                                D);
        ew::from_float(yb.data(), y + r * D, D);
      }
    });
    return;
  }
  dispatch(xt.dtype(), kFloats, node, [&](auto tag) {
    using T = decltype(tag);
    const T *x = xt.data<T>(), *c = ct.data<T>(), *s = st.data<T>();
    T* y = yt.data<T>();
    parallel_for(L.rows, std::max<int64_t>(1, 8192 / D), [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; r++) {
        int64_t t = L.table_offset(r);
        if constexpr (std::is_same_v<T, float>)
          (TRANSPOSED ? simd::rotary_grad_row : simd::rotary_row)(x + r * D, c + t, s + t,
                                                                  y + r * D, D);
        else
          rotary_row_generic<TRANSPOSED, T>(x + r * D, c + t, s + t, y + r * D, D);
      }
    });
  });
}

OpKernel make_rotary_kernel() {
  OpKernel k;
  k.infer = [](InferContext& ctx) {
    const TensorMeta& x = ctx.input(0);
    if (!is_float(x.dtype)) ONYX_UNSUPPORTED(ctx.node.describe(), ": dtype ", dtype_name(x.dtype));
    rotary_layout(ctx.node, x.shape, ctx.input(1).shape, ctx.input(2).shape);
    ctx.set_output(0, x.dtype, x.shape);  // bf16 x with float32 tables: bf16 (mixed precision)
  };
  k.compute = [](KernelContext& ctx) {
    rotary_apply<false>(ctx.node, ctx.input(0), ctx.input(1), ctx.input(2), ctx.output(0));
  };
  return k;
}

// dcos = dy * x, dsin = dy * rotate_half(x), both of x's shape.
void rotary_table_grads(const ir::Node& node, const Tensor& dyt, const Tensor& xt, Tensor* dct,
                        Tensor* dst) {
  const Shape& sh = xt.shape();
  const int64_t D = sh.back(), h = D / 2, rows = xt.numel() / std::max<int64_t>(1, D);
  dispatch(xt.dtype(), kFloats, node, [&](auto tag) {
    using T = decltype(tag);
    const T *dy = dyt.data<T>(), *x = xt.data<T>();
    T* dc = dct ? dct->data<T>() : nullptr;
    T* ds = dst ? dst->data<T>() : nullptr;
    parallel_for(rows, std::max<int64_t>(1, 8192 / std::max<int64_t>(1, D)),
                 [&](int64_t b, int64_t e) {
                   for (int64_t r = b; r < e; r++) {
                     const T *d = dy + r * D, *v = x + r * D;
                     for (int64_t i = 0; i < D; i++) {
                       double di = Elem<T>::load(d[i]);
                       if (dc) dc[r * D + i] = Elem<T>::store(di * Elem<T>::load(v[i]));
                       if (ds) {
                         double rot = i < h ? -Elem<T>::load(v[h + i]) : Elem<T>::load(v[i - h]);
                         ds[r * D + i] = Elem<T>::store(di * rot);
                       }
                     }
                   }
                 });
  });
}

OpKernel make_rotary_grad_kernel() {
  OpKernel k;
  k.infer = [](InferContext& ctx) {
    const TensorMeta& dy = ctx.input(0);
    if (!is_float(dy.dtype))
      ONYX_UNSUPPORTED(ctx.node.describe(), ": dtype ", dtype_name(dy.dtype));
    rotary_layout(ctx.node, dy.shape, ctx.input(1).shape, ctx.input(2).shape);
    ctx.set_output(0, dy.dtype, dy.shape);
    if (ctx.num_outputs() > 1) {
      ONYX_CHECK(ctx.has_input(3) && ctx.input(3).shape == dy.shape, ctx.node.describe(),
                 ": dcos / dsin need x (input 3) of dy's shape");
      ctx.set_output(1, dy.dtype, dy.shape);
      if (ctx.num_outputs() > 2) ctx.set_output(2, dy.dtype, dy.shape);
    }
  };
  k.compute = [](KernelContext& ctx) {
    if (ctx.has_output(0))
      rotary_apply<true>(ctx.node, ctx.input(0), ctx.input(1), ctx.input(2), ctx.output(0));
    Tensor* dc = ctx.has_output(1) ? &ctx.output(1) : nullptr;
    Tensor* ds = ctx.has_output(2) ? &ctx.output(2) : nullptr;
    if (dc || ds) rotary_table_grads(ctx.node, ctx.input(0), ctx.input(3), dc, ds);
  };
  return k;
}

}  // namespace

ONYX_REGISTER_KERNELS(llama, Cpu) {
  // swiglu_fusion: elementwise over two same-shaped operands (token pruning may select rows)
  r.add("onyx", "SwiGLU", make_swiglu_kernel()).per_token = OpTraits::PerToken::Binary;
  r.add("onyx", "SwiGLUGrad", make_swiglu_grad_kernel());
  r.add("onyx", "Rotary", make_rotary_kernel());  // rotary_fusion
  r.add("onyx", "RotaryGrad", make_rotary_grad_kernel());
}

}  // namespace onyx::kernels
