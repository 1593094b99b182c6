// kernels/loss/loss.cc — SoftmaxCrossEntropyLoss and NegativeLogLikelihoodLoss (opsets 12–18):
// inputs (N, C, d1..dk), targets (N, d1..dk), optional class weights (C), ignore_index,
// reduction none/sum/mean, and SCE's optional log_prob output; and their fused gradients ("onyx"
// domain, emitted by the rules in autodiff/gradients/nn.cc):
//   SoftmaxCrossEntropyLossGrad(dloss, logits | log_prob, labels, [weights]) -> dlogits
//   NLLLossGrad(dloss, labels, [weights])  input_shape  -> d input (a scatter of -dloss * w)
// Hand-written because the LM-head loss over (B·T, vocab) float32 logits is a hot path: rows are
// threaded, and when log_prob is not requested the [tokens × vocab] log-softmax is never
// materialized (one max pass and one exp-sum pass per row, then the target's logit; the gradient
// recomputes the softmax row the same way; float32 class rows run the SIMD row kernels of
// simd/simd.h and simd/nn.h: AVX-512, AVX2 or portable code by run-time dispatch). Mean reduction
// divides by the sum of the weights of non-ignored targets (their count without weights). Other
// float types compute in double.
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cpu/nn_util.h"
#include "kernels/cpu/simd/nn.h"
#include "kernels/cpu/simd/simd.h"
#include "kernels/kernel_api.h"

