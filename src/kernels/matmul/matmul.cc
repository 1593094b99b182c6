// kernels/matmul/matmul.cc — MatMul (numpy matmul semantics) and Gemm, and the fused "onyx"-domain
// ops of the linear layers and their gradients (emitted by passes/linear_fusion.cc and the rules in
// autodiff/gradients/matmul.cc):
//   MatMulT(A, B, bias?)  transA, transB, alpha   Y = alpha · op(A) · op(B) (+ bias), numpy batch
//                                                 broadcast, op(X) swaps X's last two dims (no
//                                                 copy: GEMM flags); bias (N) is broadcast over the
//                                                 rows (the Linear layers passes/linear_fusion.cc
//                                                 makes)
//   MatMulGradB(A, dY)    alpha                   (K,N) = alpha · A(R,K)^T · dY(R,N), R = every
//                                                 leading dim of A and dY folded (they must agree)
//   BiasGrad(dY) -> db, dY16?                     (N) = dY(R,N) summed over its R leading rows (the
//                                                 bias gradient of MatMulT; in fixed parts of
//                                                 rows added in order, so the sum order never
//                                                 depends on the threads); the
//                                                 optional second output is dY rounded to bf16
//                                                 (float32 dY only), written in the same pass —
//                                                 the Cast passes/mixed_precision.cc fuses here
//                                                 for the backward GEMMs that read dY
// Registers Einsum (einsum.cc) too.
//
// float32 goes to kernels/cpu/gemm.h (oneDNN / OpenBLAS); float16 and bfloat16 are converted to
// float32 around the same path. Mixed precision: MatMulT and MatMulGradB take any mix of float32
// and bfloat16 operands — a frozen weight stored in bf16 (models/lora.h
// store_frozen_weights_bf16), activations and gradients the mixed-precision pass stores in bf16
// (passes/mixed_precision.cc, which also sets output_dtype = FLOAT, so two bf16 operands still give
// float32) — with bf16 inputs, float32 accumulation and float32 output (gemm_mixed_bf16: bf16
// operands read in place, float32 ones rounded per call). Under KernelContext::bf16_gemm
// (TrainingArguments.bf16) two float32 operands are rounded per call the same way; under
// KernelContext::fp16_gemm (TrainingArguments.fp16, emulated) to float16, for sgemm. float64
// uses a plain loop (dgemm for the onyx ops, and for MatMul and Gemm a cache-friendly loop that
// also serves the integer types: exact in their own type; they are rare and never the hot path).
// Hand-written dispatch because the transformer hot path needs care: a batched activation times a
// shared 2-D weight, (B,T,K) x (K,N), must be ONE (B·T x K) x (K x N) GEMM, not B small ones, and
// the weight gradient of (B,T,K)x(K,N) is ONE (K x B·T) x (B·T x N) GEMM with transA, never B
// small ones and never a materialized transpose. MatMulGradB and BiasGrad write parameter
// gradients straight into the trainer's flat gradient buffer (passes/gradient_into_buffer.cc);
// accumulating micro-batches they add out + (the gradient as computed alone), so gradient
// accumulation is bit-identical to a separate onyx.AccumulateGrad.
#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/nn_util.h"
#include "kernels/elementwise/elementwise.h"
#include "kernels/kernel_api.h"
#include "kernels/matmul/einsum.h"

