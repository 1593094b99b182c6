// kernels/conv/conv.cc — Conv (ONNX, opsets 1–18): 1-D, 2-D and 3-D, NC[D]H[W] layout, groups,
// strides, dilations, explicit or automatic (SAME_UPPER / SAME_LOWER / VALID) padding, optional
// bias; and its fused gradients ("onyx" domain, emitted by the rules in
// autodiff/gradients/matmul.cc):
//   ConvGradInput(dY, W)  strides pads dilations group input_shape   dX of Conv (N,C,in...)
//   ConvGradWeight(dY, X) strides pads dilations group kernel_shape  dW of Conv (M,C/group,k...)
//
// Conv and both gradients in float32 run oneDNN's convolutions on its blocked layouts, reordered
// from and to the plain tensors (conv_onednn.cc), wherever that measured faster
// (conv_onednn::preferred: not the forward or input gradient of 1×1 kernels, not image-channel
// inputs, not too little work per weight element); elsewhere the forward runs oneDNN's primitive
// on the plain layouts. Primitive creation costs far more than a small convolution, so primitives
// are cached per geometry. float16/bfloat16 are converted to float32 around it; float64 uses a
// direct loop. Hand-written: the ONNX attribute semantics (auto_pad, kernel_shape checks, output
// size) and the cache.
// The plain gradients are hand-written: im2col + GEMM (+ col2im; conv_common.h, shared with
// ConvTranspose) with the per-sample work threaded over samples (per-thread partial dW, summed in a
// fixed order, so results are deterministic for a given thread count); kernels::gemm (sgemm for
// float32, a plain loop for float64), float16/bfloat16 converted to float32 around the same code.
// ConvGradWeight writes the weight gradient straight into the trainer's flat gradient buffer
// (passes/gradient_into_buffer.cc); accumulating micro-batches it adds out + (the gradient as
// computed alone), so gradient accumulation is bit-identical to a separate onyx.AccumulateGrad.
// Mixed precision (KernelContext::bf16_gemm, TrainingArguments.bf16; float32 tensors): Conv and
// both gradients take bf16-rounded operands with float32 accumulation, as PyTorch's CPU autocast
// runs conv — where the CPU has native bf16, the passes conv_onednn::preferred picks as oneDNN's
// blocked bf16 convolutions, the other forwards as its plain-layout one; elsewhere on the rounded
// values widened back to float32; the plain gradients' GEMMs through kernels::gemm_as_bf16.
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <dnnl.hpp>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/conv/conv_common.h"
#include "kernels/conv/conv_onednn.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/nn_util.h"
#include "kernels/cpu/onednn_scratch.h"
#include "kernels/kernel_api.h"

