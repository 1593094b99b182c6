// kernels/conv/conv_transpose.cc — ConvTranspose (ONNX, opsets 1–22): 1-D, 2-D and 3-D,
// NC[D]H[W] layout, X (N, C, in...) * W (C, M/group, k...) [+ B (M)] -> Y (N, M, out...), groups,
// strides, dilations, explicit pads, output_padding, output_shape and SAME_UPPER / SAME_LOWER.
// Output size and pads follow the ONNX reference (onnx/reference/ops/op_conv_transpose.py):
// explicit pads (default 0) give out = st·(in−1) + output_padding + (k−1)·dil + 1 − pads unless
// output_shape sets it; with auto_pad SAME_* and no pads the pads come from output_shape
// (default in·st), the odd pixel at the end for SAME_UPPER.
//
// Per sample and group: col (M/group·k, in) = W_gᵀ (M/group·k, C/group) · X_g (C/group, in) as one
// GEMM (kernels::gemm: sgemm for float32, a plain loop for float64), then col2im (conv_common.h,
// shared with Conv's gradients) adds each column into the output window it covers (output
// positions outside [0, out) are dropped, so negative or output_shape-implied end padding needs no
// special case). Samples are threaded when there are several (each owns its output); one sample
// threads the GEMM and col2im over output channels. float16/bfloat16 are converted to float32
// around the same code. The backward is Conv and onyx.ConvGradWeight
// (autodiff/gradients/nn_spatial.cc).
// Mixed precision (KernelContext::bf16_gemm, TrainingArguments.bf16; float32 tensors): the GEMM
// takes X and W rounded to bf16 with float32 accumulation (kernels::gemm_as_bf16: oneDNN's bf16
// matmul on AVX512_BF16, else the rounded values widened), as PyTorch's CPU autocast runs
// conv_transpose; the bias add and col2im's sums stay float32 (KernelContext::fp16_gemm: float16
// instead, emulated). Its gradients (Conv, ConvGradWeight) round theirs in conv.cc.
#include <algorithm>
#include <string>
#include <vector>

#include "kernels/conv/conv_common.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/nn_util.h"
#include "kernels/kernel_api.h"