namespace onyx::kernels {
namespace {

using kernels::gemm;
using nnutil::check_float;
using nnutil::check_same_dtype;
using nnutil::dispatch_float;
using nnutil::from_f32;
using nnutil::to_f32;

// ---- MatMul shapes ---------------------------------------------------------------------------

// A batched product (..., M, K) · (..., K, N): MatMul's (matmul_shape) and onyx.MatMulT's
// (mmt_shape, where ta / tb say A / B are stored transposed: (..., K, M) / (..., N, K)).
struct MatMulShape {
  int64_t M = 1, N = 1, K = 1;
  bool ta = false, tb = false;
  Shape batch;             // broadcast batch shape
  Shape a_batch, b_batch;  // each operand's batch dims, left-padded with 1s to batch's rank
  Shape out;
};

// A (...,M,K) · B (...,K,N) with numpy's 1-D promotions: a 1-D A is a (1,K) row that is dropped
// from the result, a 1-D B a (K,1) column likewise. Batch dims broadcast.
MatMulShape matmul_shape(const Shape& a, const Shape& b, const ir::Node& node) {
  ONYX_CHECK(!a.empty() && !b.empty(), node.describe(), ": MatMul inputs must have rank >= 1, got ",
             shape_str(a), " and ", shape_str(b));
  bool a_vec = a.size() == 1, b_vec = b.size() == 1;
  MatMulShape s;
  s.M = a_vec ? 1 : a[a.size() - 2];
  s.K = a.back();
  int64_t kb = b_vec ? b[0] : b[b.size() - 2];
  s.N = b_vec ? 1 : b.back();
  ONYX_CHECK(s.K == kb, node.describe(), ": MatMul inner dimensions differ: A ", shape_str(a),
             " has K=", s.K, ", B ", shape_str(b), " has K=", kb);
  Shape ab(a.begin(), a.end() - (a_vec ? 1 : 2)), bb(b.begin(), b.end() - (b_vec ? 1 : 2));
  try {
    s.batch = broadcast_shapes(ab, bb);
  } catch (const Error&) {
    throw Error(cat(node.describe(), ": MatMul batch dimensions of ", shape_str(a), " and ",
                    shape_str(b), " cannot be broadcast"));
  }
  s.a_batch = Shape(s.batch.size() - ab.size(), 1);
  s.a_batch.insert(s.a_batch.end(), ab.begin(), ab.end());
  s.b_batch = Shape(s.batch.size() - bb.size(), 1);
  s.b_batch.insert(s.b_batch.end(), bb.begin(), bb.end());
  s.out = s.batch;
  if (!a_vec) s.out.push_back(s.M);
  if (!b_vec) s.out.push_back(s.N);
  return s;
}

// onyx.MatMulT: A (...a, M, K) or (...a, K, M) with transA, B (...b, K, N) or (...b, N, K) with
// transB, both of rank >= 2; batch dims broadcast.
MatMulShape mmt_shape(const ir::Node& node, const Shape& a, const Shape& b) {
  ONYX_CHECK(a.size() >= 2 && b.size() >= 2, node.describe(), ": MatMulT needs rank >= 2, got ",
             shape_str(a), " and ", shape_str(b));
  MatMulShape s;
  s.ta = node.attr_int("transA", 0) != 0;
  s.tb = node.attr_int("transB", 0) != 0;
  int64_t ar = a[a.size() - 2], ac = a.back(), br = b[b.size() - 2], bc = b.back();
  s.M = s.ta ? ac : ar;
  s.K = s.ta ? ar : ac;
  int64_t kb = s.tb ? bc : br;
  s.N = s.tb ? br : bc;
  ONYX_CHECK(s.K == kb, node.describe(), ": MatMulT inner dimensions differ: A ", shape_str(a),
             s.ta ? " (transposed)" : "", ", B ", shape_str(b), s.tb ? " (transposed)" : "");
  Shape ab(a.begin(), a.end() - 2), bb(b.begin(), b.end() - 2);
  s.batch = broadcast_shapes(ab, bb);
  s.a_batch = Shape(s.batch.size() - ab.size(), 1);
  s.a_batch.insert(s.a_batch.end(), ab.begin(), ab.end());
  s.b_batch = Shape(s.batch.size() - bb.size(), 1);
  s.b_batch.insert(s.b_batch.end(), bb.begin(), bb.end());
  s.out = s.batch;
  s.out.push_back(s.M);
  s.out.push_back(s.N);
  return s;
}

// For each output batch index, the matrix index into A and into B (broadcast dims repeat).
void batch_offsets(const MatMulShape& s, std::vector<int64_t>& ai, std::vector<int64_t>& bi) {
  kernels::broadcast_batch_offsets(s.batch, s.a_batch, s.b_batch, ai, bi);
}

// ---- batched GEMM: MatMul's float path and onyx.MatMulT -------------------------------------

template <class T>
void gemm_strided_batched(bool ta, bool tb, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
                          int64_t lda, int64_t sA, const T* B, int64_t ldb, int64_t sB, T* C,
                          int64_t ldc, int64_t sC, int64_t batch) {
  if (batch <= 0 || M <= 0 || N <= 0) return;
  if constexpr (std::is_same_v<T, float>) {
    if (K > 0) {
      kernels::sgemm_strided_batched(ta, tb, M, N, K, alpha, A, std::max<int64_t>(1, lda), sA, B,
                                     std::max<int64_t>(1, ldb), sB, 0.f, C,
                                     std::max<int64_t>(1, ldc), sC, batch);
      return;
    }
  }
  for (int64_t i = 0; i < batch; i++)
    gemm<T>(ta, tb, M, N, K, alpha, A + i * sA, lda, B + i * sB, ldb, T(0), C + i * sC, ldc);
}

// Y (R, N) += bias (N) after a batched GEMM (paths that cannot start from the bias).
template <class T>
void add_rows(T* C, int64_t R, int64_t N, const T* bias) {
  parallel_for(R, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, N)),
               [&](int64_t r0, int64_t r1) {
                 for (int64_t r = r0; r < r1; r++) {
                   T* c = C + r * N;
#pragma omp simd
                   for (int64_t j = 0; j < N; j++) c[j] += bias[j];
                 }
               });
}

// Y = alpha · op(A) · op(B) (+ bias) in float (sgemm) or double (dgemm) for any batch broadcast:
// MatMul's float path (alpha 1, no transposes, no bias) and onyx.MatMulT.
template <class T>
void matmul_t(const MatMulShape& s, T alpha, const T* A, const T* B, T* C,
              const T* bias = nullptr) {
  const int64_t M = s.M, N = s.N, K = s.K;
  const int64_t lda = s.ta ? M : K, ldb = s.tb ? K : N;
  const int64_t na = shape_numel(s.a_batch), nbm = shape_numel(s.b_batch);
  const int64_t nb = shape_numel(s.batch);
  if (nbm == 1 && !s.ta) {
    // (na·M, K) x op(B): a shared 2-D right operand — one GEMM over every row of A. A float32
    // linear layer's forward (B transposed, or a bias) through linear_f32 (a weight packed once
    // per step, the bias in the epilogue); an input gradient's X·W stays on sgemm: packing W in
    // its second layout too cost bert-base ~340 MB of resident memory for no measured gain
    // beyond noise. Otherwise Y starts as the bias rows and the GEMM adds onto them (beta = 1).
    if constexpr (std::is_same_v<T, float>) {
      if (bias || s.tb)
        return kernels::linear_f32(s.tb, na * M, N, K, alpha, A, lda, B, ldb, bias, C);
    }
    if (bias) kernels::fill_rows(C, na * M, N * sizeof(T), bias);  // the GEMM adds onto it
    gemm<T>(false, s.tb, na * M, N, K, alpha, A, lda, B, ldb, bias ? T(1) : T(0), C, N);
    return;
  }
  if (na == 1) {
    gemm_strided_batched<T>(s.ta, s.tb, M, N, K, alpha, A, lda, 0, B, ldb, K * N, C, N, M * N, nb);
  } else if (nbm == 1) {
    gemm_strided_batched<T>(s.ta, s.tb, M, N, K, alpha, A, lda, M * K, B, ldb, 0, C, N, M * N, nb);
  } else if (s.a_batch == s.b_batch) {
    gemm_strided_batched<T>(s.ta, s.tb, M, N, K, alpha, A, lda, M * K, B, ldb, K * N, C, N, M * N,
                            nb);
  } else {  // both broadcast, in different dims: one GEMM per output matrix
    std::vector<int64_t> ai, bi;
    batch_offsets(s, ai, bi);
    for (int64_t i = 0; i < nb; i++)
      gemm<T>(s.ta, s.tb, M, N, K, alpha, A + ai[i] * M * K, lda, B + bi[i] * K * N, ldb, T(0),
              C + i * M * N, N);
  }
  if (bias) add_rows<T>(C, nb * M, N, bias);
}