namespace onyx::kernels {
namespace {

using kernels::gemm;
using nnutil::check_float;
using nnutil::dispatch_float;
using nnutil::from_f32;
using nnutil::to_f32;

// X (N,C,in...) * W (M,C/group,k...) [+ B (M)] → Y (N,M,out...)
struct ConvGeom : conv_onednn::ConvDims {
  int nsp = 0;  // spatial dims: 1, 2 or 3
  Shape out_shape() const {
    Shape s{N, M};
    s.insert(s.end(), out.begin(), out.end());
    return s;
  }
};

ConvGeom conv_geom(const ir::Node& node, const Shape& x, const Shape& w, const Shape* b) {
  ONYX_CHECK(x.size() >= 3 && x.size() <= 5, node.describe(),
             ": Conv input X must be (N, C, D1[, D2[, D3]]), got ", shape_str(x));
  ONYX_CHECK(w.size() == x.size(), node.describe(), ": Conv weight W ", shape_str(w),
             " must have the rank of X ", shape_str(x));
  ConvGeom g;
  g.nsp = (int)x.size() - 2;
  g.N = x[0];
  g.C = x[1];
  g.M = w[0];
  g.group = node.attr_int("group", 1);
  ONYX_CHECK(g.group >= 1 && g.C % g.group == 0 && g.M % g.group == 0 && w[1] * g.group == g.C,
             node.describe(), ": Conv channels do not match: X ", shape_str(x), ", W ",
             shape_str(w), ", group ", g.group, " (need C = W[1]*group and M % group == 0)");
  if (b != nullptr)
    ONYX_CHECK(b->size() == 1 && (*b)[0] == g.M, node.describe(), ": Conv bias ", shape_str(*b),
               " must be [", g.M, "]");
  g.in.assign(x.begin() + 2, x.end());
  g.k.assign(w.begin() + 2, w.end());
  auto ks = node.attr_ints("kernel_shape", g.k);
  ONYX_CHECK(ks == g.k, node.describe(), ": Conv kernel_shape ", shape_str(ks),
             " differs from the weight's spatial shape ", shape_str(g.k));
  g.stride = node.attr_ints("strides", std::vector<int64_t>(g.nsp, 1));
  g.dil = node.attr_ints("dilations", std::vector<int64_t>(g.nsp, 1));
  auto pads = node.attr_ints("pads", std::vector<int64_t>(2 * g.nsp, 0));
  ONYX_CHECK(
      (int)g.stride.size() == g.nsp && (int)g.dil.size() == g.nsp && (int)pads.size() == 2 * g.nsp,
      node.describe(), ": Conv strides ", shape_str(g.stride), ", dilations ", shape_str(g.dil),
      ", pads ", shape_str(pads), " do not fit ", g.nsp, " spatial dimensions");
  for (int i = 0; i < g.nsp; i++)
    ONYX_CHECK(g.stride[i] >= 1 && g.dil[i] >= 1 && pads[i] >= 0 && pads[i + g.nsp] >= 0,
               node.describe(), ": Conv needs strides and dilations >= 1 and pads >= 0, got ",
               shape_str(g.stride), ", ", shape_str(g.dil), ", ", shape_str(pads));
  std::string auto_pad = node.attr_string("auto_pad", "NOTSET");
  g.out.resize(g.nsp);
  g.pad_b.resize(g.nsp);
  g.pad_e.resize(g.nsp);
  for (int i = 0; i < g.nsp; i++) {
    int64_t ek = (g.k[i] - 1) * g.dil[i] + 1;  // dilated kernel extent
    if (auto_pad == "NOTSET" || auto_pad.empty()) {
      g.pad_b[i] = pads[i];
      g.pad_e[i] = pads[i + g.nsp];
    } else if (auto_pad == "VALID") {
      g.pad_b[i] = g.pad_e[i] = 0;
    } else if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
      int64_t o = (g.in[i] + g.stride[i] - 1) / g.stride[i];
      int64_t total = std::max<int64_t>(0, (o - 1) * g.stride[i] + ek - g.in[i]);
      int64_t small = total / 2;  // the odd extra pixel goes at the end for UPPER
      g.pad_b[i] = auto_pad == "SAME_UPPER" ? small : total - small;
      g.pad_e[i] = total - g.pad_b[i];
    } else {
      ONYX_UNSUPPORTED(node.describe(), ": Conv auto_pad '", auto_pad, "'");
    }
    int64_t span = g.in[i] + g.pad_b[i] + g.pad_e[i] - ek;
    ONYX_CHECK(span >= 0, node.describe(), ": Conv kernel ", shape_str(g.k), " (dilations ",
               shape_str(g.dil), ") is larger than the padded input ", shape_str(x));
    g.out[i] = span / g.stride[i] + 1;
  }
  return g;
}

// ---- float32 via oneDNN ----------------------------------------------------------------------

struct CachedConv {
  dnnl::convolution_forward prim;
  dnnl::memory::desc x_md, w_md, b_md, y_md;
  dnnl::memory::desc scratch_md;  // user-mode scratchpad: run from any thread (onednn_scratch.h)
};

std::mutex g_conv_mu;
std::map<std::vector<int64_t>, std::shared_ptr<const CachedConv>> g_conv_cache;

dnnl::memory::format_tag plain_tag(int ndims) {
  using tag = dnnl::memory::format_tag;
  switch (ndims) {
    case 1:
      return tag::a;
    case 3:
      return tag::abc;
    case 4:
      return tag::abcd;
    case 5:
      return tag::abcde;
    default:
      return tag::abcdef;
  }
}

// The primitive for this geometry: float32 X/W, or bf16 X/W with bf16 (float32 Y and bias either
// way). nullptr for bf16 where oneDNN has only its reference implementation or none (CPUs without
// AVX512_BF16): conv_low_precision widens instead.
std::shared_ptr<const CachedConv> get_conv(const ConvGeom& g, bool has_bias, bool bf16 = false) {
  std::vector<int64_t> key{g.nsp, g.N, g.C, g.M, g.group, has_bias, omp_get_max_threads(), bf16};
  for (auto* v : {&g.in, &g.k, &g.stride, &g.dil, &g.pad_b, &g.pad_e})
    key.insert(key.end(), v->begin(), v->end());
  {
    std::lock_guard<std::mutex> lock(g_conv_mu);
    auto it = g_conv_cache.find(key);
    if (it != g_conv_cache.end()) return it->second;
  }
  using dims = dnnl::memory::dims;
  using dt = dnnl::memory::data_type;
  dims xd{g.N, g.C}, yd{g.N, g.M}, wd;
  xd.insert(xd.end(), g.in.begin(), g.in.end());
  yd.insert(yd.end(), g.out.begin(), g.out.end());
  if (g.group > 1)
    wd = {g.group, g.M / g.group, g.C / g.group};  // same bytes as (M, C/g, k...)
  else
    wd = {g.M, g.C};
  wd.insert(wd.end(), g.k.begin(), g.k.end());
  dims dil(g.nsp);
  for (int i = 0; i < g.nsp; i++) dil[i] = g.dil[i] - 1;  // oneDNN counts skipped pixels
  auto e = std::make_shared<CachedConv>();
  const dt xw = bf16 ? dt::bf16 : dt::f32;
  e->x_md = dnnl::memory::desc(xd, xw, plain_tag((int)xd.size()));
  e->w_md = dnnl::memory::desc(wd, xw, plain_tag((int)wd.size()));
  e->y_md = dnnl::memory::desc(yd, dt::f32, plain_tag((int)yd.size()));
  if (has_bias) e->b_md = dnnl::memory::desc({g.M}, dt::f32, plain_tag(1));
  dims stride(g.stride.begin(), g.stride.end()), pb(g.pad_b.begin(), g.pad_b.end()),
      pe(g.pad_e.begin(), g.pad_e.end());
  dnnl::convolution_forward::desc d(dnnl::prop_kind::forward_inference,
                                    dnnl::algorithm::convolution_direct, e->x_md, e->w_md, e->b_md,
                                    e->y_md, stride, dil, pb, pe);
  std::shared_ptr<const CachedConv> made;  // stays null for an unusable bf16 one (cached as such)
  try {
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    dnnl::convolution_forward::primitive_desc pd(d, attr, conv_onednn::engine());
    if (!bf16 || std::string(pd.impl_info_str()).find("ref") == std::string::npos) {
      e->scratch_md = pd.scratchpad_desc();
      e->prim = dnnl::convolution_forward(pd);
      made = e;
    }
  } catch (const dnnl::error&) {
    if (!bf16) throw;  // a float32 convolution oneDNN rejects is an error as before
  }
  std::lock_guard<std::mutex> lock(g_conv_mu);
  if (g_conv_cache.size() >= 1024) g_conv_cache.clear();
  g_conv_cache.emplace(key, made);
  return made;
}

// Runs a cached primitive: X and W float32 or bf16 bits (as it was made), B and Y float32.
void run_conv(const CachedConv& e, const void* X, const void* W, const float* B, float* Y) {
  thread_local dnnl::stream stream(conv_onednn::engine());
  auto& eng = conv_onednn::engine();
  std::unordered_map<int, dnnl::memory> args{
      {DNNL_ARG_SRC, dnnl::memory(e.x_md, eng, const_cast<void*>(X))},
      {DNNL_ARG_WEIGHTS, dnnl::memory(e.w_md, eng, const_cast<void*>(W))},
      {DNNL_ARG_DST, dnnl::memory(e.y_md, eng, Y)}};
  if (B != nullptr) args[DNNL_ARG_BIAS] = dnnl::memory(e.b_md, eng, const_cast<float*>(B));
  if (const size_t bytes = e.scratch_md.get_size(); bytes > 0)
    args[DNNL_ARG_SCRATCHPAD] =
        dnnl::memory(e.scratch_md, eng, kernels::onednn_thread_scratch(bytes));
  e.prim.execute(stream, args);
  stream.wait();
}

void conv_f32(const ConvGeom& g, const float* X, const float* W, const float* B, float* Y) {
  if (conv_onednn::preferred(g, conv_onednn::Pass::Forward)) {
    conv_onednn::forward(g, X, W, B, Y);
    return;
  }
  run_conv(*get_conv(g, B != nullptr), X, W, B, Y);
}

// Mixed precision (KernelContext::bf16_gemm), as PyTorch's CPU autocast runs conv: X and W
// rounded to bf16 (kernels::f32_to_bf16), products accumulated in float32, the bias added in
// float32. oneDNN's bf16 convolution where the CPU has AVX512_BF16 (kernels::bf16_gemm_native());
// elsewhere the rounded values widened back to float32 (exact) for the float32 convolution: the
// same products, a different accumulation order.
void conv_low_precision(kernels::LowPrecision lp, const ConvGeom& g, const float* X, int64_t nx,
                        const float* W, int64_t nw, const float* B, float* Y) {
  const bool native = lp == kernels::LowPrecision::Bf16 && kernels::bf16_gemm_native();
  if (native && conv_onednn::preferred(g, conv_onednn::Pass::Forward) &&
      conv_onednn::forward(g, X, W, B, Y, /*bf16=*/true))
    return;
  if (native)
    if (auto e = get_conv(g, B != nullptr, /*bf16=*/true)) {
      std::vector<uint16_t> xh((size_t)nx), wh((size_t)nw);
      kernels::f32_to_bf16(X, xh.data(), nx);
      kernels::f32_to_bf16(W, wh.data(), nw);
      return run_conv(*e, xh.data(), wh.data(), B, Y);
    }
  std::vector<float> xf((size_t)nx), wf((size_t)nw);
  kernels::round_to(lp, X, xf.data(), nx);
  kernels::round_to(lp, W, wf.data(), nw);
  conv_f32(g, xf.data(), wf.data(), B, Y);
}

// ---- other dtypes ----------------------------------------------------------------------------

// Direct loop (float64): every output pixel sums its receptive field. Spatial dims are padded to
// three (size 1, stride 1) so one loop nest serves 1-D, 2-D and 3-D.
template <class T>
void conv_direct(const ConvGeom& g, const T* X, const T* W, const T* B, T* Y) {
  auto pad3 = [&](const std::vector<int64_t>& v, int64_t fill) {
    std::vector<int64_t> r(3 - g.nsp, fill);
    r.insert(r.end(), v.begin(), v.end());
    return r;
  };
  auto in = pad3(g.in, 1), k = pad3(g.k, 1), out = pad3(g.out, 1), st = pad3(g.stride, 1),
       dl = pad3(g.dil, 1), pb = pad3(g.pad_b, 0);
  const int64_t Cg = g.C / g.group, Mg = g.M / g.group;
  const int64_t in_sz = in[0] * in[1] * in[2], out_sz = out[0] * out[1] * out[2],
                k_sz = k[0] * k[1] * k[2];
  parallel_for(g.N * g.M, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; p++) {
      int64_t n = p / g.M, m = p % g.M, grp = m / Mg;
      T* y = Y + p * out_sz;
      for (int64_t o0 = 0; o0 < out[0]; o0++)
        for (int64_t o1 = 0; o1 < out[1]; o1++)
          for (int64_t o2 = 0; o2 < out[2]; o2++) {
            T acc = B ? B[m] : T(0);
            for (int64_t c = 0; c < Cg; c++) {
              const T* x = X + (n * g.C + grp * Cg + c) * in_sz;
              const T* w = W + (m * Cg + c) * k_sz;
              for (int64_t k0 = 0; k0 < k[0]; k0++) {
                int64_t i0 = o0 * st[0] - pb[0] + k0 * dl[0];
                if (i0 < 0 || i0 >= in[0]) continue;
                for (int64_t k1 = 0; k1 < k[1]; k1++) {
                  int64_t i1 = o1 * st[1] - pb[1] + k1 * dl[1];
                  if (i1 < 0 || i1 >= in[1]) continue;
                  for (int64_t k2 = 0; k2 < k[2]; k2++) {
                    int64_t i2 = o2 * st[2] - pb[2] + k2 * dl[2];
                    if (i2 < 0 || i2 >= in[2]) continue;
                    acc += x[(i0 * in[1] + i1) * in[2] + i2] * w[(k0 * k[1] + k1) * k[2] + k2];
                  }
                }
              }
            }
            y[(o0 * out[1] + o1) * out[2] + o2] = acc;
          }
    }
  });
}

