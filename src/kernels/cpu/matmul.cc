// matmul.cc — MatMul (numpy matmul semantics) and Gemm; registers Einsum (einsum.cc) too.
//
// float32 goes to kernels/cpu/gemm.h (oneDNN / OpenBLAS); float16 and bfloat16 are converted to
// float32 around the same path. float64 and the integer types use a plain cache-friendly loop
// (exact in their own type; they are rare and never the hot path).
// Hand-written dispatch because the transformer hot path needs care: a batched activation times a
// shared 2-D weight, (B,T,K) x (K,N), must be ONE (B·T x K) x (K x N) GEMM, not B small ones.
#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/cpu/einsum.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/nn_util.h"
#include "runtime/kernel.h"
#include "runtime/parallel.h"

namespace onyx::runtime {
namespace {

using nnutil::from_f32;
using nnutil::to_f32;

// ---- MatMul shapes ---------------------------------------------------------------------------

// A (...,M,K) · B (...,K,N) with numpy's 1-D promotions: a 1-D A is a (1,K) row that is dropped
// from the result, a 1-D B a (K,1) column likewise. Batch dims broadcast.
struct MatMulShape {
  int64_t M = 1, N = 1, K = 1;
  Shape batch;             // broadcast batch shape
  Shape a_batch, b_batch;  // each operand's batch dims, left-padded with 1s to batch's rank
  Shape out;
};

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

// For each output batch index, the matrix index into A and into B (broadcast dims repeat).
void batch_offsets(const MatMulShape& s, std::vector<int64_t>& ai, std::vector<int64_t>& bi) {
  kernels::broadcast_batch_offsets(s.batch, s.a_batch, s.b_batch, ai, bi);
}

// ---- MatMul compute --------------------------------------------------------------------------

void matmul_f32(const MatMulShape& s, const float* A, const float* B, float* C) {
  const int64_t M = s.M, N = s.N, K = s.K;
  const int64_t na = shape_numel(s.a_batch), nbm = shape_numel(s.b_batch);
  const int64_t nb = shape_numel(s.batch);
  if (nbm == 1) {
    // (na·M, K) x (K, N): a shared weight (or no batch at all) — one GEMM over every row.
    kernels::sgemm(false, false, na * M, N, K, 1.f, A, K, B, N, 0.f, C, N);
  } else if (na == 1) {
    kernels::sgemm_strided_batched(false, false, M, N, K, 1.f, A, K, 0, B, N, K * N, 0.f, C, N,
                                   M * N, nb);
  } else if (s.a_batch == s.b_batch) {
    kernels::sgemm_strided_batched(false, false, M, N, K, 1.f, A, K, M * K, B, N, K * N, 0.f, C, N,
                                   M * N, nb);
  } else {  // both broadcast in different dims: one GEMM per output matrix
    std::vector<int64_t> ai, bi;
    batch_offsets(s, ai, bi);
    for (int64_t i = 0; i < nb; i++)
      kernels::sgemm(false, false, M, N, K, 1.f, A + ai[i] * M * K, K, B + bi[i] * K * N, N, 0.f,
                     C + i * M * N, N);
  }
}

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

void check_same_dtype(const ir::Node& node, DType a, DType b) {
  ONYX_CHECK(a == b, node.describe(), ": inputs have different dtypes ", dtype_name(a), " and ",
             dtype_name(b));
}

void matmul_infer(InferContext& ctx) {
  const auto& a = ctx.input(0);
  const auto& b = ctx.input(1);
  check_same_dtype(ctx.node, a.dtype, b.dtype);
  ctx.set_output(0, a.dtype, matmul_shape(a.shape, b.shape, ctx.node).out);
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
  if (dt == DType::Float32) return matmul_f32(s, a.data<float>(), b.data<float>(), y.data<float>());
  if (dt == DType::Float16 || dt == DType::BFloat16) {
    auto af = to_f32(a), bf = to_f32(b);
    std::vector<float> yf(y.numel());
    matmul_f32(s, af.data(), bf.data(), yf.data());
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

}  // namespace

// 2·M·N·K for Gemm and onyx.MatMulT (transA picks which axis of A is K).
double gemm_like_flops(const ir::Node& n, const std::vector<const TensorMeta*>& in,
                       const std::vector<const TensorMeta*>& out) {
  if (!in[0] || !out[0] || in[0]->shape.size() < 2) return 0;
  const Shape& as = in[0]->shape;
  bool ta = n.attr_int("transA", 0) != 0;
  return 2 * shape_product(out[0]->shape) * (double)(ta ? as[as.size() - 2] : as.back());
}

void register_matmul_kernels(KernelRegistry& r) {
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
  register_einsum_kernels(r);
}

}  // namespace onyx::runtime