// ---- MatMul ----------------------------------------------------------------------------------

// Exact loop for float64 and integers: rows of all batches in parallel, i-k-j order.
template <class T>
void matmul_loop(const MatMulShape& s, const T* A, const T* B, T* C) {
  const int64_t M = s.M, N = s.N, K = s.K;
  std::vector<int64_t> ai, bi;
  batch_offsets(s, ai, bi);
  int64_t rows = (int64_t)ai.size() * M;
  parallel_for(rows, std::max<int64_t>(1, 4096 / std::max<int64_t>(1, N * K)),
               [&](int64_t r0, int64_t r1) {
                 for (int64_t r = r0; r < r1; r++) {
                   int64_t b = r / M, m = r % M;
                   const T* a = A + ai[b] * M * K + m * K;
                   const T* bm = B + bi[b] * K * N;
                   T* c = C + r * N;
                   std::fill(c, c + N, T(0));
                   for (int64_t k = 0; k < K; k++) {
                     T av = a[k];
                     const T* brow = bm + k * N;
                     for (int64_t n = 0; n < N; n++) c[n] += av * brow[n];
                   }
                 }
               });
}

// Calls f(T{}) with T the C++ type of an exact-loop dtype; false if dtype is not one.
template <class F>
bool dispatch_exact(DType dt, F&& f) {
  switch (dt) {
    case DType::Float64:
      f(double{});
      return true;
    case DType::Int32:
      f(int32_t{});
      return true;
    case DType::Int64:
      f(int64_t{});
      return true;
    case DType::UInt32:
      f(uint32_t{});
      return true;
    case DType::UInt64:
      f(uint64_t{});
      return true;
    default:
      return false;
  }
}

void matmul_infer(InferContext& ctx) {
  const auto& a = ctx.input(0);
  const auto& b = ctx.input(1);
  check_same_dtype(ctx.node, a.dtype, b.dtype);
  ctx.set_output(0, a.dtype, matmul_shape(a.shape, b.shape, ctx.node).out);
}

// A float32 operand rounded to `lp` (mixed precision: bf16, or float16 emulated) and held in
// float32, in per-thread scratch `slot` (0 or 1) kept across calls.
const float* rounded_operand(const Tensor& t, kernels::LowPrecision lp, int slot) {
  thread_local std::vector<float> scratch[2];
  std::vector<float>& buf = scratch[slot];
  if (buf.size() < (size_t)t.numel()) buf.resize((size_t)t.numel());
  kernels::round_to(lp, t.data<float>(), buf.data(), t.numel());
  return buf.data();
}

void matmul_compute(KernelContext& ctx) {
  const Tensor& a = ctx.input(0);
  const Tensor& b = ctx.input(1);
  Tensor& y = ctx.output(0);
  MatMulShape s = matmul_shape(a.shape(), b.shape(), ctx.node);
  if (y.numel() == 0) return;
  if (s.K == 0) {  // empty sum
    std::memset(y.raw(), 0, y.nbytes());
    return;
  }
  DType dt = a.dtype();
  // Mixed precision: standard MatMul and Gemm (a bias-free Linear as exported, unfused
  // attention, a forward without labels) take rounded operands like the fused GEMMs, as autocast
  // runs every matmul — except an outer product (K = 1: no sum to speed up, and how exported
  // rotary embeddings build position x frequency tables, which Transformers computes with
  // autocast off: a position above 256 is not a bf16 value).
  const kernels::LowPrecision lp =
      s.K == 1 ? kernels::LowPrecision::None : kernels::low_precision(ctx);
  if (dt == DType::Float32 && lp != kernels::LowPrecision::None)
    return matmul_t<float>(s, 1.f, rounded_operand(a, lp, 0), rounded_operand(b, lp, 1),
                           y.data<float>());
  if (dt == DType::Float32)
    return matmul_t<float>(s, 1.f, a.data<float>(), b.data<float>(), y.data<float>());
  if (dt == DType::Float16 || dt == DType::BFloat16) {
    auto af = to_f32(a), bf = to_f32(b);
    std::vector<float> yf(y.numel());
    matmul_t<float>(s, 1.f, af.data(), bf.data(), yf.data());
    return from_f32(yf, y);
  }
  bool ok = dispatch_exact(dt, [&](auto t) {
    using T = decltype(t);
    matmul_loop<T>(s, a.data<T>(), b.data<T>(), y.data<T>());
  });
  if (!ok) ONYX_UNSUPPORTED(ctx.node.describe(), ": MatMul of dtype ", dtype_name(dt));
}