void conv_infer(InferContext& ctx) {
  const auto& x = ctx.input(0);
  const auto& w = ctx.input(1);
  ONYX_CHECK(x.dtype == w.dtype, ctx.node.describe(), ": Conv X is ", dtype_name(x.dtype),
             " but W is ", dtype_name(w.dtype));
  const Shape* b = ctx.has_input(2) ? &ctx.input(2).shape : nullptr;
  ctx.set_output(0, x.dtype, conv_geom(ctx.node, x.shape, w.shape, b).out_shape());
}

void conv_compute(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Tensor& w = ctx.input(1);
  const Tensor* b = ctx.has_input(2) ? &ctx.input(2) : nullptr;
  Tensor& y = ctx.output(0);
  ConvGeom g = conv_geom(ctx.node, x.shape(), w.shape(), b ? &b->shape() : nullptr);
  if (y.numel() == 0) return;
  if (x.numel() == 0 || w.numel() == 0) {  // no input channels: the output is the bias
    int64_t per = y.numel() / (g.N * g.M);
    for (int64_t p = 0; p < g.N * g.M; p++) {
      double v = b ? b->get_as_double(p % g.M) : 0.0;
      for (int64_t i = 0; i < per; i++) {
        int64_t idx = p * per + i;
        switch (y.dtype()) {
          case DType::Float32:
            y.data<float>()[idx] = (float)v;
            break;
          case DType::Float64:
            y.data<double>()[idx] = v;
            break;
          case DType::Float16:
            y.data<uint16_t>()[idx] = float_to_half((float)v);
            break;
          case DType::BFloat16:
            y.data<uint16_t>()[idx] = float_to_bf16((float)v);
            break;
          default:
            ONYX_UNSUPPORTED(ctx.node.describe(), ": Conv of dtype ", dtype_name(y.dtype()));
        }
      }
    }
    return;
  }
  switch (x.dtype()) {
    case DType::Float32:
      if (kernels::low_precision(ctx) != kernels::LowPrecision::None)
        return conv_low_precision(kernels::low_precision(ctx), g, x.data<float>(), x.numel(),
                                  w.data<float>(), w.numel(), b ? b->data<float>() : nullptr,
                                  y.data<float>());
      return conv_f32(g, x.data<float>(), w.data<float>(), b ? b->data<float>() : nullptr,
                      y.data<float>());
    case DType::Float64:
      return conv_direct<double>(g, x.data<double>(), w.data<double>(),
                                 b ? b->data<double>() : nullptr, y.data<double>());
    case DType::Float16:
    case DType::BFloat16: {
      auto xf = to_f32(x), wf = to_f32(w);
      std::vector<float> bf, yf(y.numel());
      if (b) bf = to_f32(*b);
      conv_f32(g, xf.data(), wf.data(), b ? bf.data() : nullptr, yf.data());
      from_f32(yf, y);
      return;
    }
    default:
      ONYX_UNSUPPORTED(ctx.node.describe(), ": Conv of dtype ", dtype_name(x.dtype()));
  }
}

