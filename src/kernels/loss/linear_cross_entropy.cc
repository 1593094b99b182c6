// kernels/loss/linear_cross_entropy.cc — onyx.LinearCrossEntropy: a linear layer (LM head or
// classifier) followed by softmax cross-entropy, with the loss's gradient computed in the same
// pass.
//
//   LinearCrossEntropy(H (N,C), W (V,C) | (C,V) with transB=0, labels (N), [bias (V)])
//     attrs: transB (default 1), ignore_index (when present), reduction "mean" | "sum",
//            label_smoothing (default 0), chunk_rows (0 = automatic)
//     -> loss (scalar), [dH (N,C)], [dW (shape of W)], [dbias (shape of bias)]
//
//   logits = H · op(W) + bias                                    (N,V)  — never materialized
//   loss_n = lse_n − (1−ε)·logits[n, t_n] − ε·mean_v logits[n, v]   for t_n ≠ ignore_index
//   loss   = Σ_n loss_n (sum)  or  Σ_n loss_n / #non-ignored (mean; 0/0 = NaN when all ignored)
//   dlogits[n, v] = (softmax[n, v] − (1−ε)·[v == t_n] − ε/V) · scale,  0 for ignored rows
//   dH = dlogits · W,  dW = dlogitsᵀ · H (transposed for transB=0),  dbias = Σ_n dlogits[n, :]
//
// The gradient outputs are d loss / d input for an incoming gradient of 1: the gradient rule
// (autodiff/gradients/loss.cc) multiplies them by the real incoming scalar. This works because the
// loss is the last node of a training graph: its gradient is known to be needed before the
// backward starts, so computing it here means each chunk of logits is produced, used for the loss
// and turned into dH/dW while it is still in cache, and no (N × V) tensor ever exists. When the
// gradient outputs are absent (evaluation) only the loss is computed.
//
// Hand-written because this is the hot path of language-model training (gpt2: V = 50257, 80% of
// the FLOPs), and because the unfused graph materializes logits, their copies and their gradient
// (N × V × 4 bytes each, 400 MB at N = 2048). Rows are processed in chunks of R non-ignored rows
// (ignored rows are skipped entirely): per chunk one sgemm for the logits, one row pass (max,
// exp-sum, loss, softmax − onehot in place: the SIMD row kernels of simd/simd.h and simd/nn.h,
// AVX-512, AVX2 or portable code by run-time dispatch), one sgemm for dH and one accumulating into
// dW. With gradients, each thread takes its own contiguous range of rows (single-threaded GEMMs, a
// private dW partial added in thread order at the end); otherwise each GEMM and row pass is
// threaded. Results are deterministic for a thread count. float32, or W bfloat16 (a frozen LM head
// stored in bf16, models/lora.h store_frozen_weights_bf16, or the bf16 shadow of a trained one
// under mixed precision, whose float32 dW is still written): the logits and dH GEMMs take bf16
// inputs — H rows and dlogits rounded once per chunk, the dlogits by the row pass —
// with float32 accumulation (gemm_mixed_bf16); the softmax, loss and dlogits stay float32. Under
// mixed precision (KernelContext::bf16_gemm) a float32 W is rounded to bf16 once per call and the
// same GEMMs run, dW's too, once per kDwGroup chunks (bench_kernels lce_chunk/*: at gpt2-small's
// head, one thread, the bf16 dW GEMM over one chunk's 166 rows ran at 172 GFLOP/s against
// float32's 189, over 664 rows at 242 against 205). On gpt2-tiny's head (N = 2040, C = 256, V =
// 50257, 2 threads, quiet machine) the kernel runs at ≈ 186 GFLOP/s, ≈ 95% of the same chunk GEMMs
// timed alone.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/simd/nn.h"
#include "kernels/cpu/simd/simd.h"
#include "kernels/kernel_api.h"