// ---- Gemm ------------------------------------------------------------------------------------

// Y (M,N) = alpha · op(A) · op(B) + beta · C, C unidirectionally broadcast to (M,N).
struct GemmShape {
  int64_t M, N, K;
  bool transA, transB;
};

GemmShape gemm_shape(const ir::Node& node, const Shape& a, const Shape& b, const Shape* c) {
  ONYX_CHECK(a.size() == 2 && b.size() == 2, node.describe(), ": Gemm needs 2-D A and B, got ",
             shape_str(a), " and ", shape_str(b));
  GemmShape g;
  g.transA = node.attr_int("transA", 0) != 0;
  g.transB = node.attr_int("transB", 0) != 0;
  g.M = g.transA ? a[1] : a[0];
  g.K = g.transA ? a[0] : a[1];
  int64_t kb = g.transB ? b[1] : b[0];
  g.N = g.transB ? b[0] : b[1];
  ONYX_CHECK(g.K == kb, node.describe(), ": Gemm inner dimensions differ: A ", shape_str(a),
             (g.transA ? " (transposed)" : ""), " and B ", shape_str(b),
             (g.transB ? " (transposed)" : ""));
  if (c != nullptr) {
    bool ok = c->size() <= 2;
    if (c->size() >= 1) ok = ok && (c->back() == 1 || c->back() == g.N);
    if (c->size() == 2) ok = ok && ((*c)[0] == 1 || (*c)[0] == g.M);
    ONYX_CHECK(ok, node.describe(), ": Gemm C ", shape_str(*c),
               " cannot be broadcast to the output [", g.M, ", ", g.N, "]");
  }
  return g;
}

// Value of C broadcast at (i, j).
struct BroadcastC {
  int64_t rows = 1, cols = 1;
  explicit BroadcastC(const Shape& c) {
    if (c.size() == 2) rows = c[0];
    if (!c.empty()) cols = c.back();
  }
  int64_t at(int64_t i, int64_t j) const {
    return (rows == 1 ? 0 : i) * cols + (cols == 1 ? 0 : j);
  }
};

void gemm_f32(const GemmShape& g, float alpha, float beta, const float* A, int64_t lda,
              const float* B, int64_t ldb, const float* C, const Shape* c_shape, float* Y) {
  float beta_eff = 0.f;
  if (C != nullptr && beta != 0.f) {
    BroadcastC bc(*c_shape);
    parallel_for(g.M, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, g.N)),
                 [&](int64_t i0, int64_t i1) {
                   for (int64_t i = i0; i < i1; i++)
                     for (int64_t j = 0; j < g.N; j++) Y[i * g.N + j] = C[bc.at(i, j)];
                 });
    beta_eff = beta;
  }
  kernels::sgemm(g.transA, g.transB, g.M, g.N, g.K, alpha, A, lda, B, ldb, beta_eff, Y, g.N);
}

template <class T>
void gemm_loop(const GemmShape& g, double alpha, double beta, const T* A, int64_t lda, const T* B,
               int64_t ldb, const T* C, const Shape* c_shape, T* Y) {
  BroadcastC bc(c_shape ? *c_shape : Shape{});
  parallel_for(g.M, 1, [&](int64_t i0, int64_t i1) {
    std::vector<T> acc(g.N);
    for (int64_t i = i0; i < i1; i++) {
      std::fill(acc.begin(), acc.end(), T(0));
      for (int64_t k = 0; k < g.K; k++) {
        T av = g.transA ? A[k * lda + i] : A[i * lda + k];
        if (g.transB)
          for (int64_t j = 0; j < g.N; j++) acc[j] += av * B[j * ldb + k];
        else
          for (int64_t j = 0; j < g.N; j++) acc[j] += av * B[k * ldb + j];
      }
      for (int64_t j = 0; j < g.N; j++) {
        double v = alpha * (double)acc[j];
        if (C != nullptr) v += beta * (double)C[bc.at(i, j)];
        Y[i * g.N + j] = (T)v;
      }
    }
  });
}

void gemm_infer(InferContext& ctx) {
  const auto& a = ctx.input(0);
  const auto& b = ctx.input(1);
  check_same_dtype(ctx.node, a.dtype, b.dtype);
  const Shape* c = nullptr;
  if (ctx.has_input(2)) {
    check_same_dtype(ctx.node, a.dtype, ctx.input(2).dtype);
    c = &ctx.input(2).shape;
  }
  GemmShape g = gemm_shape(ctx.node, a.shape, b.shape, c);
  ctx.set_output(0, a.dtype, {g.M, g.N});
}