// ---- onyx.ConvGradInput / onyx.ConvGradWeight ---------------------------------------------------
// pads are explicit (begin..., end...): the gradient rule resolves auto_pad.

// Geometry of X (N,C,in...) * W (M,C/group,k...) → dY (N,M,out...) with the spatial dims
// left-padded to three (size 1, stride 1, no pad) so one loop nest serves 1-D, 2-D and 3-D.
struct ConvG {
  int64_t N = 0, C = 0, M = 0, group = 1, Cg = 0, Mg = 0;
  int64_t in[3], k[3], out[3], st[3], dl[3], pb[3];
  int64_t in_sz = 1, k_sz = 1, out_sz = 1;
  bool identity_col = true;  // 1x1 kernel, stride 1, no pad: im2col is the input itself
  // X as the image, dY's positions as the columns (conv_common.h).
  conv_detail::ColGeom cols() const {
    return conv_detail::col_geom(in, in_sz, out, out_sz, k, k_sz, st, dl, pb);
  }
};

ConvG conv_g(const ir::Node& node, const Shape& x, const Shape& w, const Shape& dy) {
  ONYX_CHECK(x.size() >= 3 && x.size() <= 5 && w.size() == x.size() && dy.size() == x.size(),
             node.describe(), ": conv gradient shapes do not fit: X ", shape_str(x), ", W ",
             shape_str(w), ", dY ", shape_str(dy));
  int nsp = (int)x.size() - 2;
  ConvG g;
  g.N = x[0];
  g.C = x[1];
  g.M = w[0];
  g.group = node.attr_int("group", 1);
  ONYX_CHECK(g.group >= 1 && g.C % g.group == 0 && g.M % g.group == 0 && w[1] * g.group == g.C &&
                 dy[0] == g.N && dy[1] == g.M,
             node.describe(), ": conv gradient channels do not match: X ", shape_str(x), ", W ",
             shape_str(w), ", dY ", shape_str(dy), ", group ", g.group);
  g.Cg = g.C / g.group;
  g.Mg = g.M / g.group;
  auto st = node.attr_ints("strides", std::vector<int64_t>(nsp, 1));
  auto dl = node.attr_ints("dilations", std::vector<int64_t>(nsp, 1));
  auto pads = node.attr_ints("pads", std::vector<int64_t>(2 * nsp, 0));
  ONYX_CHECK((int)st.size() == nsp && (int)dl.size() == nsp && (int)pads.size() == 2 * nsp,
             node.describe(), ": strides ", shape_str(st), ", dilations ", shape_str(dl), ", pads ",
             shape_str(pads), " do not fit ", nsp, " spatial dims");
  int off = 3 - nsp;
  for (int i = 0; i < 3; i++) {
    int s = i - off;
    bool real = s >= 0;
    g.in[i] = real ? x[2 + s] : 1;
    g.k[i] = real ? w[2 + s] : 1;
    g.out[i] = real ? dy[2 + s] : 1;
    g.st[i] = real ? st[s] : 1;
    g.dl[i] = real ? dl[s] : 1;
    g.pb[i] = real ? pads[s] : 0;
    int64_t pe = real ? pads[s + nsp] : 0;
    ONYX_CHECK(g.st[i] >= 1 && g.dl[i] >= 1 && g.pb[i] >= 0 && pe >= 0, node.describe(),
               ": bad strides/dilations/pads ", shape_str(st), " ", shape_str(dl), " ",
               shape_str(pads));
    int64_t span = g.in[i] + g.pb[i] + pe - ((g.k[i] - 1) * g.dl[i] + 1);
    int64_t o = span < 0 ? 0 : span / g.st[i] + 1;
    ONYX_CHECK(o == g.out[i], node.describe(), ": dY ", shape_str(dy),
               " does not match the conv output for X ", shape_str(x), ", W ", shape_str(w));
    g.in_sz *= g.in[i];
    g.k_sz *= g.k[i];
    g.out_sz *= g.out[i];
    g.identity_col = g.identity_col && g.k[i] == 1 && g.st[i] == 1 && g.pb[i] == 0 && pe == 0;
  }
  return g;
}

