// grad_matmul.cc — fused gradient kernels of the matmul family ("onyx" domain), emitted by the
// rules in autodiff/gradients/matmul.cc:
//   MatMulT(A, B, bias?)  transA, transB, alpha   Y = alpha · op(A) · op(B) (+ bias), numpy batch
//                                                 broadcast, op(X) swaps X's last two dims (no
//                                                 copy: GEMM flags); bias (N) is broadcast over the
//                                                 rows (the Linear layers passes/linear_fusion.cc
//                                                 makes)
//   MatMulGradB(A, dY)    alpha                   (K,N) = alpha · A(R,K)^T · dY(R,N), R = every
//                                                 leading dim of A and dY folded (they must agree)
//   BiasGrad(dY)                                  (N) = dY(R,N) summed over its R leading rows (the
//                                                 bias gradient of MatMulT; columns split over
//                                                 threads, so the sum order never changes)
//   ConvGradInput(dY, W)  strides pads dilations group input_shape   dX of Conv (N,C,in...)
//   ConvGradWeight(dY, X) strides pads dilations group kernel_shape  dW of Conv (M,C/group,k...)
// pads are explicit (begin..., end...): the rule resolves auto_pad. Conv is 1-, 2- or 3-D.
// MatMulGradB, BiasGrad and ConvGradWeight write parameter gradients straight into the trainer's
// flat gradient buffer (passes/gradient_into_buffer.cc); accumulating micro-batches they add
// out + (the gradient as computed alone), so gradient accumulation is bit-identical to a separate
// onyx.AccumulateGrad.
//
// Hand-written because these are the forward and backward of every linear layer and patch
// embedding: the weight gradient of (B,T,K)x(K,N) is ONE (K x B·T) x (B·T x N) GEMM with transA,
// never B small ones and never a materialized transpose; Conv's gradients are im2col + GEMM (+
// col2im), with the per-sample work threaded over samples (per-thread partial dW, summed in a fixed
// order, so results are deterministic for a given thread count). float32 calls kernels::sgemm;
// float16 and bfloat16 are converted to float32 around the same code; float64 uses a plain loop
// GEMM.
#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/nn_util.h"
#include "runtime/kernel.h"
#include "runtime/parallel.h"

