// kernels/matmul/matmul.cu — the CUDA kernels of the matmul family: MatMul, Gemm, onyx.MatMulT,
// onyx.MatMulGradB (through cuBLASLt) and onyx.BiasGrad (a column-sum kernel); semantics as in
// matmul.cc's header.
//
// cuBLASLt is column-major: a row-major X (r, c) is a column-major (c, r) matrix with ld = c, so
// row-major Y(M,N) = op(A)·op(B) runs as column-major Yᵀ(N,M) = op(B)ᵀ·op(A)ᵀ — B's memory is
// cuBLASLt's first operand, A's the second, and neither is ever copied or transposed. Types:
// float32 operands compute in float32 (CUBLAS_COMPUTE_32F: no TF32, the exact path CPU parity
// needs); bfloat16 and float16 operands compute with float32 accumulation; a float32 operand
// beside a bf16 one, or both under KernelContext::bf16_gemm (Transformers' bf16), is rounded to
// bf16 first as the CPU kernels round it. A batch is one strided-batched call when each operand's
// batch is either the full batch or a single matrix (stride 0), else one call per matrix. The
// bias of MatMulT rides cuBLASLt's bias epilogue.
#include <vector>

#include "kernels/cuda/cublaslt.h"
#include "kernels/cuda/cuda_util.cuh"

namespace onyx::kernels {
namespace {

using cuda::from_f;
using cuda::to_f;
using runtime::KernelContext;
using runtime::OpKernel;

cudaDataType_t cuda_type(DType dt, const ir::Node& node) {
  switch (dt) {
    case DType::Float32:
      return CUDA_R_32F;
    case DType::BFloat16:
      return CUDA_R_16BF;
    case DType::Float16:
      return CUDA_R_16F;
    default:
      ONYX_UNSUPPORTED(node.describe(), ": dtype ", dtype_name(dt), " on cuda");
  }
}

void lt_check(cublasStatus_t st, const char* what, const ir::Node& node) {
  if (st != CUBLAS_STATUS_SUCCESS)
    throw Error(cat(node.describe(), ": ", what, " failed: ", cuda::lt_api().GetStatusString(st)));
}

// Row-major Y(M,N) = alpha · op(A)(M,K) · op(B)(K,N) + beta · Y, `batch` times with element
// strides (0: the same matrix for every batch entry). bias: N values of Y's type, added to every
// row (nullptr: none).
struct GemmCall {
  int64_t M = 0, N = 0, K = 0;
  bool ta = false, tb = false;
  int64_t batch = 1, stride_a = 0, stride_b = 0, stride_y = 0;
  cudaDataType_t ab_type = CUDA_R_32F, y_type = CUDA_R_32F;
  float alpha = 1.f, beta = 0.f;
  const void* bias = nullptr;
  cudaDataType_t bias_type = CUDA_R_32F;
};

template <class TY, class TB>
__global__ void add_bias_rows(TY* y, const TB* bias, int64_t rows, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < rows * n;
       i += (int64_t)gridDim.x * blockDim.x)
    y[i] = from_f<TY>(to_f(y[i]) + to_f(bias[i % n]));
}

// Returns false (nothing run) when cuBLASLt offers no algorithm for the call's epilogue.
bool try_gemm(const GemmCall& g, const void* A, const void* B, void* Y, const ir::Node& node) {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ly = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  struct Cleanup {
    cublasLtMatmulDesc_t& d;
    cublasLtMatrixLayout_t &a, &b, &y;
    cublasLtMatmulPreference_t& p;
    ~Cleanup() {
      if (p) cuda::lt_api().MatmulPreferenceDestroy(p);
      if (y) cuda::lt_api().MatrixLayoutDestroy(y);
      if (b) cuda::lt_api().MatrixLayoutDestroy(b);
      if (a) cuda::lt_api().MatrixLayoutDestroy(a);
      if (d) cuda::lt_api().MatmulDescDestroy(d);
    }
  } cleanup{desc, la, lb, ly, pref};
  lt_check(cuda::lt_api().MatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
           "MatmulDescCreate", node);
  // cuBLASLt's operand a is B's memory, b is A's (see the header).
  cublasOperation_t opa = g.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t opb = g.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  lt_check(
      cuda::lt_api().MatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa),
      "set TRANSA", node);
  lt_check(
      cuda::lt_api().MatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb),
      "set TRANSB", node);
  if (g.bias) {
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    lt_check(cuda::lt_api().MatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi,
                                                   sizeof epi),
             "set EPILOGUE", node);
    lt_check(cuda::lt_api().MatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias,
                                                   sizeof g.bias),
             "set BIAS_POINTER", node);
    lt_check(cuda::lt_api().MatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                   &g.bias_type, sizeof g.bias_type),
             "set BIAS_DATA_TYPE", node);
  }
  // Stored (before op) column-major shapes: B is (N,K) with ld N, or (K,N) with ld K when
  // transposed; A is (K,M) with ld K, or (M,K) with ld M; Y is (N,M) with ld N.
  const uint64_t a_rows = g.tb ? g.K : g.N, a_cols = g.tb ? g.N : g.K;
  const uint64_t b_rows = g.ta ? g.M : g.K, b_cols = g.ta ? g.K : g.M;
  lt_check(cuda::lt_api().MatrixLayoutCreate(&la, g.ab_type, a_rows, a_cols, a_rows), "layout B",
           node);
  lt_check(cuda::lt_api().MatrixLayoutCreate(&lb, g.ab_type, b_rows, b_cols, b_rows), "layout A",
           node);
  lt_check(cuda::lt_api().MatrixLayoutCreate(&ly, g.y_type, g.N, g.M, g.N), "layout Y", node);
  if (g.batch > 1) {
    int32_t count = (int32_t)g.batch;
    auto set_batch = [&](cublasLtMatrixLayout_t l, int64_t stride) {
      lt_check(cuda::lt_api().MatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                       &count, sizeof count),
               "set BATCH_COUNT", node);
      lt_check(cuda::lt_api().MatrixLayoutSetAttribute(
                   l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride),
               "set STRIDED_BATCH_OFFSET", node);
    };
    set_batch(la, g.stride_b);
    set_batch(lb, g.stride_a);
    set_batch(ly, g.stride_y);
  }
  size_t ws = cuda::gemm_workspace_bytes();
  lt_check(cuda::lt_api().MatmulPreferenceCreate(&pref), "PreferenceCreate", node);
  lt_check(cuda::lt_api().MatmulPreferenceSetAttribute(
               pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws),
           "set MAX_WORKSPACE_BYTES", node);
  cublasLtMatmulHeuristicResult_t heur{};
  int found = 0;
  cublasStatus_t st = cuda::lt_api().MatmulAlgoGetHeuristic(cuda::lt(), desc, la, lb, ly, ly, pref,
                                                            1, &heur, &found);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
    if (g.bias) return false;
    throw Error(cat(node.describe(), ": cuBLASLt has no algorithm for (", g.M, " x ", g.K, ") · (",
                    g.K, " x ", g.N, ") batch ", g.batch, ": ",
                    cuda::lt_api().GetStatusString(st)));
  }
  lt_check(cuda::lt_api().Matmul(cuda::lt(), desc, &g.alpha, B, la, A, lb, &g.beta, Y, ly, Y, ly,
                                 &heur.algo, cuda::gemm_workspace(), ws, cuda::stream()),
           "cublasLtMatmul", node);
  return true;
}