namespace onyx::kernels {
namespace {

struct LceDims {
  int64_t N, C, V;
  bool transB;
};

LceDims lce_dims(const ir::Node& node, const Shape& h, const Shape& w) {
  ONYX_CHECK(h.size() == 2, node.describe(), ": H must be (N, C), got ", shape_str(h));
  ONYX_CHECK(w.size() == 2, node.describe(), ": W must be 2-D, got ", shape_str(w));
  LceDims d;
  d.transB = node.attr_int("transB", 1) != 0;
  d.N = h[0];
  d.C = h[1];
  d.V = d.transB ? w[0] : w[1];
  int64_t wc = d.transB ? w[1] : w[0];
  ONYX_CHECK(wc == d.C, node.describe(), ": W ", shape_str(w), d.transB ? " (V, C)" : " (C, V)",
             " does not match H ", shape_str(h));
  return d;
}

bool is_mean(const ir::Node& node) {
  std::string r = node.attr_string("reduction", "mean");
  if (r == "mean") return true;
  if (r == "sum") return false;
  ONYX_UNSUPPORTED(node.describe(), ": reduction '", r, "' is not supported (mean, sum)");
}

void lce_infer(InferContext& ctx) {
  const ir::Node& node = ctx.node;
  const TensorMeta& h = ctx.input(0);
  const TensorMeta& w = ctx.input(1);
  const TensorMeta& t = ctx.input(2);
  ONYX_CHECK(h.dtype == DType::Float32 && (w.dtype == DType::Float32 || w.dtype == DType::BFloat16),
             node.describe(), ": H must be float32 and W float32 or bfloat16, got ",
             dtype_name(h.dtype), " and ", dtype_name(w.dtype));
  LceDims d = lce_dims(node, h.shape, w.shape);
  ONYX_CHECK(t.shape == Shape{d.N}, node.describe(), ": labels must have shape [", d.N, "], got ",
             shape_str(t.shape));
  ONYX_CHECK(t.dtype == DType::Int32 || t.dtype == DType::Int64, node.describe(),
             ": labels must be int32 or int64, got ", dtype_name(t.dtype));
  if (ctx.has_input(3)) {
    const TensorMeta& b = ctx.input(3);
    ONYX_CHECK(
        b.dtype == DType::Float32 && b.numel() == d.V && b.rank() >= 1 && b.shape.back() == d.V,
        node.describe(), ": bias must be float32 with ", d.V, " elements, got ",
        dtype_name(b.dtype), " ", shape_str(b.shape));
  }
  is_mean(node);
  float eps = node.attr_float("label_smoothing", 0.0f);
  ONYX_CHECK(eps >= 0.0f && eps <= 1.0f, node.describe(), ": label_smoothing ", eps,
             " is outside [0, 1]");
  ctx.set_output(0, DType::Float32, {});
  if (ctx.num_outputs() > 1) ctx.set_output(1, DType::Float32, h.shape);
  // dW is float32 for a bfloat16 W too: the gradient of the float32 master weight whose bf16
  // copy the GEMMs read (mixed precision's weight shadow)
  if (ctx.num_outputs() > 2) ctx.set_output(2, DType::Float32, w.shape);
  if (ctx.num_outputs() > 3) {
    ONYX_CHECK(ctx.has_input(3), node.describe(), ": output dbias needs a bias input");
    ctx.set_output(3, DType::Float32, ctx.input(3).shape);
  }
}

// Chunks per dW GEMM under mixed precision (run_rows).
constexpr int64_t kDwGroup = 4;

// Most rows per chunk: the (R × V) logits chunk (one per thread) is about 32 MB (R = 166 at
// V = 50257); at least 64 rows so the dW GEMM (inner dimension R, which reads and writes all of
// dW per chunk) stays efficient; at most 1024. Measured on gpt2-tiny's head (2 threads): 128–256
// rows per chunk are equally fast, 64 is slower. The attribute chunk_rows overrides (tests).
int64_t chunk_rows(const ir::Node& node, int64_t V) {
  int64_t r = node.attr_int("chunk_rows", 0);
  if (r > 0) return r;
  return std::clamp<int64_t>((int64_t)(8 << 20) / std::max<int64_t>(1, V), 64, 1024);
}

// One row of a chunk: z holds the logits (+ bias added here); on return it holds dlogits when
// `grad` (else it is left scratched). Returns the row's loss term.
inline double lce_row(float* z, int64_t V, int64_t t, const float* bias, float eps, bool grad,
                      float scale) {
  if (bias) simd::add_arrays(z, bias, z, V);
  float zt = z[t];
  float mean_z = eps != 0.0f ? simd::row_sum(z, V) / (float)V : 0.0f;
  float m = simd::row_max(z, V);
  float s = simd::row_sum_exp(z, V, m, grad ? z : nullptr);  // z := exp(z − m) when grad
  double lse = (double)m + std::log((double)s);
  double loss = (1.0 - eps) * (lse - zt) + (double)eps * (lse - mean_z);
  if (grad) {
    // dlogits = (e / s − ε/V) · scale, then − (1−ε) · scale at the target.
    simd::row_mul_sub(z, V, scale / s, eps / (float)V * scale);
    z[t] -= (1.0f - eps) * scale;
  }
  return loss;
}

void lce_compute(KernelContext& ctx) {
  const ir::Node& node = ctx.node;
  const Tensor& Ht = ctx.input(0);
  const Tensor& Wt = ctx.input(1);
  const Tensor& Lt = ctx.input(2);
  const float* bias = ctx.has_input(3) ? ctx.input(3).data<float>() : nullptr;
  const LceDims d = lce_dims(node, Ht.shape(), Wt.shape());
  const int64_t N = d.N, C = d.C, V = d.V;
  const bool mean = is_mean(node);
  const float eps = node.attr_float("label_smoothing", 0.0f);
  const bool has_ii = node.has_attr("ignore_index");
  const int64_t ii = node.attr_int("ignore_index", 0);
  float* dH = ctx.has_output(1) ? ctx.output(1).data<float>() : nullptr;     // (N,C)
  float* dW = ctx.has_output(2) ? ctx.output(2).data<float>() : nullptr;     // (V,C) | (C,V)
  float* dbias = ctx.has_output(3) ? ctx.output(3).data<float>() : nullptr;  // (V)
  const bool grad = dH || dW || dbias;
  // dW / dbias bound to the flat gradient buffer of a run that accumulates micro-batches
  // (passes/gradient_into_buffer.cc): computed as without accumulation into a scratch kept
  // across calls, then added, so the sums are AccumulateGrad's (out + gradient) bit for bit.
  float *dW_into = nullptr, *dbias_into = nullptr;
  thread_local std::vector<float> dw_acc, db_acc;
  if (dW && ctx.accumulates(2)) {
    if (dw_acc.size() < (size_t)(V * C)) dw_acc.resize((size_t)(V * C));
    dW_into = dW;
    dW = dw_acc.data();
  }
  if (dbias && ctx.accumulates(3)) {
    if (db_acc.size() < (size_t)V) db_acc.resize((size_t)V);
    dbias_into = dbias;
    dbias = db_acc.data();
  }

  // Targets, validated before any threaded loop; the non-ignored rows in order.
  std::vector<int64_t> tgt = Lt.to_int64_vector();
  std::vector<int64_t> rows;
  rows.reserve(N);
  for (int64_t n = 0; n < N; n++) {
    if (has_ii && tgt[n] == ii) continue;
    ONYX_CHECK(tgt[n] >= 0 && tgt[n] < V, node.describe(), ": label ", tgt[n], " at row ", n,
               " is outside [0, ", V, ")", has_ii ? " and is not ignore_index" : "");
    rows.push_back(n);
  }
  const int64_t M = (int64_t)rows.size();
  const float scale = mean ? (M > 0 ? 1.0f / (float)M : 0.0f) : 1.0f;

  const float* H = Ht.data<float>();
  const bool mixed = ctx.bf16_gemm && Wt.dtype() == DType::Float32;
  // Mixed precision: W rounded to bf16 once per call, into a scratch kept across calls (a fresh
  // 77 MB tensor per call at gpt2-small's head cost its page faults every step).
  thread_local std::vector<uint16_t> w_rounded;
  if (mixed) {
    if (w_rounded.size() < (size_t)Wt.numel()) w_rounded.resize((size_t)Wt.numel());
    kernels::f32_to_bf16(Wt.data<float>(), w_rounded.data(), Wt.numel());
  }
  const bool w16 = Wt.dtype() == DType::BFloat16 || mixed;
  const float* W = w16 ? nullptr : Wt.data<float>();
  // TrainingArguments.fp16 (emulated): W rounded to float16 once per call, each chunk's H rows and
  // dlogits before the GEMMs that read them; float32 GEMMs on the rounded values.
  const bool f16 = !w16 && kernels::low_precision(ctx) == kernels::LowPrecision::Fp16 &&
                   Wt.dtype() == DType::Float32;
  thread_local std::vector<float> w_f16;
  if (f16) {
    if (w_f16.size() < (size_t)Wt.numel()) w_f16.resize((size_t)Wt.numel());
    kernels::round_to_fp16(Wt.data<float>(), w_f16.data(), Wt.numel());
    W = w_f16.data();
  }
  const uint16_t* W16 = mixed ? w_rounded.data() : w16 ? Wt.data<uint16_t>() : nullptr;
  if (dH) std::memset(dH, 0, N * C * sizeof(float));  // ignored rows keep a zero gradient

  const int64_t R = std::min<int64_t>(chunk_rows(node, V), std::max<int64_t>(M, 1));
  std::vector<double> row_loss(M);
  const int64_t ldw = d.transB ? C : V;

  // Non-ignored rows [m0, m1) in chunks of R, in order: loss terms into row_loss, dH rows, and
  // dW (dbias) written by the first chunk (beta = 0), then accumulated. Called once over every row
  // (each GEMM and the row pass threaded), or from inside a parallel region with one contiguous
  // range per thread (then every call in it runs single-threaded).
  auto run_rows = [&](int64_t m0, int64_t m1, float* dW_out, float* dbias_out) {
    // (R,V): logits, then dlogits. Per-thread scratch kept across calls: at vocab 50257 it is
    // tens of MB, and handing it back to the OS after every step costs its page faults again.
    thread_local std::vector<float> logits;
    if (logits.size() < (size_t)(R * V)) logits.resize(R * V);
    // bf16 GEMMs: the chunk's H rows and its dlogits rounded once each (the dlogits by the row
    // pass, while each row is still in cache) and read by both GEMMs that use them.
    // Under mixed precision dW's GEMM runs once per kDwGroup chunks (their bf16 dlogits and H rows
    // kept side by side): with K = one chunk's rows (~166 at V = 50257) the bf16 GEMM is bound by
    // streaming dW itself (V x C float32, read and written per call) — measured on gpt2-small's
    // head at 2 threads as slower than the float32 GEMM; four chunks' rows per call amortize it.
    const int64_t group = w16 && dW_out ? kDwGroup : 1;
    thread_local std::vector<uint16_t> h16, z16;
    if (w16) {
      if (h16.size() < (size_t)(group * R * C)) h16.resize(group * R * C);
      if (grad && z16.size() < (size_t)(group * R * V)) z16.resize(group * R * V);
    }
    int64_t held = 0, held_chunks = 0;  // rows (chunks) in h16 / z16 whose dW is still to add
    bool dw_written = false;
    auto flush_dw = [&]() {  // dW (+)= the held rows' dlogitsᵀ · H
      if (held == 0) return;
      const float beta = dw_written ? 1.0f : 0.0f;
      const kernels::Bf16Operand Hb{nullptr, h16.data()}, Zb{nullptr, z16.data()};
      if (d.transB)  // (V,C) += (rows,V)ᵀ · (rows,C)
        kernels::gemm_mixed_bf16(true, false, V, C, held, 1.0f, Zb, V, Hb, C, beta, dW_out, C);
      else  // (C,V) += (rows,C)ᵀ · (rows,V)
        kernels::gemm_mixed_bf16(true, false, C, V, held, 1.0f, Hb, C, Zb, V, beta, dW_out, V);
      dw_written = true;
      held = held_chunks = 0;
    };
    std::vector<float> hbuf, dhbuf;  // (R,C) gathered rows when not contiguous
    if (dW_out && m1 == m0) std::memset(dW_out, 0, V * C * sizeof(float));
    if (dbias_out) std::memset(dbias_out, 0, V * sizeof(float));
    // Equal chunks of at most R rows (1020 rows at R = 166: 7 chunks of 146, not 6 + a remnant).
    const int64_t n_chunks = (m1 - m0 + R - 1) / R;
    const int64_t Rc = n_chunks > 0 ? (m1 - m0 + n_chunks - 1) / n_chunks : R;
    for (int64_t r0 = m0; r0 < m1; r0 += Rc) {
      const int64_t r = std::min(Rc, m1 - r0);
      const bool contiguous = rows[r0 + r - 1] - rows[r0] == r - 1;
      const float* Hc = H + rows[r0] * C;  // (r,C)
      if (!contiguous) {
        hbuf.resize(R * C);
        for (int64_t i = 0; i < r; i++)
          std::memcpy(&hbuf[i * C], H + rows[r0 + i] * C, C * sizeof(float));
        Hc = hbuf.data();
      }
      if (f16) {  // (gathered rows are rounded in place)
        if (contiguous) hbuf.resize(R * C);
        kernels::round_to_fp16(Hc, hbuf.data(), r * C);
        Hc = hbuf.data();
      }
      float* Z = logits.data();
      // this chunk's rows of the bf16 scratch (this thread's: the row pass may run on others)
      uint16_t* Z16 = z16.data() + held * V;
      uint16_t* H16 = h16.data() + held * C;
      const kernels::Bf16Operand Hb{nullptr, H16}, Zb{nullptr, Z16}, Wb{nullptr, W16};
      // (r,V) = (r,C) · op(W)
      if (w16) {
        kernels::f32_to_bf16(Hc, H16, r * C);
        kernels::gemm_mixed_bf16(false, d.transB, r, V, C, 1.0f, Hb, C, Wb, ldw, 0.0f, Z, V);
      } else {
        kernels::sgemm(false, d.transB, r, V, C, 1.0f, Hc, C, W, ldw, 0.0f, Z, V);
      }
      parallel_for(r, 1, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; i++) {
          row_loss[r0 + i] = lce_row(Z + i * V, V, tgt[rows[r0 + i]], bias, eps, grad, scale);
          if (w16 && grad) kernels::f32_to_bf16(Z + i * V, Z16 + i * V, V);
          if (f16 && grad) kernels::round_to_fp16(Z + i * V, Z + i * V, V);
        }
      });
      if (!grad) continue;
      if (dH) {  // (r,C) = (r,V) · W(V,C)   [transB=0: (r,V) · W(C,V)ᵀ]
        if (!contiguous) dhbuf.resize(R * C);
        float* dHc = contiguous ? dH + rows[r0] * C : dhbuf.data();
        if (w16)
          kernels::gemm_mixed_bf16(false, !d.transB, r, C, V, 1.0f, Zb, V, Wb, ldw, 0.0f, dHc, C);
        else
          kernels::sgemm(false, !d.transB, r, C, V, 1.0f, Z, V, W, ldw, 0.0f, dHc, C);
        if (!contiguous)
          for (int64_t i = 0; i < r; i++)
            std::memcpy(dH + rows[r0 + i] * C, &dhbuf[i * C], C * sizeof(float));
      }
      if (dW_out && w16) {
        held += r;
        if (++held_chunks == group || r0 + r >= m1) flush_dw();
      } else if (dW_out) {
        float beta = r0 == m0 ? 0.0f : 1.0f;
        if (d.transB)  // (V,C) += (r,V)ᵀ · (r,C)
          kernels::sgemm(true, false, V, C, r, 1.0f, Z, V, Hc, C, beta, dW_out, C);
        else  // (C,V) += (r,C)ᵀ · (r,V)
          kernels::sgemm(true, false, C, V, r, 1.0f, Hc, C, Z, V, beta, dW_out, V);
      }
      if (dbias_out) {  // column sums in row order, threaded over columns
        parallel_for(V, 4096, [&](int64_t b, int64_t e) {
          for (int64_t i = 0; i < r; i++) {
            const float* zi = Z + i * V;
            for (int64_t v = b; v < e; v++) dbias_out[v] += zi[v];
          }
        });
      }
    }
  };