namespace onyx::runtime {
namespace {

using nnutil::from_f32;
using nnutil::to_f32;

// ---- GEMM on float / double --------------------------------------------------------------------

// C(M,N) = alpha op(A) op(B) + beta C for double: exact loop, rows in parallel.
void dgemm_loop(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const double* A,
                int64_t lda, const double* B, int64_t ldb, double beta, double* C, int64_t ldc) {
  parallel_for(M, std::max<int64_t>(1, 4096 / std::max<int64_t>(1, N * K)),
               [&](int64_t i0, int64_t i1) {
                 std::vector<double> acc(N);
                 for (int64_t i = i0; i < i1; i++) {
                   std::fill(acc.begin(), acc.end(), 0.0);
                   for (int64_t k = 0; k < K; k++) {
                     double a = ta ? A[k * lda + i] : A[i * lda + k];
                     if (tb)
                       for (int64_t j = 0; j < N; j++) acc[j] += a * B[j * ldb + k];
                     else
                       for (int64_t j = 0; j < N; j++) acc[j] += a * B[k * ldb + j];
                   }
                   double* c = C + i * ldc;
                   for (int64_t j = 0; j < N; j++)
                     c[j] = alpha * acc[j] + (beta == 0.0 ? 0.0 : beta * c[j]);
                 }
               });
}

template <class T>
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda,
          const T* B, int64_t ldb, T beta, T* C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {  // empty sum: C = beta C
    for (int64_t i = 0; i < M; i++)
      for (int64_t j = 0; j < N; j++) C[i * ldc + j] = beta == T(0) ? T(0) : beta * C[i * ldc + j];
    return;
  }
  if constexpr (std::is_same_v<T, float>)
    kernels::sgemm(ta, tb, M, N, K, alpha, A, std::max<int64_t>(1, lda), B,
                   std::max<int64_t>(1, ldb), beta, C, std::max<int64_t>(1, ldc));
  else
    dgemm_loop(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

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


// Runs f(const T* in0, const T* in1, T* out) with T = float (float32, float16, bfloat16 through
// float32 copies) or double. Every kernel here has two float inputs and one output.
template <class F>
void dispatch_float2(KernelContext& ctx, const Tensor& a, const Tensor& b, Tensor& y, F&& f) {
  DType dt = y.dtype();
  ONYX_CHECK(a.dtype() == dt && b.dtype() == dt, ctx.node.describe(), ": inputs are ",
             dtype_name(a.dtype()), " and ", dtype_name(b.dtype()), ", output ", dtype_name(dt));
  switch (dt) {
    case DType::Float32:
      return f(a.data<float>(), b.data<float>(), y.data<float>());
    case DType::Float64:
      return f(a.data<double>(), b.data<double>(), y.data<double>());
    case DType::Float16:
    case DType::BFloat16: {
      auto af = to_f32(a), bf = to_f32(b);
      std::vector<float> yf(y.numel());
      f((const float*)af.data(), (const float*)bf.data(), yf.data());
      return from_f32(yf, y);
    }
    default:
      ONYX_UNSUPPORTED(ctx.node.describe(), ": dtype ", dtype_name(dt));
  }
}

void check_float(const ir::Node& node, DType a, DType b) {
  ONYX_CHECK(a == b, node.describe(), ": inputs have different dtypes ", dtype_name(a), " and ",
             dtype_name(b));
  if (!is_float(a)) ONYX_UNSUPPORTED(node.describe(), ": dtype ", dtype_name(a));
}

// ---- MatMulT ---------------------------------------------------------------------------------

struct MMT {
  int64_t M = 1, N = 1, K = 1;
  bool ta = false, tb = false;
  Shape batch, a_batch, b_batch, out;
};

MMT mmt_shape(const ir::Node& node, const Shape& a, const Shape& b) {
  ONYX_CHECK(a.size() >= 2 && b.size() >= 2, node.describe(), ": MatMulT needs rank >= 2, got ",
             shape_str(a), " and ", shape_str(b));
  MMT s;
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

// Matrix index into A and into B for every output batch index (broadcast dims repeat).
void batch_offsets(const MMT& s, std::vector<int64_t>& ai, std::vector<int64_t>& bi) {
  kernels::broadcast_batch_offsets(s.batch, s.a_batch, s.b_batch, ai, bi);
}

// Y rows (R, N) = bias (N), rows in parallel: the bias is written first and the GEMM then
// accumulates onto it (beta = 1), so the bias costs no extra pass over Y.
template <class T>
void fill_rows(T* C, int64_t R, int64_t N, const T* bias) {
  parallel_for(R, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, N)),
               [&](int64_t r0, int64_t r1) {
                 for (int64_t r = r0; r < r1; r++) std::memcpy(C + r * N, bias, N * sizeof(T));
               });
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

template <class T>
void matmul_t(const MMT& s, T alpha, const T* A, const T* B, T* C, const T* bias = nullptr) {
  const int64_t M = s.M, N = s.N, K = s.K;
  const int64_t lda = s.ta ? M : K, ldb = s.tb ? K : N;
  const int64_t na = shape_numel(s.a_batch), nbm = shape_numel(s.b_batch);
  const int64_t nb = shape_numel(s.batch);
  if (nbm == 1 && !s.ta) {
    // (na·M, K) x op(B): a shared 2-D right operand — one GEMM over every row of A; with a bias,
    // Y starts as the bias rows and the GEMM adds onto them (beta = 1).
    if (bias) fill_rows<T>(C, na * M, N, bias);
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

void matmul_t_infer(InferContext& ctx) {
  const auto& a = ctx.input(0);
  const auto& b = ctx.input(1);
  check_float(ctx.node, a.dtype, b.dtype);
  MMT s = mmt_shape(ctx.node, a.shape, b.shape);
  if (ctx.node.has_input(2)) check_bias(ctx.node, ctx.input(2), a.dtype, s.N);
  ctx.set_output(0, a.dtype, s.out);
}

void matmul_t_compute(KernelContext& ctx) {
  const Tensor& a = ctx.input(0);  // (...a, M, K) or (...a, K, M) with transA
  const Tensor& b = ctx.input(1);  // (...b, K, N) or (...b, N, K) with transB
  Tensor& y = ctx.output(0);       // (broadcast(...a, ...b), M, N)
  const Tensor* bias = ctx.node.has_input(2) ? &ctx.input(2) : nullptr;  // (N) or absent
  MMT s = mmt_shape(ctx.node, a.shape(), b.shape());
  if (y.numel() == 0) return;
  double alpha = ctx.node.attr_float("alpha", 1.f);
  dispatch_float2(ctx, a, b, y, [&](auto* A, auto* B, auto* C) {
    using T = std::remove_cv_t<std::remove_pointer_t<decltype(C)>>;
    if (!bias) return matmul_t<T>(s, (T)alpha, A, B, C);
    ONYX_CHECK(bias->dtype() == y.dtype() && bias->rank() == 1 && bias->dim(0) == s.N,
               ctx.node.describe(), ": bias ", shape_str(bias->shape()), " ",
               dtype_name(bias->dtype()), " does not fit the output (", s.N, " columns)");
    if constexpr (std::is_same_v<T, float>) {
      if (bias->dtype() == DType::Float32)
        return matmul_t<T>(s, (T)alpha, A, B, C, bias->data<float>());
    }
    std::vector<T> bv = bias_values<T>(*bias);
    matmul_t<T>(s, (T)alpha, A, B, C, bv.data());
  });
}

// ---- MatMulGradB -----------------------------------------------------------------------------

void matmul_grad_b_infer(InferContext& ctx) {
  const auto& a = ctx.input(0);
  const auto& dy = ctx.input(1);
  check_float(ctx.node, a.dtype, dy.dtype);
  ONYX_CHECK(a.rank() >= 1 && dy.rank() >= 1, ctx.node.describe(),
             ": MatMulGradB needs rank >= 1, got ", shape_str(a.shape), " and ",
             shape_str(dy.shape));
  int64_t K = a.shape.back(), N = dy.shape.back();
  int64_t ra = K ? a.numel() / K : shape_numel(Shape(a.shape.begin(), a.shape.end() - 1));
  int64_t rd = N ? dy.numel() / N : shape_numel(Shape(dy.shape.begin(), dy.shape.end() - 1));
  ONYX_CHECK(ra == rd, ctx.node.describe(), ": MatMulGradB rows differ: A ", shape_str(a.shape),
             " has ", ra, ", dY ", shape_str(dy.shape), " has ", rd);
  ctx.set_output(0, a.dtype, {K, N});
}

void matmul_grad_b_compute(KernelContext& ctx) {
  const Tensor& a = ctx.input(0);   // (R..., K)
  const Tensor& dy = ctx.input(1);  // (R..., N)
  Tensor& y = ctx.output(0);        // (K, N)
  int64_t K = a.dim(-1), N = dy.dim(-1);
  int64_t R = shape_numel(Shape(a.shape().begin(), a.shape().end() - 1));
  if (y.numel() == 0) return;
  double alpha = ctx.node.attr_float("alpha", 1.f);
  if (ctx.accumulates(0)) {
    // y += A^T dY (a bound gradient, micro-batches accumulating). Not beta = 1: the GEMM would
    // fold y into its K-blocked partial sums, and the sum must be y + (A^T dY) exactly as a
    // separate onyx.AccumulateGrad computed it. The product goes through a scratch matrix.
    ONYX_CHECK(y.dtype() == DType::Float32 && a.dtype() == DType::Float32 &&
                   dy.dtype() == DType::Float32,
               ctx.node.describe(), ": accumulation supports float32 gradients, got ",
               dtype_name(y.dtype()));
    std::vector<float> tmp((size_t)(K * N));
    gemm<float>(true, false, K, N, R, (float)alpha, a.data<float>(), K, dy.data<float>(), N, 0.f,
                tmp.data(), N);
    float* out = y.data<float>();
    parallel_for(K * N, 1 << 15, [&](int64_t b, int64_t e) {
#pragma omp simd
      for (int64_t i = b; i < e; i++) out[i] += tmp[i];
    });
    return;
  }
  dispatch_float2(ctx, a, dy, y, [&](auto* A, auto* D, auto* C) {
    using T = std::remove_cv_t<std::remove_pointer_t<decltype(C)>>;
    gemm<T>(true, false, K, N, R, (T)alpha, A, K, D, N, T(0), C, N);
  });
}

// ---- BiasGrad --------------------------------------------------------------------------------

void bias_grad_infer(InferContext& ctx) {
  const auto& dy = ctx.input(0);
  if (!is_float(dy.dtype)) ONYX_UNSUPPORTED(ctx.node.describe(), ": dtype ", dtype_name(dy.dtype));
  ONYX_CHECK(dy.rank() >= 1, ctx.node.describe(), ": BiasGrad needs rank >= 1, got ",
             shape_str(dy.shape));
  ctx.set_output(0, dy.dtype, {dy.shape.back()});
}

// db[c] = sum over rows r of D[r, c] for c in [c0, c1): one row segment at a time, so the reads
// stream and the accumulators stay in L1.
// With `add`, db[c] += that sum (the sum is formed first, in the same order, then added once).
template <class T>
void column_sums(const T* D, int64_t R, int64_t N, int64_t c0, int64_t c1, T* db,
                 bool add = false) {
  const int64_t w = c1 - c0;
  std::vector<T> scratch(add ? w : 0);
  T* acc = add ? scratch.data() : db + c0;
  std::fill(acc, acc + w, T(0));
  for (int64_t r = 0; r < R; r++) {
    const T* d = D + r * N + c0;
#pragma omp simd
    for (int64_t j = 0; j < w; j++) acc[j] += d[j];
  }
  if (add)
    for (int64_t j = 0; j < w; j++) db[c0 + j] += acc[j];
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
  auto run = [&](auto* D, auto* out) {
    using T = std::remove_cv_t<std::remove_pointer_t<decltype(out)>>;
    // Column blocks of >= 64 (a cache line multiple); each thread owns whole columns.
    parallel_for(N, 64,
                 [&](int64_t c0, int64_t c1) { column_sums<T>(D, R, N, c0, c1, out, add); });
  };
  switch (dy.dtype()) {
    case DType::Float32:
      return run(dy.data<float>(), db.data<float>());
    case DType::Float64:
      return run(dy.data<double>(), db.data<double>());
    case DType::Float16:
    case DType::BFloat16: {
      std::vector<float> d = to_f32(dy), o(N);
      run((const float*)d.data(), o.data());
      return from_f32(o, db);
    }
    default:
      ONYX_UNSUPPORTED(ctx.node.describe(), ": dtype ", dtype_name(dy.dtype()));
  }
}

// ---- Conv gradients --------------------------------------------------------------------------

// Geometry with the spatial dims left-padded to three (size 1, stride 1, no pad) so one loop nest
// serves 1-D, 2-D and 3-D.
struct ConvG {
  int64_t N = 0, C = 0, M = 0, group = 1, Cg = 0, Mg = 0;
  int64_t in[3], k[3], out[3], st[3], dl[3], pb[3];
  int64_t in_sz = 1, k_sz = 1, out_sz = 1;
  bool identity_col = true;  // 1x1 kernel, stride 1, no pad: im2col is the input itself
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

// Valid output range [lo, hi) along one dim for kernel offset kk: 0 <= o*st - pb + kk*dl < in.
inline void valid_range(int64_t in, int64_t out, int64_t st, int64_t pb, int64_t kk, int64_t dl,
                        int64_t& lo, int64_t& hi) {
  int64_t base = kk * dl - pb;  // input coordinate of o = 0
  lo = base >= 0 ? 0 : (-base + st - 1) / st;
  hi = in - base <= 0 ? 0 : (in - base + st - 1) / st;
  lo = std::min(lo, out);
  hi = std::clamp(hi, lo, out);
}

// col (Cg·k_sz, out_sz) from x (Cg, in...): col[(c,kk), o] = x[c, o·st − pb + kk·dl] or 0.
template <class T>
void im2col(const ConvG& g, const T* x, T* col) {
  parallel_for(g.Cg * g.k_sz, std::max<int64_t>(1, 4096 / std::max<int64_t>(1, g.out_sz)),
               [&](int64_t r0, int64_t r1) {
                 for (int64_t r = r0; r < r1; r++) {
                   int64_t c = r / g.k_sz, kk = r % g.k_sz;
                   int64_t k0 = kk / (g.k[1] * g.k[2]), k1 = (kk / g.k[2]) % g.k[1],
                           k2 = kk % g.k[2];
                   const T* xc = x + c * g.in_sz;
                   T* row = col + r * g.out_sz;
                   int64_t lo0, hi0, lo1, hi1, lo2, hi2;
                   valid_range(g.in[0], g.out[0], g.st[0], g.pb[0], k0, g.dl[0], lo0, hi0);
                   valid_range(g.in[1], g.out[1], g.st[1], g.pb[1], k1, g.dl[1], lo1, hi1);
                   valid_range(g.in[2], g.out[2], g.st[2], g.pb[2], k2, g.dl[2], lo2, hi2);
                   for (int64_t o0 = 0; o0 < g.out[0]; o0++) {
                     T* r0p = row + o0 * g.out[1] * g.out[2];
                     if (o0 < lo0 || o0 >= hi0) {
                       std::fill(r0p, r0p + g.out[1] * g.out[2], T(0));
                       continue;
                     }
                     int64_t i0 = o0 * g.st[0] - g.pb[0] + k0 * g.dl[0];
                     for (int64_t o1 = 0; o1 < g.out[1]; o1++) {
                       T* dst = r0p + o1 * g.out[2];
                       if (o1 < lo1 || o1 >= hi1) {
                         std::fill(dst, dst + g.out[2], T(0));
                         continue;
                       }
                       int64_t i1 = o1 * g.st[1] - g.pb[1] + k1 * g.dl[1];
                       const T* src = xc + (i0 * g.in[1] + i1) * g.in[2] + k2 * g.dl[2] - g.pb[2];
                       std::fill(dst, dst + lo2, T(0));
                       if (g.st[2] == 1) {
                         std::memcpy(dst + lo2, src + lo2, (hi2 - lo2) * sizeof(T));
                       } else {
                         const int64_t s2 = g.st[2];
                         for (int64_t o2 = lo2; o2 < hi2; o2++) dst[o2] = src[o2 * s2];
                       }
                       std::fill(dst + hi2, dst + g.out[2], T(0));
                     }
                   }
                 }
               });
}

// dx (Cg, in...) += col2im(dcol (Cg·k_sz, out_sz)); dx must be zeroed first. Threads own
// channels, so no two write the same element.
template <class T>
void col2im_add(const ConvG& g, const T* dcol, T* dx) {
  parallel_for(g.Cg, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; c++) {
      T* xc = dx + c * g.in_sz;
      for (int64_t kk = 0; kk < g.k_sz; kk++) {
        int64_t k0 = kk / (g.k[1] * g.k[2]), k1 = (kk / g.k[2]) % g.k[1], k2 = kk % g.k[2];
        const T* row = dcol + (c * g.k_sz + kk) * g.out_sz;
        int64_t lo0, hi0, lo1, hi1, lo2, hi2;
        valid_range(g.in[0], g.out[0], g.st[0], g.pb[0], k0, g.dl[0], lo0, hi0);
        valid_range(g.in[1], g.out[1], g.st[1], g.pb[1], k1, g.dl[1], lo1, hi1);
        valid_range(g.in[2], g.out[2], g.st[2], g.pb[2], k2, g.dl[2], lo2, hi2);
        for (int64_t o0 = lo0; o0 < hi0; o0++) {
          int64_t i0 = o0 * g.st[0] - g.pb[0] + k0 * g.dl[0];
          for (int64_t o1 = lo1; o1 < hi1; o1++) {
            int64_t i1 = o1 * g.st[1] - g.pb[1] + k1 * g.dl[1];
            T* dst = xc + (i0 * g.in[1] + i1) * g.in[2] + k2 * g.dl[2] - g.pb[2];
            const T* src = row + (o0 * g.out[1] + o1) * g.out[2];
            const int64_t s2 = g.st[2];
            if (s2 == 1) {
#pragma omp simd
              for (int64_t o2 = lo2; o2 < hi2; o2++) dst[o2] += src[o2];
            } else {
              for (int64_t o2 = lo2; o2 < hi2; o2++) dst[o2 * s2] += src[o2];
            }
          }
        }
      }
    }
  });
}

// dX (N, C, in...) from dY (N, M, out...) and W (M, Cg, k...):
// per sample and group, dcol (Cg·k, out) = W_g^T (Cg·k, Mg) · dY_ng (Mg, out), then col2im.
template <class T>
void conv_grad_input(const ConvG& g, const T* dY, const T* W, T* dX) {
  const int64_t ck = g.Cg * g.k_sz;
  auto one_sample = [&](int64_t n, std::vector<T>& dcol) {
    for (int64_t grp = 0; grp < g.group; grp++) {
      const T* w = W + grp * g.Mg * ck;
      const T* dy = dY + (n * g.M + grp * g.Mg) * g.out_sz;
      T* dx = dX + (n * g.C + grp * g.Cg) * g.in_sz;
      if (g.identity_col) {
        gemm<T>(true, false, ck, g.out_sz, g.Mg, T(1), w, ck, dy, g.out_sz, T(0), dx, g.in_sz);
        continue;
      }
      dcol.resize(ck * g.out_sz);
      gemm<T>(true, false, ck, g.out_sz, g.Mg, T(1), w, ck, dy, g.out_sz, T(0), dcol.data(),
              g.out_sz);
      std::fill(dx, dx + g.Cg * g.in_sz, T(0));
      col2im_add<T>(g, dcol.data(), dx);
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
void conv_grad_weight(const ConvG& g, const T* dY, const T* X, T* dW) {
  const int64_t ck = g.Cg * g.k_sz, wsz = g.M * ck;
  auto range = [&](int64_t n0, int64_t n1, T* acc) {
    std::vector<T> col;
    if (!g.identity_col) col.resize(ck * g.out_sz);
    for (int64_t n = n0; n < n1; n++)
      for (int64_t grp = 0; grp < g.group; grp++) {
        const T* x = X + (n * g.C + grp * g.Cg) * g.in_sz;
        const T* dy = dY + (n * g.M + grp * g.Mg) * g.out_sz;
        const T* cp = x;
        if (!g.identity_col) {
          im2col<T>(g, x, col.data());
          cp = col.data();
        }
        gemm<T>(false, true, g.Mg, ck, g.out_sz, T(1), dy, g.out_sz, cp, g.out_sz,
                n == n0 ? T(0) : T(1), acc + grp * g.Mg * ck, ck);
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
  dispatch_float2(ctx, dy, w, dx, [&](auto* D, auto* W, auto* X) {
    using T = std::remove_cv_t<std::remove_pointer_t<decltype(X)>>;
    conv_grad_input<T>(g, D, W, X);
  });
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
    dispatch_float2(ctx, dy, x, tmp, [&](auto* D, auto* X, auto* W) {
      using T = std::remove_cv_t<std::remove_pointer_t<decltype(W)>>;
      conv_grad_weight<T>(g, D, X, W);
    });
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
  dispatch_float2(ctx, dy, x, dw, [&](auto* D, auto* X, auto* W) {
    using T = std::remove_cv_t<std::remove_pointer_t<decltype(W)>>;
    conv_grad_weight<T>(g, D, X, W);
  });
}

}  // namespace

void register_matmul_grad_kernels(KernelRegistry& r) {
  using Metas = std::vector<const TensorMeta*>;
  constexpr auto low = OpTraits::Precision::LowPrecision;
  OpTraits& mmt = r.add("onyx", "MatMulT", OpKernel{matmul_t_infer, matmul_t_compute, {}});
  mmt.precision = low;
  mmt.flops = gemm_like_flops;
  // MatMulGradB and BiasGrad can add into a bound weight / bias gradient (gradient_into_buffer.cc).
  OpTraits& gb = r.add("onyx", "MatMulGradB", OpKernel{matmul_grad_b_infer, matmul_grad_b_compute, {}, {}, {0}});
  gb.precision = low;
  gb.flops = [](const ir::Node&, const Metas& in, const Metas& out) {
    // (K,N) = A(R,K)^T dY(R,N): 2·R·K·N
    return in[0] && out[0] && !in[0]->shape.empty() && !out[0]->shape.empty()
               ? 2 * shape_product(in[0]->shape) * (double)out[0]->shape.back()
               : 0.0;
  };
  r.add("onyx", "BiasGrad", OpKernel{bias_grad_infer, bias_grad_compute, {}, {}, {0}});
  OpTraits& gi = r.add("onyx", "ConvGradInput", OpKernel{conv_grad_input_infer, conv_grad_input_compute, {}});
  gi.precision = low;
  gi.flops = [](const ir::Node&, const Metas& in, const Metas&) {
    // dY (N,M,out...) against W (M,C/g,k...)
    return in[0] && in.size() > 1 && in[1] && in[1]->shape.size() >= 2
               ? 2 * shape_product(in[0]->shape) * shape_product(in[1]->shape, 1)
               : 0.0;
  };
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

}  // namespace onyx::runtime