// Y's rows += the call's bias (its own pass).
void add_bias(const GemmCall& g, void* Y, const ir::Node& node) {
  const int64_t rows = g.M * g.batch;
  const unsigned blocks = cuda::blocks_for(rows * g.N, 256);
  auto typed = [&](cudaDataType_t t, auto&& f) {
    if (t == CUDA_R_32F) return f(cuda::TypeTag<float>{});
    if (t == CUDA_R_16BF) return f(cuda::TypeTag<__nv_bfloat16>{});
    return f(cuda::TypeTag<__half>{});
  };
  typed(g.y_type, [&](auto ty) {
    typed(g.bias_type, [&](auto tb) {
      using TY = typename decltype(ty)::type;
      using TB = typename decltype(tb)::type;
      add_bias_rows<TY, TB>
          <<<blocks, 256, 0, cuda::stream()>>>((TY*)Y, (const TB*)g.bias, rows, g.N);
    });
  });
  cuda::check_launch(node);
}

void run_gemm(const GemmCall& g, const void* A, const void* B, void* Y, const ir::Node& node) {
  if (g.M == 0 || g.N == 0) return;
  if (try_gemm(g, A, B, Y, node)) return;
  // No bias epilogue for this shape / type: the product, then the bias in its own pass.
  GemmCall plain = g;
  plain.bias = nullptr;
  try_gemm(plain, A, B, Y, node);
  add_bias(g, Y, node);
}

__global__ void f32_to_bf16(const float* x, __nv_bfloat16* y, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    y[i] = __float2bfloat16_rn(x[i]);
}