// The geometry of a gradient node's convolution (X shape x, W shape w) when its float32 `pass`
// (writing `out`) runs on oneDNN's blocked layouts (conv_onednn::preferred): in float32, or in
// bf16 mixed precision where the CPU has native bf16 (then `bf16` is set; a geometry oneDNN has
// no fast bf16 implementation for still falls back, from the conv_onednn call).
std::optional<ConvGeom> blocked_pass(const KernelContext& ctx, const Tensor& out, const Shape& x,
                                     const Shape& w, conv_onednn::Pass pass, bool& bf16) {
  const kernels::LowPrecision lp = kernels::low_precision(ctx);
  bf16 = lp == kernels::LowPrecision::Bf16 && kernels::bf16_gemm_native();
  if (out.dtype() != DType::Float32 || (lp != kernels::LowPrecision::None && !bf16))
    return std::nullopt;
  ConvGeom d = conv_geom(ctx.node, x, w, nullptr);
  if (!conv_onednn::preferred(d, pass)) return std::nullopt;
  return d;
}

// dX (N, C, in...) from dY (N, M, out...) and W (M, Cg, k...):
// per sample and group, dcol (Cg·k, out) = W_g^T (Cg·k, Mg) · dY_ng (Mg, out), then col2im.
template <class T>
void conv_grad_input(const ConvG& g, kernels::LowPrecision lp, const T* dY, const T* W, T* dX) {
  const int64_t ck = g.Cg * g.k_sz;
  const conv_detail::ColGeom cg = g.cols();
  auto one_sample = [&](int64_t n, std::vector<T>& dcol) {
    for (int64_t grp = 0; grp < g.group; grp++) {
      const T* w = W + grp * g.Mg * ck;
      const T* dy = dY + (n * g.M + grp * g.Mg) * g.out_sz;
      T* dx = dX + (n * g.C + grp * g.Cg) * g.in_sz;
      if (g.identity_col) {
        kernels::gemm_maybe_low<T>(lp, true, false, ck, g.out_sz, g.Mg, T(1), w, ck, dy, g.out_sz,
                                   T(0), dx, g.in_sz);
        continue;
      }
      dcol.resize(ck * g.out_sz);
      kernels::gemm_maybe_low<T>(lp, true, false, ck, g.out_sz, g.Mg, T(1), w, ck, dy, g.out_sz,
                                 T(0), dcol.data(), g.out_sz);
      std::fill(dx, dx + g.Cg * g.in_sz, T(0));
      // Threads own channels, so no two write the same element.
      parallel_for(g.Cg, 1, [&](int64_t c0, int64_t c1) {
        conv_detail::col2im_add<T>(cg, dcol.data(), dx, c0, c1);
      });
    }
  };
  int nt = num_threads();
  if (g.N >= 2 && nt > 1) {
    // Samples in parallel (each thread owns its samples' dX); GEMMs run single-threaded inside.
    parallel_for(g.N, 1, [&](int64_t n0, int64_t n1) {
      std::vector<T> dcol;
      for (int64_t n = n0; n < n1; n++) one_sample(n, dcol);
    });
  } else {
    std::vector<T> dcol;
    for (int64_t n = 0; n < g.N; n++) one_sample(n, dcol);
  }
}