void gemm_compute(KernelContext& ctx) {
  const Tensor& a = ctx.input(0);
  const Tensor& b = ctx.input(1);
  const Tensor* c = ctx.has_input(2) ? &ctx.input(2) : nullptr;
  const Shape* c_shape = c ? &c->shape() : nullptr;
  Tensor& y = ctx.output(0);
  GemmShape g = gemm_shape(ctx.node, a.shape(), b.shape(), c_shape);
  float alpha = ctx.node.attr_float("alpha", 1.f), beta = ctx.node.attr_float("beta", 1.f);
  int64_t lda = std::max<int64_t>(1, a.dim(1)), ldb = std::max<int64_t>(1, b.dim(1));
  if (y.numel() == 0) return;
  DType dt = a.dtype();
  const kernels::LowPrecision lp =  // (as MatMul: not an outer product)
      g.K == 1 ? kernels::LowPrecision::None : kernels::low_precision(ctx);
  if (dt == DType::Float32 && lp != kernels::LowPrecision::None)  // (C, the bias, stays float32)
    return gemm_f32(g, alpha, beta, rounded_operand(a, lp, 0), lda, rounded_operand(b, lp, 1), ldb,
                    c ? c->data<float>() : nullptr, c_shape, y.data<float>());
  if (dt == DType::Float32)
    return gemm_f32(g, alpha, beta, a.data<float>(), lda, b.data<float>(), ldb,
                    c ? c->data<float>() : nullptr, c_shape, y.data<float>());
  if (dt == DType::Float16 || dt == DType::BFloat16) {
    auto af = to_f32(a), bf = to_f32(b);
    std::vector<float> cf, yf(y.numel());
    if (c) cf = to_f32(*c);
    gemm_f32(g, alpha, beta, af.data(), lda, bf.data(), ldb, c ? cf.data() : nullptr, c_shape,
             yf.data());
    return from_f32(yf, y);
  }
  bool ok = dispatch_exact(dt, [&](auto t) {
    using T = decltype(t);
    gemm_loop<T>(g, alpha, beta, a.data<T>(), lda, b.data<T>(), ldb, c ? c->data<T>() : nullptr,
                 c_shape, y.data<T>());
  });
  if (!ok) ONYX_UNSUPPORTED(ctx.node.describe(), ": Gemm of dtype ", dtype_name(dt));
}

// ---- onyx.MatMulT ----------------------------------------------------------------------------

// The optional bias (input 2): 1-D of N elements, the output's dtype.
void check_bias(const ir::Node& node, const TensorMeta& bias, DType dt, int64_t N) {
  ONYX_CHECK(bias.dtype == dt, node.describe(), ": bias is ", dtype_name(bias.dtype), ", A and B ",
             dtype_name(dt));
  ONYX_CHECK(bias.rank() == 1 && bias.shape[0] == N, node.describe(), ": bias ",
             shape_str(bias.shape), " must be 1-D of the output's last dim (", N, ")");
}

// The bias as T (float32 / float64 copied as they are; float16 / bfloat16 through float32).
template <class T>
std::vector<T> bias_values(const Tensor& b) {
  std::vector<T> v(b.numel());
  switch (b.dtype()) {
    case DType::Float32:
      for (size_t i = 0; i < v.size(); i++) v[i] = (T)b.data<float>()[i];
      break;
    case DType::Float64:
      for (size_t i = 0; i < v.size(); i++) v[i] = (T)b.data<double>()[i];
      break;
    default: {
      std::vector<float> f = to_f32(b);
      for (size_t i = 0; i < v.size(); i++) v[i] = (T)f[i];
    }
  }
  return v;
}

// Mixed precision: float32 and bfloat16 operands together (a frozen bf16 weight, models/lora.h,
// or a value passes/mixed_precision.cc stores in bf16), or an `output_dtype` = FLOAT attribute
// (that pass's GEMMs, which may read two bf16 operands): bf16 inputs, float32 accumulation and
// output.
bool mixed_pair(DType a, DType b) {
  return (a == DType::Float32 && b == DType::BFloat16) ||
         (a == DType::BFloat16 && b == DType::Float32);
}
bool mixed_output(const ir::Node& node, DType a, DType b) {
  if (mixed_pair(a, b)) return true;
  const int64_t out = node.attr_int("output_dtype", 0);
  if (out == 0) return false;
  ONYX_CHECK(
      (out == (int64_t)DType::Float32 || out == (int64_t)DType::BFloat16) &&
          (a == DType::Float32 || a == DType::BFloat16) &&
          (b == DType::Float32 || b == DType::BFloat16),
      node.describe(), ": output_dtype ", out,
      " is supported only as FLOAT (1) or BFLOAT16 (16) over float32 / bfloat16 inputs, got ",
      dtype_name(a), " and ", dtype_name(b));
  return true;
}
// The output of a mixed product: float32, or bfloat16 with output_dtype = BFLOAT16 (MatMulT only:
// accumulated in float32, bias added, then rounded to nearest even in the GEMM's epilogue —
// kernels::f32_to_bf16's rule: Cast's, except that a float32 denormal result becomes a signed 0).
DType mixed_output_dtype(const ir::Node& node) {
  return node.attr_int("output_dtype", 1) == (int64_t)DType::BFloat16 ? DType::BFloat16
                                                                      : DType::Float32;
}
kernels::Bf16Operand bf16_operand(const Tensor& t) {
  if (t.dtype() == DType::BFloat16) return {nullptr, t.data<uint16_t>()};
  return {t.data<float>(), nullptr};
}