// t as bfloat16 on the device: itself when it is, else rounded (round to nearest even) into a
// temporary kept alive by `keep`.
const void* as_bf16(const Tensor& t, std::vector<Tensor>& keep, const ir::Node& node) {
  if (t.dtype() == DType::BFloat16) return t.raw();
  ONYX_CHECK(t.dtype() == DType::Float32, node.describe(), ": a ", dtype_name(t.dtype()),
             " operand beside a bfloat16 one on cuda");
  keep.push_back(cuda::empty(DType::BFloat16, t.shape()));
  if (t.numel()) {
    f32_to_bf16<<<cuda::blocks_for(t.numel(), 256), 256, 0, cuda::stream()>>>(
        t.data<float>(), keep.back().data<__nv_bfloat16>(), t.numel());
    cuda::check_launch(node);
  }
  return keep.back().raw();
}

// The operands' element type for cuBLASLt, rounding a float32 operand to bf16 where the pair is
// mixed or the run asks for bf16 GEMMs.
struct Operands {
  const void* a;
  const void* b;
  cudaDataType_t type;
  std::vector<Tensor> keep;
};
Operands operands(const KernelContext& c, const Tensor& a, const Tensor& b, bool output_f32) {
  Operands o;
  const bool mixed = a.dtype() != b.dtype() || (output_f32 && a.dtype() != DType::Float32) ||
                     (c.bf16_gemm && a.dtype() == DType::Float32);
  if (mixed) {
    o.a = as_bf16(a, o.keep, c.node);
    o.b = as_bf16(b, o.keep, c.node);
    o.type = CUDA_R_16BF;
  } else {
    o.a = a.raw();
    o.b = b.raw();
    o.type = cuda_type(a.dtype(), c.node);
  }
  return o;
}

// Batch layout of a product whose operands have batch dims a_batch, b_batch (left-padded to the
// output's batch rank): a single strided call, or one call per batch entry.
struct BatchPlan {
  int64_t count = 1;
  bool strided = true;  // else: per entry, offsets from offsets_a / offsets_b
  int64_t stride_a = 0, stride_b = 0;
  std::vector<int64_t> offsets_a, offsets_b;  // in matrices
};

BatchPlan plan_batch(const Shape& batch, const Shape& a_batch, const Shape& b_batch) {
  BatchPlan p;
  p.count = shape_numel(batch);
  const int64_t na = shape_numel(a_batch), nb = shape_numel(b_batch);
  if ((na == p.count || na == 1) && (nb == p.count || nb == 1) && (na == 1 || a_batch == batch) &&
      (nb == 1 || b_batch == batch)) {
    p.stride_a = na == 1 ? 0 : 1;
    p.stride_b = nb == 1 ? 0 : 1;
    return p;
  }
  p.strided = false;
  const int r = (int)batch.size();
  for (int64_t i = 0; i < p.count; i++) {
    int64_t rem = i, oa = 0, ob = 0, sa = 1, sb = 1;
    for (int d = r - 1; d >= 0; d--) {
      int64_t idx = rem % batch[d];
      rem /= batch[d];
      oa += (a_batch[d] == 1 ? 0 : idx) * sa;
      ob += (b_batch[d] == 1 ? 0 : idx) * sb;
      sa *= a_batch[d];
      sb *= b_batch[d];
    }
    p.offsets_a.push_back(oa);
    p.offsets_b.push_back(ob);
  }
  return p;
}