  // With gradients and at least a chunk per thread, each thread takes an equal contiguous range
  // of rows and runs its GEMMs single-threaded (no fork/join per GEMM and row pass). On the shared
  // 2-core machine this was as fast as or up to ~10% faster than threading each GEMM (gpt2-tiny
  // head, interleaved runs, noisy), at the cost of one (V,C) dW partial per extra thread. Thread 0
  // writes dW/dbias, the others partials added in thread order afterwards (deterministic).
  const int nt = num_threads();
  if (!grad || nt <= 1 || M < (int64_t)nt * R || omp_in_parallel()) {
    run_rows(0, M, dW, dbias);
  } else {
    // The other threads' (V,C) dW partials, kept across calls like the logits scratch.
    static std::vector<std::vector<float>> dw_part, db_part;
    static std::mutex mu;  // two sessions running this kernel at once take turns
    std::lock_guard<std::mutex> lock(mu);
    if ((int)dw_part.size() < nt - 1) {
      dw_part.resize(nt - 1);
      db_part.resize(nt - 1);
    }
#pragma omp parallel num_threads(nt)
    {
      int t = omp_get_thread_num();
      int64_t m0 = M * t / nt, m1 = M * (t + 1) / nt;
      float* dw_t = dW;
      float* db_t = dbias;
      if (t > 0 && dW) {
        if (dw_part[t - 1].size() < (size_t)(V * C)) dw_part[t - 1].resize(V * C);
        dw_t = dw_part[t - 1].data();
      }
      if (t > 0 && dbias) {
        if (db_part[t - 1].size() < (size_t)V) db_part[t - 1].resize(V);
        db_t = db_part[t - 1].data();
      }
      run_rows(m0, m1, dw_t, db_t);
    }
    for (int t = 1; t < nt; t++) {
      if (dW)
        parallel_for(V * C, 1 << 16, [&](int64_t b, int64_t e) {
          const float* p = dw_part[t - 1].data();
          for (int64_t i = b; i < e; i++) dW[i] += p[i];
        });
      if (dbias)
        for (int64_t v = 0; v < V; v++) dbias[v] += db_part[t - 1][v];
    }
  }
  if (dW_into)
    parallel_for(V * C, 1 << 16, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; i++) dW_into[i] += dW[i];
    });
  if (dbias_into)
    for (int64_t v = 0; v < V; v++) dbias_into[v] += dbias[v];
  double total = 0;
  for (int64_t i = 0; i < M; i++) total += row_loss[i];
  float loss = mean ? (M > 0 ? (float)(total / (double)M) : NAN) : (float)total;
  ctx.output(0).data<float>()[0] = loss;
}

}  // namespace

ONYX_REGISTER_KERNELS(linear_cross_entropy, Cpu) {
  OpKernel k{lce_infer, lce_compute, {}};
  k.accumulate_outputs = {2, 3};  // dW, dbias: written straight into the gradient buffer
  OpTraits& t = r.add("onyx", "LinearCrossEntropy", std::move(k));
  t.precision = OpTraits::Precision::LowPrecision;  // the GEMMs; its softmax is fp32 inside
  t.flops = [](const ir::Node& n, const std::vector<const TensorMeta*>& in,
               const std::vector<const TensorMeta*>&) {
    // logits, dH and dW: three (N × V × C) GEMMs
    if (!in[0] || in.size() < 2 || !in[1] || in[0]->shape.size() != 2 || in[1]->shape.size() != 2)
      return 0.0;
    double v = n.attr_int("transB", 1) ? (double)in[1]->shape[0] : (double)in[1]->shape[1];
    return 6 * (double)in[0]->shape[0] * (double)in[0]->shape[1] * v;
  };
}

}  // namespace onyx::kernels