namespace onyx::kernels {
namespace {

using namespace nnutil;

enum class Reduction { None, Sum, Mean };

Reduction reduction_of(const ir::Node& node) {
  std::string r = node.attr_string("reduction", "mean");
  if (r == "none") return Reduction::None;
  if (r == "sum") return Reduction::Sum;
  if (r == "mean") return Reduction::Mean;
  ONYX_UNSUPPORTED(node.describe(), ": reduction '", r, "' is not supported (none, sum, mean)");
}

// Input x (N, C, d1..dk) and targets t (N, d1..dk) of int32 / int64, forwards and gradients.
void check_targets(const ir::Node& node, const Shape& x, const TensorMeta& t) {
  ONYX_CHECK(x.size() >= 2, node.describe(), ": input must be (N, C, d1..dk), got ", shape_str(x));
  Shape expect_t{x[0]};
  expect_t.insert(expect_t.end(), x.begin() + 2, x.end());
  ONYX_CHECK(t.shape == expect_t, node.describe(), ": target shape ", shape_str(t.shape),
             " does not match input shape ", shape_str(x), " (expected ", shape_str(expect_t), ")");
  ONYX_CHECK(t.dtype == DType::Int32 || t.dtype == DType::Int64, node.describe(),
             ": target must be int32 or int64, got ", dtype_name(t.dtype));
}

// Validates shapes; returns the loss output shape.
Shape loss_infer_shapes(const ir::Node& node, const TensorMeta& x, const TensorMeta& t,
                        const TensorMeta* w) {
  check_targets(node, x.shape, t);
  if (w)
    ONYX_CHECK(w->rank() == 1 && w->shape[0] == x.shape[1], node.describe(),
               ": weight must have shape [", x.shape[1], "], got ", shape_str(w->shape));
  if (reduction_of(node) == Reduction::None) return t.shape;
  return {};
}

struct LossDims {
  int64_t N, C, D;  // input viewed as (N, C, D)
};

LossDims loss_dims(const Shape& s) {
  LossDims d{s[0], s[1], 1};
  for (size_t i = 2; i < s.size(); i++) d.D *= s[i];
  return d;
}

// Writes the loss output from per-target losses and effective weights (0 where ignored).
template <class T>
void finish_loss(KernelContext& ctx, const std::vector<double>& loss,
                 const std::vector<double>& wgt) {
  Tensor& out = ctx.output(0);
  T* o = out.data<T>();
  Reduction red = reduction_of(ctx.node);
  if (red == Reduction::None) {
    for (size_t i = 0; i < loss.size(); i++) o[i] = Elem<T>::store(loss[i]);
    return;
  }
  double s = 0, ws = 0;
  for (size_t i = 0; i < loss.size(); i++) {
    s += loss[i];
    ws += wgt[i];
  }
  o[0] = Elem<T>::store(red == Reduction::Sum ? s : s / ws);
}

// Targets as int64 with -1 for ignored ones; validated here, before any threaded loop (an exception
// must not leave an OpenMP region). Forwards and gradients.
std::vector<int64_t> read_targets(const Tensor& t, int64_t C, bool has_ii, int64_t ii,
                                  const ir::Node& node) {
  std::vector<int64_t> v = t.to_int64_vector();
  for (size_t i = 0; i < v.size(); i++) {
    if (has_ii && v[i] == ii) {
      v[i] = -1;
      continue;
    }
    ONYX_CHECK(v[i] >= 0 && v[i] < C, node.describe(), ": target value ", v[i], " at flat index ",
               i, " is outside [0, ", C, ")", has_ii ? " and is not ignore_index" : "");
  }
  return v;
}

template <bool SCE>
void loss_compute(KernelContext& ctx) {
  const ir::Node& node = ctx.node;
  const Tensor& x = ctx.input(0);
  const Tensor& t = ctx.input(1);
  const Tensor* w = ctx.has_input(2) ? &ctx.input(2) : nullptr;
  LossDims d = loss_dims(x.shape());
  bool has_ii = node.has_attr("ignore_index");
  int64_t ii = node.attr_int("ignore_index", 0);
  Tensor* lp_out = SCE && ctx.has_output(1) ? &ctx.output(1) : nullptr;
  std::vector<double> weights = w ? w->to_double_vector() : std::vector<double>{};
  int64_t M = d.N * d.D;  // number of targets
  std::vector<int64_t> tgt = read_targets(t, d.C, has_ii, ii, node);
  std::vector<double> loss(M), wgt(M);
  dispatch(x.dtype(), kFloats, node, [&](auto tag) {
    using T = decltype(tag);
    const T* xp = x.data<T>();
    T* lp = lp_out ? lp_out->data<T>() : nullptr;
    // SCE: one task per sample n (its C×D block); NLL: one per target.
    int64_t tasks = SCE ? d.N : M;
    int64_t grain = SCE ? std::max<int64_t>(1, 8192 / std::max<int64_t>(1, d.C * d.D)) : 4096;
    {
      parallel_for(tasks, grain, [&](int64_t b, int64_t e) {
        for (int64_t q = b; q < e; q++) {
          if constexpr (!SCE) {
            int64_t n = q / d.D, j = q % d.D;
            int64_t c = tgt[q];
            if (c < 0) {
              loss[q] = 0;
              wgt[q] = 0;
              continue;
            }
            double wc = w ? weights[c] : 1.0;
            loss[q] = -(double)Elem<T>::load(xp[(n * d.C + c) * d.D + j]) * wc;
            wgt[q] = wc;
          } else {
            int64_t n = q;
            const T* xn = xp + n * d.C * d.D;
            if constexpr (std::is_same_v<T, float>) {
              if (d.D == 1) {  // contiguous class row: SIMD
                int64_t c = tgt[n];
                double lpc = 0;
                if (lp) {
                  simd::log_softmax_row(xn, lp + n * d.C, d.C);
                  if (c >= 0) lpc = lp[n * d.C + c];
                } else if (c >= 0) {
                  float m = simd::row_max(xn, d.C);
                  float ls = std::log(simd::row_sum_exp(xn, d.C, m, nullptr));
                  lpc = (double)((xn[c] - m) - ls);
                }
                double wc = c < 0 ? 0.0 : (w ? weights[c] : 1.0);
                loss[n] = c < 0 ? 0.0 : -lpc * wc;
                wgt[n] = wc;
                continue;
              }
            }
            // generic: per position j, strided over classes, double arithmetic
            for (int64_t j = 0; j < d.D; j++) {
              double m = -INFINITY;
              for (int64_t c = 0; c < d.C; c++) {
                double v = Elem<T>::load(xn[c * d.D + j]);
                m = (v > m || v != v) ? v : m;
              }
              double s = 0;
              for (int64_t c = 0; c < d.C; c++) s += std::exp(Elem<T>::load(xn[c * d.D + j]) - m);
              double ls = std::log(s);
              if (lp)
                for (int64_t c = 0; c < d.C; c++)
                  lp[n * d.C * d.D + c * d.D + j] =
                      Elem<T>::store(Elem<T>::load(xn[c * d.D + j]) - m - ls);
              int64_t q2 = n * d.D + j;
              int64_t c = tgt[q2];
              if (c < 0) {
                loss[q2] = 0;
                wgt[q2] = 0;
                continue;
              }
              double wc = w ? weights[c] : 1.0;
              double lpc = lp ? (double)Elem<T>::load(lp[n * d.C * d.D + c * d.D + j])
                              : Elem<T>::load(xn[c * d.D + j]) - m - ls;
              loss[q2] = -lpc * wc;
              wgt[q2] = wc;
            }
          }
        }
      });
    }
    finish_loss<T>(ctx, loss, wgt);
  });
}

template <bool SCE>
OpKernel make_loss_kernel() {
  OpKernel k;
  k.infer = [](InferContext& ctx) {
    const TensorMeta& x = ctx.input(0);
    const TensorMeta& t = ctx.input(1);
    const TensorMeta* w = ctx.has_input(2) ? &ctx.input(2) : nullptr;
    Shape out = loss_infer_shapes(ctx.node, x, t, w);
    if (!is_float(x.dtype))
      ONYX_UNSUPPORTED(ctx.node.describe(), ": dtype ", dtype_name(x.dtype), " is not supported");
    ctx.set_output(0, x.dtype, out);
    if (SCE && ctx.num_outputs() > 1) ctx.set_output(1, x.dtype, x.shape);
  };
  k.compute = [](KernelContext& ctx) { loss_compute<SCE>(ctx); };
  return k;
}

// ---- onyx.SoftmaxCrossEntropyLossGrad / onyx.NLLLossGrad ----------------------------------------
// The forwards' semantics: input (N, C, d1..dk) viewed as (N, C, D), targets (N, D); a target
// equal to ignore_index (only when the attribute is present) contributes nothing; weight w[c]
// scales its target's loss; mean divides by the sum of the weights of the non-ignored targets
// (their count without weights). coef[q] = d loss / d (per-target loss q) * w[t_q]:
//   none: dloss[q] * w,  sum: dloss * w,  mean: dloss * w / sum(w).

// Per-target coefficients (0 for ignored targets) and the targets (-1 where ignored).
void loss_coefficients(const KernelContext& ctx, int labels_input, int64_t C,
                       std::vector<int64_t>& tgt, std::vector<double>& coef) {
  const ir::Node& node = ctx.node;
  const Tensor& dl = ctx.input(0);
  const Tensor& t = ctx.input(labels_input);
  const Tensor* w = ctx.has_input(labels_input + 1) ? &ctx.input(labels_input + 1) : nullptr;
  std::vector<double> weights = w ? w->to_double_vector() : std::vector<double>{};
  if (w)
    ONYX_CHECK((int64_t)weights.size() == C, node.describe(), ": weight must have ", C,
               " elements, got ", shape_str(w->shape()));
  tgt = read_targets(t, C, node.has_attr("ignore_index"), node.attr_int("ignore_index", 0), node);
  int64_t M = (int64_t)tgt.size();
  coef.assign(M, 0.0);
  double ws = 0;
  for (int64_t q = 0; q < M; q++) {
    if (tgt[q] < 0) continue;
    coef[q] = w ? weights[tgt[q]] : 1.0;
    ws += coef[q];
  }
  Reduction red = reduction_of(node);
  if (red == Reduction::None) {
    ONYX_CHECK(dl.numel() == M, node.describe(), ": dloss must have ", M, " elements, got ",
               shape_str(dl.shape()));
    for (int64_t q = 0; q < M; q++)
      if (tgt[q] >= 0) coef[q] *= dl.get_as_double(q);
    return;
  }
  ONYX_CHECK(dl.numel() == 1, node.describe(), ": dloss must be a scalar, got ",
             shape_str(dl.shape()));
  double g = dl.get_as_double(0);
  if (red == Reduction::Mean) g = ws != 0 ? g / ws : 0.0;
  for (int64_t q = 0; q < M; q++) coef[q] *= g;
}

// Inputs: dloss, X (logits, or log_prob when attribute log_prob=1), labels, [weights].
// dX[n, c, j] = coef[n, j] * (softmax(X)[n, c, j] - [c == t[n, j]]).
OpKernel make_sce_grad_kernel() {
  OpKernel k;
  k.infer = [](InferContext& ctx) {
    const TensorMeta& x = ctx.input(1);
    check_targets(ctx.node, x.shape, ctx.input(2));
    reduction_of(ctx.node);
    ctx.set_output(0, x.dtype, x.shape);
  };
  k.compute = [](KernelContext& ctx) {
    const ir::Node& node = ctx.node;
    const Tensor& xt = ctx.input(1);
    Tensor& dxt = ctx.output(0);
    const LossDims d = loss_dims(xt.shape());
    const int64_t N = d.N, C = d.C, D = d.D;
    bool is_lp = node.attr_int("log_prob", 0) != 0;
    std::vector<int64_t> tgt;
    std::vector<double> coef;
    loss_coefficients(ctx, 2, C, tgt, coef);
    if (xt.numel() == 0) return;
    dispatch(xt.dtype(), kFloats, node, [&](auto tag) {
      using T = decltype(tag);
      const T* x = xt.data<T>();
      T* dx = dxt.data<T>();
      int64_t grain = std::max<int64_t>(1, 8192 / std::max<int64_t>(1, C * D));
      parallel_for(N, grain, [&](int64_t b, int64_t e) {
        for (int64_t n = b; n < e; n++) {
          const T* xn = x + n * C * D;
          T* dn = dx + n * C * D;
          if constexpr (std::is_same_v<T, float>) {
            if (D == 1) {  // contiguous class row
              int64_t c = tgt[n];
              if (c < 0) {
                std::memset(dn, 0, C * sizeof(float));
                continue;
              }
              float cf = (float)coef[n];
              if (is_lp) {
                simd::scaled_exp_row(xn, dn, C, cf);  // dx = coef * exp(lp)
              } else {
                float m = simd::row_max(xn, C);
                float sum = simd::row_sum_exp(xn, C, m, dn);
                simd::row_scale(dn, C, cf / sum);
              }
              dn[c] -= cf;
              continue;
            }
          }
          for (int64_t j = 0; j < D; j++) {
            int64_t q = n * D + j, c = tgt[q];
            if (c < 0) {
              for (int64_t k2 = 0; k2 < C; k2++) dn[k2 * D + j] = Elem<T>::store(0.0);
              continue;
            }
            double cf = coef[q];
            if (is_lp) {
              for (int64_t k2 = 0; k2 < C; k2++)
                dn[k2 * D + j] = Elem<T>::store(
                    cf * (std::exp((double)Elem<T>::load(xn[k2 * D + j])) - (k2 == c ? 1.0 : 0.0)));
              continue;
            }
            double m = -INFINITY;
            for (int64_t k2 = 0; k2 < C; k2++) {
              double v = Elem<T>::load(xn[k2 * D + j]);
              m = (v > m || v != v) ? v : m;
            }
            double sum = 0;
            for (int64_t k2 = 0; k2 < C; k2++) sum += std::exp(Elem<T>::load(xn[k2 * D + j]) - m);
            double inv = 1.0 / sum;
            for (int64_t k2 = 0; k2 < C; k2++)
              dn[k2 * D + j] = Elem<T>::store(
                  cf * (std::exp(Elem<T>::load(xn[k2 * D + j]) - m) * inv - (k2 == c ? 1.0 : 0.0)));
          }
        }
      });
    });
  };
  return k;
}

// Inputs: dloss, labels, [weights]; attribute input_shape = the forward input's shape (N, C, d..).
// dX = 0 except dX[n, t, j] = -coef[n, j].
OpKernel make_nll_grad_kernel() {
  OpKernel k;
  k.infer = [](InferContext& ctx) {
    Shape xs = ctx.node.attr_ints_required("input_shape");
    check_targets(ctx.node, xs, ctx.input(1));
    reduction_of(ctx.node);
    ctx.set_output(0, ctx.input(0).dtype, xs);
  };
  k.compute = [](KernelContext& ctx) {
    const ir::Node& node = ctx.node;
    Tensor& dxt = ctx.output(0);
    const LossDims d = loss_dims(dxt.shape());
    const int64_t N = d.N, C = d.C, D = d.D;
    std::vector<int64_t> tgt;
    std::vector<double> coef;
    loss_coefficients(ctx, 1, C, tgt, coef);
    dispatch(dxt.dtype(), kFloats, node, [&](auto tag) {
      using T = decltype(tag);
      T* dx = dxt.data<T>();
      const T zero = Elem<T>::store(0.0);
      parallel_for(N, std::max<int64_t>(1, 32768 / std::max<int64_t>(1, C * D)),
                   [&](int64_t b, int64_t e) {
                     if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>)
                       std::memset(dx + b * C * D, 0, (e - b) * C * D * sizeof(T));
                     else
                       std::fill(dx + b * C * D, dx + e * C * D, zero);
                     for (int64_t n = b; n < e; n++)
                       for (int64_t j = 0; j < D; j++) {
                         int64_t q = n * D + j;
                         if (tgt[q] >= 0) dx[(n * C + tgt[q]) * D + j] = Elem<T>::store(-coef[q]);
                       }
                   });
    });
  };
  return k;
}

}  // namespace

ONYX_REGISTER_KERNELS(loss, Cpu) {
  r.add("", "SoftmaxCrossEntropyLoss", make_loss_kernel<true>()).precision =
      OpTraits::Precision::Fp32;
  r.add("", "NegativeLogLikelihoodLoss", make_loss_kernel<false>()).precision =
      OpTraits::Precision::Fp32;
  r.add("onyx", "SoftmaxCrossEntropyLossGrad", make_sce_grad_kernel());
  r.add("onyx", "NLLLossGrad", make_nll_grad_kernel());
}

}  // namespace onyx::kernels