// Y(batch..., M, N) = alpha · op(A) · op(B) (+ bias) for operands of any rank >= 2 (1-D operands
// are promoted by the caller's shapes).
void batched_product(const KernelContext& c, const Tensor& a, Shape a_shape, const Tensor& b,
                     Shape b_shape, bool ta, bool tb, float alpha, const Tensor* bias, Tensor& y) {
  const int64_t ar = a_shape[a_shape.size() - 2], ac = a_shape.back();
  const int64_t br = b_shape[b_shape.size() - 2], bc = b_shape.back();
  GemmCall g;
  g.M = ta ? ac : ar;
  g.K = ta ? ar : ac;
  g.N = tb ? br : bc;
  g.ta = ta;
  g.tb = tb;
  g.alpha = alpha;
  g.y_type = cuda_type(y.dtype(), c.node);
  Shape ab(a_shape.begin(), a_shape.end() - 2), bb(b_shape.begin(), b_shape.end() - 2);
  Shape batch = runtime::broadcast_shapes(ab, bb);
  ab.insert(ab.begin(), batch.size() - ab.size(), 1);
  bb.insert(bb.begin(), batch.size() - bb.size(), 1);
  Operands o = operands(c, a, b, y.dtype() == DType::Float32);
  g.ab_type = o.type;
  const size_t esize = o.type == CUDA_R_32F ? 4 : 2, ysize = dtype_size(y.dtype());
  g.bias = bias ? bias->raw() : nullptr;
  if (bias) g.bias_type = cuda_type(bias->dtype(), c.node);
  if (y.numel() == 0) return;
  if (g.K == 0) {  // an empty sum: zeros (plus the bias)
    ONYX_CUDA_CHECK(cudaMemsetAsync(y.raw(), 0, y.nbytes(), cuda::stream()));
    if (bias) {
      g.M = y.numel() / g.N;
      add_bias(g, y.raw(), c.node);
    }
    return;
  }
  // A shared 2-D B and an untransposed A: the batch folds into M, one GEMM.
  if (shape_numel(bb) == 1 && !ta) {
    g.M *= shape_numel(batch);
    return run_gemm(g, o.a, o.b, y.raw(), c.node);
  }
  BatchPlan p = plan_batch(batch, ab, bb);
  const int64_t mat_a = g.M * g.K, mat_b = g.K * g.N, mat_y = g.M * g.N;
  if (p.strided) {
    g.batch = p.count;
    g.stride_a = p.stride_a * mat_a;
    g.stride_b = p.stride_b * mat_b;
    g.stride_y = mat_y;
    return run_gemm(g, o.a, o.b, y.raw(), c.node);
  }
  for (int64_t i = 0; i < p.count; i++)
    run_gemm(g, (const char*)o.a + p.offsets_a[i] * mat_a * esize,
             (const char*)o.b + p.offsets_b[i] * mat_b * esize, (char*)y.raw() + i * mat_y * ysize,
             c.node);
}

OpKernel matmul_kernel() {
  OpKernel k;
  k.compute = [](KernelContext& c) {
    cuda::require_device_tensors(c);
    const Tensor& a = c.input(0);
    const Tensor& b = c.input(1);
    Shape as = a.shape(), bs = b.shape();
    if (as.size() == 1) as.insert(as.begin(), 1);  // numpy: a (K) row
    if (bs.size() == 1) bs.push_back(1);           // a (K) column
    batched_product(c, a, as, b, bs, false, false, 1.f, nullptr, c.output(0));
  };
  return k;
}

OpKernel matmul_t_kernel() {
  OpKernel k;
  k.compute = [](KernelContext& c) {
    cuda::require_device_tensors(c);
    const Tensor* bias = c.has_input(2) ? &c.input(2) : nullptr;
    batched_product(c, c.input(0), c.input(0).shape(), c.input(1), c.input(1).shape(),
                    c.node.attr_int("transA", 0) != 0, c.node.attr_int("transB", 0) != 0,
                    c.node.attr_float("alpha", 1.f), bias, c.output(0));
  };
  return k;
}

// Gemm's C broadcast into Y (beta scales it inside the GEMM).
template <class T>
__global__ void broadcast_c(const T* cvals, int64_t cr, int64_t cc, T* y, int64_t M, int64_t N) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < M * N;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t r = i / N, col = i - r * N;
    y[i] = cvals[(cr == 1 ? 0 : r) * cc + (cc == 1 ? 0 : col)];
  }
}

OpKernel gemm_kernel() {
  OpKernel k;
  k.compute = [](KernelContext& c) {
    cuda::require_device_tensors(c);
    const Tensor& a = c.input(0);
    const Tensor& b = c.input(1);
    Tensor& y = c.output(0);
    const bool ta = c.node.attr_int("transA", 0) != 0, tb = c.node.attr_int("transB", 0) != 0;
    GemmCall g;
    g.M = ta ? a.dim(1) : a.dim(0);
    g.K = ta ? a.dim(0) : a.dim(1);
    g.N = tb ? b.dim(0) : b.dim(1);
    g.ta = ta;
    g.tb = tb;
    g.alpha = c.node.attr_float("alpha", 1.f);
    g.y_type = cuda_type(y.dtype(), c.node);
    if (y.numel() == 0) return;
    const float beta = c.node.attr_float("beta", 1.f);
    if (c.has_input(2) && beta != 0.f) {
      const Tensor& cv = c.input(2);
      int64_t cr = cv.rank() == 2 ? cv.dim(0) : 1, cc = cv.rank() >= 1 ? cv.dim(-1) : 1;
      cuda::dispatch_float(y.dtype(), c.node, [&](auto tag) {
        using T = typename decltype(tag)::type;
        broadcast_c<T><<<cuda::blocks_for(g.M * g.N, 256), 256, 0, cuda::stream()>>>(
            cv.data<T>(), cr, cc, y.data<T>(), g.M, g.N);
      });
      cuda::check_launch(c.node);
      g.beta = beta;
    } else if (g.K == 0) {
      ONYX_CUDA_CHECK(cudaMemsetAsync(y.raw(), 0, y.nbytes(), cuda::stream()));
    }
    Operands o = operands(c, a, b, false);
    g.ab_type = o.type;
    run_gemm(g, o.a, o.b, y.raw(), c.node);
  };
  return k;
}