// Y = alpha · op(A) · op(B) (+ bias), Y float32 or bf16, with each of A and B float32 (rounded
// to bf16) or bf16: a shared 2-D B without transA (the linear layers, forward and dX) is one
// linear_mixed_bf16 over every row of A (bias and rounding in the GEMM's epilogue); other layouts
// (not the linear layers' hot path) round both to bf16, widen them and run the float32 path, then
// round a bf16 Y as that epilogue does: the same values.
void matmul_t_mixed(const MatMulShape& s, float alpha, const Tensor& a, const Tensor& b,
                    const float* bias, Tensor& y) {
  const int64_t na = shape_numel(s.a_batch), nbm = shape_numel(s.b_batch);
  const bool y_bf16 = y.dtype() == DType::BFloat16;
  if (nbm == 1 && !s.ta) {
    kernels::LinearOut out;
    out.bias = bias;
    if (y_bf16)
      out.bf16 = y.data<uint16_t>();
    else
      out.f32 = y.data<float>();
    kernels::linear_mixed_bf16(s.tb, na * s.M, s.N, s.K, alpha, bf16_operand(a), s.K,
                               bf16_operand(b), s.tb ? s.K : s.N, out);
    return;
  }
  auto widened = [](const Tensor& t) {  // bf16-rounded values as float32
    std::vector<float> f((size_t)t.numel());
    if (t.dtype() == DType::BFloat16) {
      kernels::bf16_to_f32(t.data<uint16_t>(), f.data(), t.numel());
    } else {
      std::vector<uint16_t> r((size_t)t.numel());
      kernels::f32_to_bf16(t.data<float>(), r.data(), t.numel());
      kernels::bf16_to_f32(r.data(), f.data(), t.numel());
    }
    return f;
  };
  std::vector<float> af = widened(a), bf = widened(b);
  if (!y_bf16) return matmul_t<float>(s, alpha, af.data(), bf.data(), y.data<float>(), bias);
  std::vector<float> y32((size_t)y.numel());
  matmul_t<float>(s, alpha, af.data(), bf.data(), y32.data(), bias);
  kernels::f32_to_bf16(y32.data(), y.data<uint16_t>(), y.numel());
}

void matmul_t_infer(InferContext& ctx) {
  const auto& a = ctx.input(0);
  const auto& b = ctx.input(1);
  const bool mixed = mixed_output(ctx.node, a.dtype, b.dtype);
  if (!mixed) check_float(ctx.node, a.dtype, b.dtype);
  const DType out = mixed ? mixed_output_dtype(ctx.node) : a.dtype;
  MatMulShape s = mmt_shape(ctx.node, a.shape, b.shape);
  if (ctx.node.has_input(2)) check_bias(ctx.node, ctx.input(2), mixed ? DType::Float32 : out, s.N);
  ctx.set_output(0, out, s.out);
}

void matmul_t_compute(KernelContext& ctx) {
  const Tensor& a = ctx.input(0);  // (...a, M, K) or (...a, K, M) with transA
  const Tensor& b = ctx.input(1);  // (...b, K, N) or (...b, N, K) with transB
  Tensor& y = ctx.output(0);       // (broadcast(...a, ...b), M, N)
  const Tensor* bias = ctx.node.has_input(2) ? &ctx.input(2) : nullptr;  // (N) or absent
  MatMulShape s = mmt_shape(ctx.node, a.shape(), b.shape());
  if (y.numel() == 0) return;
  double alpha = ctx.node.attr_float("alpha", 1.f);
  if (kernels::low_precision(ctx) == kernels::LowPrecision::Fp16 && a.dtype() == DType::Float32 &&
      b.dtype() == DType::Float32 && y.dtype() == DType::Float32 &&
      (!bias || bias->dtype() == DType::Float32)) {
    // TrainingArguments.fp16 (emulated): both operands rounded to float16, float32 GEMM
    const float* A = rounded_operand(a, kernels::LowPrecision::Fp16, 0);
    const float* B = rounded_operand(b, kernels::LowPrecision::Fp16, 1);
    return matmul_t<float>(s, (float)alpha, A, B, y.data<float>(),
                           bias ? bias->data<float>() : nullptr);
  }
  const bool as_bf16 = ctx.bf16_gemm && a.dtype() == DType::Float32 && b.dtype() == DType::Float32;
  const bool mixed = as_bf16 || mixed_output(ctx.node, a.dtype(), b.dtype());
  const DType acc = mixed ? DType::Float32 : y.dtype();  // the bias's type
  ONYX_CHECK(!bias || (bias->dtype() == acc && bias->rank() == 1 && bias->dim(0) == s.N),
             ctx.node.describe(), ": bias ", shape_str(bias->shape()), " ",
             dtype_name(bias->dtype()), " does not fit the output (", s.N, " columns)");
  if (mixed) {
    std::vector<float> bv;
    if (bias) bv = bias_values<float>(*bias);
    return matmul_t_mixed(s, (float)alpha, a, b, bias ? bv.data() : nullptr, y);
  }
  dispatch_float(
      ctx.node, y,
      [&](auto* A, auto* B, auto* C) {
        using T = std::remove_cv_t<std::remove_pointer_t<decltype(C)>>;
        if (!bias) return matmul_t<T>(s, (T)alpha, A, B, C);
        if constexpr (std::is_same_v<T, float>) {
          if (bias->dtype() == DType::Float32)
            return matmul_t<T>(s, (T)alpha, A, B, C, bias->data<float>());
        }
        std::vector<T> bv = bias_values<T>(*bias);
        matmul_t<T>(s, (T)alpha, A, B, C, bv.data());
      },
      a, b);
}

// ---- MatMulGradB -----------------------------------------------------------------------------