// dW (M, Cg, k...) = Σ_n dY_ng (Mg, out) · col_ng^T (out, Cg·k) per group. Samples are split into
// one contiguous range per thread; each range sums into its own buffer (range 0 into dW), and the
// buffers are added in range order — deterministic for a given thread count.
template <class T>
void conv_grad_weight(const ConvG& g, kernels::LowPrecision lp, const T* dY, const T* X, T* dW) {
  const int64_t ck = g.Cg * g.k_sz, wsz = g.M * ck;
  const conv_detail::ColGeom cg = g.cols();
  auto range = [&](int64_t n0, int64_t n1, T* acc) {
    std::vector<T> col;
    if (!g.identity_col) col.resize(ck * g.out_sz);
    for (int64_t n = n0; n < n1; n++)
      for (int64_t grp = 0; grp < g.group; grp++) {
        const T* x = X + (n * g.C + grp * g.Cg) * g.in_sz;
        const T* dy = dY + (n * g.M + grp * g.Mg) * g.out_sz;
        const T* cp = x;
        if (!g.identity_col) {
          conv_detail::im2col<T>(cg, g.Cg, x, col.data());
          cp = col.data();
        }
        kernels::gemm_maybe_low<T>(lp, false, true, g.Mg, ck, g.out_sz, T(1), dy, g.out_sz, cp,
                                   g.out_sz, n == n0 ? T(0) : T(1), acc + grp * g.Mg * ck, ck);
      }
    if (n1 <= n0) std::fill(acc, acc + wsz, T(0));
  };
  int64_t parts = std::min<int64_t>(num_threads(), g.N);
  if (parts <= 1 || omp_in_parallel()) {
    range(0, g.N, dW);
    return;
  }
  std::vector<T> partial((parts - 1) * wsz);
  int64_t per = (g.N + parts - 1) / parts;
#pragma omp parallel for num_threads((int)parts) schedule(static, 1)
  for (int64_t p = 0; p < parts; p++) {
    int64_t n0 = std::min(g.N, p * per), n1 = std::min(g.N, n0 + per);
    range(n0, n1, p == 0 ? dW : partial.data() + (p - 1) * wsz);
  }
  parallel_for(wsz, 16384, [&](int64_t b, int64_t e) {
    for (int64_t p = 1; p < parts; p++) {
      const T* src = partial.data() + (p - 1) * wsz;
#pragma omp simd
      for (int64_t i = b; i < e; i++) dW[i] += src[i];
    }
  });
}