__global__ void add_into(float* y, const float* x, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    y[i] += x[i];
}

// (K,N) = alpha · A(R,K)ᵀ · dY(R,N); accumulating, y += that product formed alone (as a separate
// onyx.AccumulateGrad would add it).
OpKernel matmul_grad_b_kernel() {
  OpKernel k;
  k.compute = [](KernelContext& c) {
    cuda::require_device_tensors(c);
    const Tensor& a = c.input(0);
    const Tensor& dy = c.input(1);
    Tensor& y = c.output(0);
    if (y.numel() == 0) return;
    GemmCall g;
    g.M = a.dim(-1);
    g.N = dy.dim(-1);
    g.K = g.M ? a.numel() / g.M : 0;
    g.ta = true;
    g.alpha = c.node.attr_float("alpha", 1.f);
    g.y_type = cuda_type(y.dtype(), c.node);
    Operands o = operands(c, a, dy, y.dtype() == DType::Float32);
    g.ab_type = o.type;
    if (!c.accumulates(0)) {
      if (g.K == 0) ONYX_CUDA_CHECK(cudaMemsetAsync(y.raw(), 0, y.nbytes(), cuda::stream()));
      return run_gemm(g, o.a, o.b, y.raw(), c.node);
    }
    ONYX_CHECK(y.dtype() == DType::Float32, c.node.describe(),
               ": accumulation supports float32 gradients, got ", dtype_name(y.dtype()));
    Tensor tmp = cuda::zeros(DType::Float32, y.shape());
    run_gemm(g, o.a, o.b, tmp.raw(), c.node);
    add_into<<<cuda::blocks_for(y.numel(), 256), 256, 0, cuda::stream()>>>(
        y.data<float>(), tmp.data<float>(), y.numel());
    cuda::check_launch(c.node);
  };
  return k;
}

// db[col] (+)= Σ_r dY[r, col]: a block of 32 columns × 8 row groups, each thread summing its rows
// in order, then the 8 partial sums in order (a fixed order: the same bits on every run).
// copy[r, col] = bf16(dY[r, col]) from the same reads when asked.
template <class T>
__global__ void column_sums(const T* dy, int64_t R, int64_t N, T* db, bool add,
                            __nv_bfloat16* copy) {
  __shared__ float part[8][33];
  const int64_t col = blockIdx.x * 32 + threadIdx.x;
  float acc = 0.f;
  if (col < N) {
    for (int64_t r = threadIdx.y; r < R; r += 8) {
      float v = to_f(dy[r * N + col]);
      acc += v;
      if (copy) copy[r * N + col] = __float2bfloat16_rn(v);
    }
  }
  part[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && col < N) {
    float s = 0.f;
    for (int j = 0; j < 8; j++) s += part[j][threadIdx.x];
    db[col] = from_f<T>(add ? to_f(db[col]) + s : s);
  }
}

OpKernel bias_grad_kernel() {
  OpKernel k;
  k.compute = [](KernelContext& c) {
    cuda::require_device_tensors(c);
    const Tensor& dy = c.input(0);
    Tensor& db = c.output(0);
    const int64_t N = dy.dim(-1);
    if (N == 0) return;
    const int64_t R = dy.numel() / N;
    __nv_bfloat16* copy = c.has_output(1) ? c.output(1).data<__nv_bfloat16>() : nullptr;
    const bool add = c.accumulates(0);
    cuda::dispatch_float(dy.dtype(), c.node, [&](auto tag) {
      using T = typename decltype(tag)::type;
      column_sums<T><<<(unsigned)((N + 31) / 32), dim3(32, 8), 0, cuda::stream()>>>(
          dy.data<T>(), R, N, db.data<T>(), add, copy);
    });
    cuda::check_launch(c.node);
  };
  return k;
}

}  // namespace

ONYX_REGISTER_KERNELS(matmul, Cuda) {
  r.add("", "MatMul", matmul_kernel());
  r.add("", "Gemm", gemm_kernel());
  r.add("onyx", "MatMulT", matmul_t_kernel());
  r.add("onyx", "MatMulGradB", matmul_grad_b_kernel());
  r.add("onyx", "BiasGrad", bias_grad_kernel());
}

}  // namespace onyx::kernels