void matmul_grad_b_infer(InferContext& ctx) {
  const auto& a = ctx.input(0);
  const auto& dy = ctx.input(1);
  const bool mixed = mixed_output(ctx.node, a.dtype, dy.dtype);
  if (!mixed) check_float(ctx.node, a.dtype, dy.dtype);
  ONYX_CHECK(ctx.node.attr_int("output_dtype", 1) == (int64_t)DType::Float32, ctx.node.describe(),
             ": MatMulGradB writes a float32 gradient (output_dtype FLOAT only)");
  ONYX_CHECK(a.rank() >= 1 && dy.rank() >= 1, ctx.node.describe(),
             ": MatMulGradB needs rank >= 1, got ", shape_str(a.shape), " and ",
             shape_str(dy.shape));
  int64_t K = a.shape.back(), N = dy.shape.back();
  int64_t ra = K ? a.numel() / K : shape_numel(Shape(a.shape.begin(), a.shape.end() - 1));
  int64_t rd = N ? dy.numel() / N : shape_numel(Shape(dy.shape.begin(), dy.shape.end() - 1));
  ONYX_CHECK(ra == rd, ctx.node.describe(), ": MatMulGradB rows differ: A ", shape_str(a.shape),
             " has ", ra, ", dY ", shape_str(dy.shape), " has ", rd);
  ctx.set_output(0, mixed ? DType::Float32 : a.dtype, {K, N});
}

void matmul_grad_b_compute(KernelContext& ctx) {
  const Tensor& a = ctx.input(0);   // (R..., K)
  const Tensor& dy = ctx.input(1);  // (R..., N)
  Tensor& y = ctx.output(0);        // (K, N)
  int64_t K = a.dim(-1), N = dy.dim(-1);
  int64_t R = shape_numel(Shape(a.shape().begin(), a.shape().end() - 1));
  if (y.numel() == 0) return;
  double alpha = ctx.node.attr_float("alpha", 1.f);
  // bf16 inputs, float32 accumulation: a mixed pair or output_dtype (the mixed-precision pass),
  // or float32 operands rounded per call under KernelContext::bf16_gemm.
  const bool mixed = mixed_output(ctx.node, a.dtype(), dy.dtype()) ||
                     (ctx.bf16_gemm && a.dtype() == DType::Float32 && dy.dtype() == DType::Float32);
  // TrainingArguments.fp16 (emulated): float32 operands rounded to float16, float32 GEMM
  const bool as_fp16 = !mixed && kernels::low_precision(ctx) == kernels::LowPrecision::Fp16 &&
                       a.dtype() == DType::Float32 && dy.dtype() == DType::Float32 &&
                       y.dtype() == DType::Float32;
  const float* a16 = as_fp16 ? rounded_operand(a, kernels::LowPrecision::Fp16, 0) : nullptr;
  const float* dy16 = as_fp16 ? rounded_operand(dy, kernels::LowPrecision::Fp16, 1) : nullptr;
  if (ctx.accumulates(0)) {
    // y += A^T dY (a bound gradient, micro-batches accumulating). Not beta = 1: the GEMM would
    // fold y into its K-blocked partial sums, and the sum must be y + (A^T dY) exactly as a
    // separate onyx.AccumulateGrad computed it. The product goes through a scratch matrix.
    ONYX_CHECK(y.dtype() == DType::Float32 &&
                   (mixed || (a.dtype() == DType::Float32 && dy.dtype() == DType::Float32)),
               ctx.node.describe(), ": accumulation supports float32 gradients, got ",
               dtype_name(y.dtype()));
    std::vector<float> tmp((size_t)(K * N));
    if (mixed)
      kernels::gemm_mixed_bf16(true, false, K, N, R, (float)alpha, bf16_operand(a), K,
                               bf16_operand(dy), N, 0.f, tmp.data(), N);
    else
      gemm<float>(true, false, K, N, R, (float)alpha, as_fp16 ? a16 : a.data<float>(), K,
                  as_fp16 ? dy16 : dy.data<float>(), N, 0.f, tmp.data(), N);
    float* out = y.data<float>();
    parallel_for(K * N, 1 << 15, [&](int64_t b, int64_t e) {
#pragma omp simd
      for (int64_t i = b; i < e; i++) out[i] += tmp[i];
    });
    return;
  }
  if (mixed)
    return kernels::gemm_mixed_bf16(true, false, K, N, R, (float)alpha, bf16_operand(a), K,
                                    bf16_operand(dy), N, 0.f, y.data<float>(), N);
  if (as_fp16)
    return gemm<float>(true, false, K, N, R, (float)alpha, a16, K, dy16, N, 0.f, y.data<float>(),
                       N);
  dispatch_float(
      ctx.node, y,
      [&](auto* A, auto* D, auto* C) {
        using T = std::remove_cv_t<std::remove_pointer_t<decltype(C)>>;
        gemm<T>(true, false, K, N, R, (T)alpha, A, K, D, N, T(0), C, N);
      },
      a, dy);
}

// ---- BiasGrad --------------------------------------------------------------------------------

void bias_grad_infer(InferContext& ctx) {
  const auto& dy = ctx.input(0);
  if (!is_float(dy.dtype)) ONYX_UNSUPPORTED(ctx.node.describe(), ": dtype ", dtype_name(dy.dtype));
  ONYX_CHECK(dy.rank() >= 1, ctx.node.describe(), ": BiasGrad needs rank >= 1, got ",
             shape_str(dy.shape));
  ctx.set_output(0, dy.dtype, {dy.shape.back()});
  if (ctx.num_outputs() > 1) {
    ONYX_CHECK(dy.dtype == DType::Float32, ctx.node.describe(),
               ": the bf16 copy of dY (output 1) needs a float32 dY, got ", dtype_name(dy.dtype));
    ctx.set_output(1, DType::BFloat16, dy.shape);
  }
}