void conv_grad_input_infer(InferContext& ctx) {
  const auto& dy = ctx.input(0);
  const auto& w = ctx.input(1);
  check_float(ctx.node, dy.dtype, w.dtype);
  Shape x = ctx.node.attr_ints_required("input_shape");
  conv_g(ctx.node, x, w.shape, dy.shape);
  ctx.set_output(0, dy.dtype, x);
}

void conv_grad_input_compute(KernelContext& ctx) {
  const Tensor& dy = ctx.input(0);  // (N, M, out...)
  const Tensor& w = ctx.input(1);   // (M, C/group, k...)
  Tensor& dx = ctx.output(0);       // (N, C, in...)
  ConvG g = conv_g(ctx.node, dx.shape(), w.shape(), dy.shape());
  if (dx.numel() == 0) return;
  if (dy.numel() == 0 || w.numel() == 0) {
    std::memset(dx.raw(), 0, dx.nbytes());
    return;
  }
  bool bf16 = false;
  if (auto d = blocked_pass(ctx, dx, dx.shape(), w.shape(), conv_onednn::Pass::GradInput, bf16))
    if (conv_onednn::grad_input(*d, dy.data<float>(), w.data<float>(), dx.data<float>(), bf16))
      return;
  dispatch_float(
      ctx.node, dx,
      [&](auto* D, auto* W, auto* X) {
        using T = std::remove_cv_t<std::remove_pointer_t<decltype(X)>>;
        conv_grad_input<T>(g, kernels::low_precision(ctx), D, W, X);
      },
      dy, w);
}

void conv_grad_weight_infer(InferContext& ctx) {
  const auto& dy = ctx.input(0);
  const auto& x = ctx.input(1);
  check_float(ctx.node, dy.dtype, x.dtype);
  ONYX_CHECK(x.rank() >= 3 && dy.rank() == x.rank(), ctx.node.describe(), ": X ",
             shape_str(x.shape), " and dY ", shape_str(dy.shape), " do not fit a conv");
  int64_t group = ctx.node.attr_int("group", 1);
  ONYX_CHECK(group >= 1 && x.shape[1] % group == 0, ctx.node.describe(), ": group ", group,
             " does not divide the channels of X ", shape_str(x.shape));
  Shape w{dy.shape[1], x.shape[1] / group};
  auto ks = ctx.node.attr_ints_required("kernel_shape");
  w.insert(w.end(), ks.begin(), ks.end());
  conv_g(ctx.node, x.shape, w, dy.shape);
  ctx.set_output(0, dy.dtype, w);
}