namespace onyx::kernels {
namespace {

using namespace nnutil;

struct DeconvGeom {
  int nsp = 0;
  int64_t N = 0, C = 0, M = 0, group = 1, Cg = 0, Mg = 0;
  int64_t in[3] = {1, 1, 1}, k[3] = {1, 1, 1}, out[3] = {1, 1, 1}, st[3] = {1, 1, 1},
          dl[3] = {1, 1, 1}, pb[3] = {0, 0, 0};
  int64_t in_sz = 1, k_sz = 1, out_sz = 1;
  Shape out_shape() const {
    Shape s{N, M};
    for (int i = 3 - nsp; i < 3; i++) s.push_back(out[i]);
    return s;
  }
  // Y as the image, X's positions as the columns (conv_common.h): column i adds into output
  // position i·st − pb + kk·dl.
  conv_detail::ColGeom cols() const {
    return conv_detail::col_geom(out, out_sz, in, in_sz, k, k_sz, st, dl, pb);
  }
};

DeconvGeom deconv_geom(const ir::Node& node, const Shape& x, const Shape& w, const Shape* b) {
  ONYX_CHECK(x.size() >= 3 && x.size() <= 5, node.describe(),
             ": ConvTranspose input X must be (N, C, D1[, D2[, D3]]), got ", shape_str(x));
  ONYX_CHECK(w.size() == x.size(), node.describe(), ": ConvTranspose weight W ", shape_str(w),
             " must have the rank of X ", shape_str(x));
  DeconvGeom g;
  int nsp = (int)x.size() - 2;
  g.nsp = nsp;
  g.N = x[0];
  g.C = x[1];
  g.group = node.attr_int("group", 1);
  ONYX_CHECK(g.group >= 1 && w[0] == g.C && g.C % g.group == 0, node.describe(),
             ": ConvTranspose channels do not match: X ", shape_str(x), ", W ", shape_str(w),
             ", group ", g.group, " (need W[0] = C and C % group == 0)");
  g.Cg = g.C / g.group;
  g.Mg = w[1];
  g.M = w[1] * g.group;
  if (b != nullptr)
    ONYX_CHECK(b->size() == 1 && (*b)[0] == g.M, node.describe(), ": ConvTranspose bias ",
               shape_str(*b), " must be [", g.M, "]");
  std::vector<int64_t> ks(w.begin() + 2, w.end());
  auto kattr = node.attr_ints("kernel_shape", ks);
  ONYX_CHECK(kattr == ks, node.describe(), ": ConvTranspose kernel_shape ", shape_str(kattr),
             " differs from the weight's spatial shape ", shape_str(ks));
  auto st = node.attr_ints("strides", std::vector<int64_t>(nsp, 1));
  auto dl = node.attr_ints("dilations", std::vector<int64_t>(nsp, 1));
  auto op = node.attr_ints("output_padding", std::vector<int64_t>(nsp, 0));
  auto os = node.attr_ints("output_shape");
  if ((int)os.size() == nsp + 2) os.erase(os.begin(), os.begin() + 2);
  std::string auto_pad = node.attr_string("auto_pad", "NOTSET");
  ONYX_CHECK((int)st.size() == nsp && (int)dl.size() == nsp && (int)op.size() >= nsp &&
                 (os.empty() || (int)os.size() == nsp),
             node.describe(), ": ConvTranspose strides ", shape_str(st), ", dilations ",
             shape_str(dl), ", output_padding ", shape_str(op), ", output_shape ", shape_str(os),
             " do not fit ", nsp, " spatial dimensions");
  bool same = auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER";
  if (!same && auto_pad != "NOTSET" && auto_pad != "VALID" && !auto_pad.empty())
    ONYX_UNSUPPORTED(node.describe(), ": ConvTranspose auto_pad '", auto_pad, "'");
  std::vector<int64_t> pads;
  bool have_pads = node.has_attr("pads");
  if (have_pads) {
    pads = node.attr_ints("pads");
    ONYX_CHECK((int)pads.size() == 2 * nsp, node.describe(), ": ConvTranspose pads ",
               shape_str(pads), " do not fit ", nsp, " spatial dimensions");
  }
  int off = 3 - nsp;
  for (int s = 0; s < nsp; s++) {
    int i = s + off;
    ONYX_CHECK(st[s] >= 1 && dl[s] >= 1 && op[s] >= 0, node.describe(),
               ": ConvTranspose needs strides and dilations >= 1 and output_padding >= 0, got ",
               shape_str(st), ", ", shape_str(dl), ", ", shape_str(op));
    g.in[i] = x[2 + s];
    g.k[i] = ks[s];
    g.st[i] = st[s];
    g.dl[i] = dl[s];
    int64_t ek = (ks[s] - 1) * dl[s] + 1;
    int64_t natural = st[s] * (g.in[i] - 1) + op[s] + ek;
    if (!have_pads && same) {
      int64_t o = os.empty() ? g.in[i] * st[s] : os[s];
      int64_t total = natural - o;
      auto floordiv2 = [](int64_t v) { return v >= 0 ? v / 2 : -((-v + 1) / 2); };
      g.pb[i] = auto_pad == "SAME_UPPER" ? floordiv2(total) : total - floordiv2(total);
      g.out[i] = o;
    } else {
      int64_t pb = have_pads && auto_pad != "VALID" ? pads[s] : 0;
      int64_t pe = have_pads && auto_pad != "VALID" ? pads[s + nsp] : 0;
      ONYX_CHECK(pb >= 0 && pe >= 0, node.describe(), ": ConvTranspose pads must be >= 0, got ",
                 shape_str(pads));
      g.pb[i] = pb;
      g.out[i] = os.empty() ? natural - pb - pe : os[s];
    }
    ONYX_CHECK(g.out[i] >= 0, node.describe(), ": ConvTranspose output size ", g.out[i],
               " is negative (input ", shape_str(x), ", weight ", shape_str(w), ")");
  }
  for (int i = 0; i < 3; i++) {
    g.in_sz *= g.in[i];
    g.k_sz *= g.k[i];
    g.out_sz *= g.out[i];
  }
  return g;
}

template <class T>
void deconv(const DeconvGeom& g, const T* X, const T* W, const T* B, T* Y,
            kernels::LowPrecision lp = kernels::LowPrecision::None) {
  const int64_t mk = g.Mg * g.k_sz;
  const conv_detail::ColGeom cg = g.cols();
  auto init_bias = [&](int64_t n) {
    for (int64_t m = 0; m < g.M; m++) {
      T* y = Y + (n * g.M + m) * g.out_sz;
      std::fill(y, y + g.out_sz, B ? B[m] : T(0));
    }
  };
  auto one = [&](int64_t n, std::vector<T>& col, bool threaded) {
    init_bias(n);
    for (int64_t grp = 0; grp < g.group; grp++) {
      const T* w = W + grp * g.Cg * mk;                   // (Cg, Mg·k)
      const T* x = X + (n * g.C + grp * g.Cg) * g.in_sz;  // (Cg, in)
      T* y = Y + (n * g.M + grp * g.Mg) * g.out_sz;       // (Mg, out)
      col.resize(mk * g.in_sz);
      kernels::gemm_maybe_low<T>(lp, true, false, mk, g.in_sz, g.Cg, T(1), w, mk, x, g.in_sz, T(0),
                                 col.data(), g.in_sz);
      if (threaded)
        parallel_for(g.Mg, 1, [&](int64_t m0, int64_t m1) {
          conv_detail::col2im_add<T>(cg, col.data(), y, m0, m1);
        });
      else
        conv_detail::col2im_add<T>(cg, col.data(), y, 0, g.Mg);
    }
  };
  if (g.N >= 2 && num_threads() > 1) {
    parallel_for(g.N, 1, [&](int64_t n0, int64_t n1) {
      std::vector<T> col;
      for (int64_t n = n0; n < n1; n++) one(n, col, false);
    });
  } else {
    std::vector<T> col;
    for (int64_t n = 0; n < g.N; n++) one(n, col, true);
  }
}

void deconv_infer(InferContext& ctx) {
  const auto& x = ctx.input(0);
  const auto& w = ctx.input(1);
  ONYX_CHECK(x.dtype == w.dtype, ctx.node.describe(), ": ConvTranspose X is ", dtype_name(x.dtype),
             " but W is ", dtype_name(w.dtype));
  const Shape* b = ctx.has_input(2) ? &ctx.input(2).shape : nullptr;
  ctx.set_output(0, x.dtype, deconv_geom(ctx.node, x.shape, w.shape, b).out_shape());
}

void deconv_compute(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Tensor& w = ctx.input(1);
  const Tensor* b = ctx.has_input(2) ? &ctx.input(2) : nullptr;
  Tensor& y = ctx.output(0);
  DeconvGeom g = deconv_geom(ctx.node, x.shape(), w.shape(), b ? &b->shape() : nullptr);
  if (y.numel() == 0) return;
  switch (x.dtype()) {
    case DType::Float32:
      return deconv<float>(g, x.data<float>(), w.data<float>(), b ? b->data<float>() : nullptr,
                           y.data<float>(), kernels::low_precision(ctx));
    case DType::Float64:
      return deconv<double>(g, x.data<double>(), w.data<double>(), b ? b->data<double>() : nullptr,
                            y.data<double>());
    case DType::Float16:
    case DType::BFloat16: {
      auto xf = to_f32(x), wf = to_f32(w);
      std::vector<float> bf, yf(y.numel());
      if (b) bf = to_f32(*b);
      deconv<float>(g, xf.data(), wf.data(), b ? bf.data() : nullptr, yf.data());
      from_f32(yf, y);
      return;
    }
    default:
      ONYX_UNSUPPORTED(ctx.node.describe(), ": ConvTranspose of dtype ", dtype_name(x.dtype()));
  }
}

}  // namespace

ONYX_REGISTER_KERNELS(conv_transpose, Cpu) {
  OpTraits& t = r.add("", "ConvTranspose", OpKernel{deconv_infer, deconv_compute, {}});
  t.precision = OpTraits::Precision::LowPrecision;
  t.flops = [](const ir::Node&, const std::vector<const TensorMeta*>& in,
               const std::vector<const TensorMeta*>&) {  // per input element: M/group · kernel
    return in.size() > 1 && in[0] && in[1] && in[1]->shape.size() >= 2
               ? 2 * shape_product(in[0]->shape) * shape_product(in[1]->shape, 1)
               : 0.0;
  };
}

}  // namespace onyx::kernels