// BiasGrad's sum, in parts of rows: every part sums its rows in order, then the parts are added
// in order. The parts are fixed by R alone (at least 128 rows each, at most 64 parts), so the
// order never depends on the thread count; the threads split (part, column block) tiles, which
// stream whole row segments and keep both threads busy whatever N is.
int64_t bias_rows_per_part(int64_t R) { return std::max<int64_t>(128, (R + 63) / 64); }
constexpr int64_t kBiasColumns = 1024;  // columns per tile (a 4 KiB float32 row segment)

// part[c] = sum over rows [r0, r1) of D[r, c] for c in [c0, c1) (row segment by row segment). With
// `copy` (float32 only), copy[r, c] = D[r, c] rounded to bf16 as Cast rounds, from the same reads.
template <class T>
void tile_sums(const T* D, int64_t r0, int64_t r1, int64_t N, int64_t c0, int64_t c1, T* part,
               BFloat16* copy) {
  const int64_t w = c1 - c0;
  T* acc = part + c0;
  std::fill(acc, acc + w, T(0));
  for (int64_t r = r0; r < r1; r++) {
    const T* d = D + r * N + c0;
#pragma omp simd
    for (int64_t j = 0; j < w; j++) acc[j] += d[j];
    if constexpr (std::is_same_v<T, float>)
      if (copy) ew::from_float(d, copy + r * N + c0, w);
  }
}

// db = the column sums of D (R, N); with `add`, db += them (formed first, then added once).
template <class T>
void bias_grad_sums(const T* D, int64_t R, int64_t N, T* db, bool add, BFloat16* copy) {
  const int64_t rows = bias_rows_per_part(R), parts = std::max<int64_t>(1, (R + rows - 1) / rows);
  const int64_t blocks = (N + kBiasColumns - 1) / kBiasColumns;
  std::vector<T> partial((size_t)(parts * N));
  parallel_for(parts * blocks, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; t++) {
      const int64_t p = t / blocks, c0 = (t % blocks) * kBiasColumns;
      tile_sums<T>(D, p * rows, std::min(R, (p + 1) * rows), N, c0, std::min(N, c0 + kBiasColumns),
                   partial.data() + p * N, copy);
    }
  });
  parallel_for(N, 256, [&](int64_t c0, int64_t c1) {
    for (int64_t j = c0; j < c1; j++) {
      T sum = partial[(size_t)j];
      for (int64_t p = 1; p < parts; p++) sum += partial[(size_t)(p * N + j)];
      db[j] = add ? T(db[j] + sum) : sum;
    }
  });
}

void bias_grad_compute(KernelContext& ctx) {
  const Tensor& dy = ctx.input(0);  // (R..., N)
  Tensor& db = ctx.output(0);       // (N)
  const int64_t N = dy.dim(-1);
  if (N == 0) return;
  const int64_t R = dy.numel() / N;
  const bool add = ctx.accumulates(0);  // db is a bound gradient: db += column sums
  ONYX_CHECK(!add || (dy.dtype() == DType::Float32 && db.dtype() == DType::Float32),
             ctx.node.describe(), ": accumulation supports float32 gradients, got ",
             dtype_name(db.dtype()));
  // the fused bf16 copy of dY (infer admits it for float32 only, where T is float)
  BFloat16* copy = ctx.has_output(1) ? ctx.output(1).data<BFloat16>() : nullptr;
  auto run = [&](auto* D, auto* out) {
    using T = std::remove_cv_t<std::remove_pointer_t<decltype(out)>>;
    bias_grad_sums<T>(D, R, N, out, add, copy);
  };
  dispatch_float(ctx.node, db, run, dy);
}

}  // namespace

ONYX_REGISTER_KERNELS(matmul, Cpu) {
  OpTraits& mm = r.add("", "MatMul", OpKernel{matmul_infer, matmul_compute, {}});
  mm.precision = OpTraits::Precision::LowPrecision;
  mm.flops = [](const ir::Node&, const std::vector<const TensorMeta*>& in,
                const std::vector<const TensorMeta*>& out) {
    return in[0] && out[0] && !in[0]->shape.empty()
               ? 2 * shape_product(out[0]->shape) * (double)in[0]->shape.back()
               : 0.0;
  };
  OpTraits& gemm = r.add("", "Gemm", OpKernel{gemm_infer, gemm_compute, {}});
  gemm.precision = OpTraits::Precision::LowPrecision;
  gemm.flops = gemm_like_flops;
  using Metas = std::vector<const TensorMeta*>;
  constexpr auto low = OpTraits::Precision::LowPrecision;
  OpTraits& mmt = r.add("onyx", "MatMulT", OpKernel{matmul_t_infer, matmul_t_compute, {}});
  mmt.precision = low;
  mmt.flops = gemm_like_flops;
  // MatMulGradB and BiasGrad can add into a bound weight / bias gradient (gradient_into_buffer.cc).
  OpTraits& gb = r.add("onyx", "MatMulGradB",
                       OpKernel{matmul_grad_b_infer, matmul_grad_b_compute, {}, {}, {0}});
  gb.precision = low;
  gb.flops = [](const ir::Node&, const Metas& in, const Metas& out) {
    // (K,N) = A(R,K)^T dY(R,N): 2·R·K·N
    return in[0] && out[0] && !in[0]->shape.empty() && !out[0]->shape.empty()
               ? 2 * shape_product(in[0]->shape) * (double)out[0]->shape.back()
               : 0.0;
  };
  r.add("onyx", "BiasGrad", OpKernel{bias_grad_infer, bias_grad_compute, {}, {}, {0}});
}

}  // namespace onyx::kernels