// dW of dY and X into `dw`: oneDNN's blocked primitive where it is preferred (float32), else
// im2col + GEMM.
void weight_gradient(KernelContext& ctx, const ConvG& g, const Tensor& dy, const Tensor& x,
                     Tensor& dw) {
  bool bf16 = false;
  if (auto d = blocked_pass(ctx, dw, x.shape(), dw.shape(), conv_onednn::Pass::GradWeight, bf16))
    if (conv_onednn::grad_weight(*d, dy.data<float>(), x.data<float>(), dw.data<float>(), bf16))
      return;
  dispatch_float(
      ctx.node, dw,
      [&](auto* D, auto* X, auto* W) {
        using T = std::remove_cv_t<std::remove_pointer_t<decltype(W)>>;
        conv_grad_weight<T>(g, kernels::low_precision(ctx), D, X, W);
      },
      dy, x);
}

void conv_grad_weight_compute(KernelContext& ctx) {
  const Tensor& dy = ctx.input(0);  // (N, M, out...)
  const Tensor& x = ctx.input(1);   // (N, C, in...)
  Tensor& dw = ctx.output(0);       // (M, C/group, k...)
  ConvG g = conv_g(ctx.node, x.shape(), dw.shape(), dy.shape());
  if (dw.numel() == 0) return;
  if (ctx.accumulates(0)) {
    // dW += the weight gradient (a bound gradient, micro-batches accumulating): computed into a
    // scratch tensor, then added, so the sum is exactly dW + (gradient).
    ONYX_CHECK(dw.dtype() == DType::Float32, ctx.node.describe(),
               ": accumulation supports float32 gradients, got ", dtype_name(dw.dtype()));
    if (dy.numel() == 0 || x.numel() == 0) return;
    Tensor tmp(DType::Float32, dw.shape());
    weight_gradient(ctx, g, dy, x, tmp);
    const float* src = tmp.data<float>();
    float* out = dw.data<float>();
    parallel_for(dw.numel(), 1 << 15, [&](int64_t b, int64_t e) {
#pragma omp simd
      for (int64_t i = b; i < e; i++) out[i] += src[i];
    });
    return;
  }
  if (dy.numel() == 0 || x.numel() == 0) {
    std::memset(dw.raw(), 0, dw.nbytes());
    return;
  }
  weight_gradient(ctx, g, dy, x, dw);
}

}  // namespace

ONYX_REGISTER_KERNELS(conv, Cpu) {
  OpTraits& conv = r.add("", "Conv", OpKernel{conv_infer, conv_compute, {}});
  conv.precision = OpTraits::Precision::LowPrecision;
  conv.flops = [](const ir::Node&, const std::vector<const TensorMeta*>& in,
                  const std::vector<const TensorMeta*>& out) {  // per output: C/group · kernel
    return in.size() > 1 && in[1] && out[0] && in[1]->shape.size() >= 2
               ? 2 * shape_product(out[0]->shape) * shape_product(in[1]->shape, 1)
               : 0.0;
  };
  using Metas = std::vector<const TensorMeta*>;
  constexpr auto low = OpTraits::Precision::LowPrecision;
  OpTraits& gi =
      r.add("onyx", "ConvGradInput", OpKernel{conv_grad_input_infer, conv_grad_input_compute, {}});
  gi.precision = low;
  gi.flops = [](const ir::Node&, const Metas& in, const Metas&) {
    // dY (N,M,out...) against W (M,C/g,k...)
    return in[0] && in.size() > 1 && in[1] && in[1]->shape.size() >= 2
               ? 2 * shape_product(in[0]->shape) * shape_product(in[1]->shape, 1)
               : 0.0;
  };
  // ConvGradWeight can add into a bound weight gradient (gradient_into_buffer.cc).
  OpTraits& gw = r.add("onyx", "ConvGradWeight",
                       OpKernel{conv_grad_weight_infer, conv_grad_weight_compute, {}, {}, {0}});
  gw.precision = low;
  gw.flops = [](const ir::Node&, const Metas& in, const Metas& out) {
    return in[0] && out[0] && !out[0]->shape.empty()
               ? 2 * shape_product(out[0]->shape) * shape_product(in[0]->shape) /
                     std::max<double>(1, (double)out[0]->shape[0])
               : 0.0;
  };
}

}  // namespace onyx::kernels
