// kernels/cpu/gemm.h — the one single-precision GEMM entry point every CPU kernel calls (MatMul,
// Gemm, Conv via im2col, autodiff's weight gradients, fused attention), and gemm<T>, which runs it
// for float and an exact loop (dgemm) for the kernels that take float64 through the same code
// (onyx.MatMulT / MatMulGradB, Conv's gradients, ConvTranspose).
//
// Row-major throughout: C(M,N) = alpha * op(A)(M,K) * op(B)(K,N) + beta * C, where op(X) is X or
// X^T. A is stored (M,K) with row stride lda, or (K,M) when transA; B is (K,N), or (N,K) when
// transB. beta == 0 overwrites C without reading it (NaNs in C do not propagate).
//
// Backends (chosen once from the environment variable ONYX_GEMM, or by set_gemm_backend):
//   onednn   — oneDNN's row-major dnnl_sgemm for single GEMMs and a cached oneDNN matmul
//              primitive for batches (the default: fastest measured here, see bench_kernels.cc);
//   onednn_matmul — cached oneDNN matmul primitives for single GEMMs too (for comparison);
//   openblas — cblas_sgemm; its pthread pool is kept at the OpenMP thread count.
// Both run on the cores of the one OpenMP pool (runtime/parallel.h); called from inside a parallel
// region they run single-threaded.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

namespace onyx::kernels {

enum class GemmBackend { OneDNN, OneDNNMatmul, OpenBLAS };

GemmBackend gemm_backend();  // ONYX_GEMM=onednn|onednn_matmul|openblas at first use; default OneDNN
void set_gemm_backend(GemmBackend b);  // OpenBLAS in a build without it: throws, unchanged
// The backends this build has (OpenBLAS is left out of a minimal build, -DONYX_MINIMAL=ON).
std::vector<GemmBackend> available_gemm_backends();
const char* gemm_backend_name(GemmBackend b);

// C(M,N) = alpha * op(A) * op(B) + beta * C.
void sgemm(bool transA, bool transB, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
           int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

// `batch` independent GEMMs: matrix i of A starts at A + i*strideA (likewise B, C). A stride of 0
// for A or B broadcasts one matrix over the batch (e.g. attention's shared weights).
void sgemm_strided_batched(bool transA, bool transB, int64_t M, int64_t N, int64_t K, float alpha,
                           const float* A, int64_t lda, int64_t strideA, const float* B,
                           int64_t ldb, int64_t strideB, float beta, float* C, int64_t ldc,
                           int64_t strideC, int64_t batch);

// C(M,N) = alpha * op(A) * op(B) + beta * C in double: an exact loop (rows of C in parallel, each
// summed over k in order into a row accumulator); M, N, K > 0.
void dgemm(bool transA, bool transB, int64_t M, int64_t N, int64_t K, double alpha, const double* A,
           int64_t lda, const double* B, int64_t ldb, double beta, double* C, int64_t ldc);

// sgemm for float, dgemm for double. M or N <= 0 does nothing; K <= 0 (an empty sum) sets
// C = beta * C, 0 when beta is 0; leading dimensions below 1 (empty operands) are raised to 1.
template <class T>
void gemm(bool transA, bool transB, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
          int64_t lda, const T* B, int64_t ldb, T beta, T* C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {
    for (int64_t i = 0; i < M; i++)
      for (int64_t j = 0; j < N; j++) C[i * ldc + j] = beta == T(0) ? T(0) : beta * C[i * ldc + j];
    return;
  }
  if constexpr (std::is_same_v<T, float>)
    sgemm(transA, transB, M, N, K, alpha, A, std::max<int64_t>(1, lda), B,
          std::max<int64_t>(1, ldb), beta, C, std::max<int64_t>(1, ldc));
  else
    dgemm(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

// C(M,N) (float32) = alpha * op(A) * op(B) + beta * C with A and B bfloat16 (raw bits): oneDNN's
// bf16 matmul with float32 accumulation (brg:avx512_core_bf16 on CPUs with AVX512_BF16, about
// twice sgemm's rate here: PERF.md), cached per shape like the float32 primitives. Where oneDNN
// has only its reference implementation, or bf16_gemm_native() is false (no AVX512_BF16, or
// ONYX_CPU chose a path without it), the operands are widened to float32 for sgemm instead (the
// same products: a bf16 times a bf16 is exact in float32).
void gemm_bf16(bool transA, bool transB, int64_t M, int64_t N, int64_t K, float alpha,
               const uint16_t* A, int64_t lda, const uint16_t* B, int64_t ldb, float beta, float* C,
               int64_t ldc);

// C(M,N) = alpha * A · op(B) + beta * C with A float32 (M,K) row-major (row stride lda) and B
// bfloat16: A is rounded to bf16 into a per-thread scratch and the product is gemm_bf16's (the
// mixed-precision policy of PyTorch's CPU autocast for matmuls: bf16 inputs, float32
// accumulation and output).
void gemm_f32_bf16(bool transB, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                   int64_t lda, const uint16_t* B, int64_t ldb, float beta, float* C, int64_t ldc);

// C(M,N) = alpha * op(A) · op(B) + beta * C with A and B float32, both rounded to bf16 first (per-
// thread scratch) and multiplied as gemm_bf16: mixed-precision training's GEMMs
// (TrainingArguments.bf16).
void gemm_as_bf16(bool transA, bool transB, int64_t M, int64_t N, int64_t K, float alpha,
                  const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
                  int64_t ldc);

// The low-precision format a mixed-precision GEMM rounds its float32 operands to
// (KernelContext::bf16_gemm / fp16_gemm): none, bf16, or float16 (TrainingArguments.fp16; these
// CPUs have no float16 arithmetic, so always emulated: the rounded values, exact in float32,
// multiplied by sgemm — a float16 times a float16 is exact in float32 too).
enum class LowPrecision { None, Bf16, Fp16 };
// A kernel context's format (runtime::KernelContext; a template so this header needs no runtime).
template <class Context>
LowPrecision low_precision(const Context& ctx) {
  return ctx.bf16_gemm   ? LowPrecision::Bf16
         : ctx.fp16_gemm ? LowPrecision::Fp16
                         : LowPrecision::None;
}
// y = x rounded to float16 (nearest even; beyond float16's range inf, below it float16's
// subnormals), held in float32 (exact). y may be x.
void round_to_fp16(const float* x, float* y, int64_t n);
// round_to_bf16 or round_to_fp16 by `lp` (None: a copy, or nothing when y == x).
void round_to(LowPrecision lp, const float* x, float* y, int64_t n);

// C = alpha * op(A) · op(B) + beta * C with A and B float32 rounded to float16 first (per-thread
// scratch) and multiplied by sgemm.
void gemm_as_fp16(bool transA, bool transB, int64_t M, int64_t N, int64_t K, float alpha,
                  const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
                  int64_t ldc);

// gemm<T>, or for float32 under mixed precision gemm_as_bf16 / gemm_as_fp16 (the convolutions'
// GEMMs).
template <class T>
void gemm_maybe_low(LowPrecision lp, bool transA, bool transB, int64_t M, int64_t N, int64_t K,
                    T alpha, const T* A, int64_t lda, const T* B, int64_t ldb, T beta, T* C,
                    int64_t ldc) {
  if constexpr (std::is_same_v<T, float>) {
    if (lp == LowPrecision::Bf16)
      return gemm_as_bf16(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    if (lp == LowPrecision::Fp16)
      return gemm_as_fp16(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }
  gemm<T>(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

// One operand of a mixed-precision GEMM: float32 (rounded to bf16 into a per-thread scratch for
// the call, as gemm_as_bf16) or bfloat16 bits (used as they are: a value the mixed-precision pass,
// passes/mixed_precision.cc, already stores in bf16). Exactly one pointer is set.
struct Bf16Operand {
  const float* f32 = nullptr;
  const uint16_t* bf16 = nullptr;
};
// C(M,N) (float32) = alpha * op(A) · op(B) + beta * C with each operand float32 or bf16: the bf16
// ones read in place, the float32 ones rounded first, then gemm_bf16. gemm_f32_bf16 and
// gemm_as_bf16 are its two common forms.
void gemm_mixed_bf16(bool transA, bool transB, int64_t M, int64_t N, int64_t K, float alpha,
                     Bf16Operand A, int64_t lda, Bf16Operand B, int64_t ldb, float beta, float* C,
                     int64_t ldc);

// Rows [0, R) of C = `row` (row_bytes each), rows in parallel: a GEMM's bias written first, for
// the GEMM to accumulate onto it (beta = 1) — no pass of its own over C for the bias.
void fill_rows(void* C, int64_t R, size_t row_bytes, const void* row);

// Y(M,N) = alpha · A(M,K) · op(B) (+ bias, every row, when given; float32 throughout), A
// row-major with row stride lda, Y contiguous: a linear layer's forward. Where B is a weight
// declared stable and oneDNN's float32 matmul reads it in a blocked layout (its brgemm kernels:
// AVX-512), one primitive on the prepacked weight (adding the bias in its epilogue, while the tile
// is in cache); elsewhere (AVX2's plain layout, a B that is not a weight) sgemm, accumulating onto
// the bias rows written first. Measured on an AVX-512 Xeon (ONYX_PREPACK=0 / 1 alternated, three
// runs each): vit-tiny's float32 step 3.5% faster, bert-mini's 3%, bert-base's unchanged; on a Zen
// 4, Whisper-base's bias-free k_proj forward (6000×512·512×512ᵀ) 122 → 160 GFLOP/s
// (ONYX_PROFILE=shapes).
void linear_f32(bool transB, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                int64_t lda, const float* B, int64_t ldb, const float* bias, float* Y);

// The output of a linear layer's mixed-precision product: float32 or bfloat16 (exactly one
// pointer set; M×N contiguous), and an optional float32 bias (N) added to every row.
struct LinearOut {
  float* f32 = nullptr;
  uint16_t* bf16 = nullptr;
  const float* bias = nullptr;
};
// Y(M,N) = alpha · A(M,K) · op(B) (+ bias), A row-major with row stride lda: gemm_mixed_bf16 with
// beta 0 and the linear layer's epilogue. Where the bf16 matmul is native (and alpha is 1) one
// oneDNN primitive adds the bias to the float32 accumulator and writes Y in its type — a bf16 Y
// rounded there (nearest even, denormals flushed, as f32_to_bf16) — so Y is written once, with
// no float32 copy of it and no pass of its own for the bias or the rounding (a weight B that is
// declared stable is read prepacked). Elsewhere the same float32 sum (the bias rows first, the
// GEMM accumulating onto them) in scratch, then rounded by f32_to_bf16.
void linear_mixed_bf16(bool transB, int64_t M, int64_t N, int64_t K, float alpha, Bf16Operand A,
                       int64_t lda, Bf16Operand B, int64_t ldb, const LinearOut& Y);

// float32 -> bfloat16 bits for GEMM inputs: rounding to nearest even (NaN stays NaN), float32
// denormals flushed to signed zero, as AVX512_BF16's vcvtneps2bf16 (used where the CPU has it)
// and its dot products do, so every CPU rounds alike; threaded over fixed ranges. And back
// (exact).
void f32_to_bf16(const float* x, uint16_t* y, int64_t n);
void bf16_to_f32(const uint16_t* x, float* y, int64_t n);
// y = x rounded to bf16 as f32_to_bf16 rounds, held in float32 (exact): bf16_to_f32(f32_to_bf16(x))
// without the bf16 array. y may be x.
void round_to_bf16(const float* x, float* y, int64_t n);
// Whether this CPU has AVX512_BF16 (read once).
bool cpu_has_avx512_bf16();
// Whether kernels that issue many small bf16 GEMMs (attention's tiles) call gemm_bf16 on bf16
// arrays (native: oneDNN's AVX512_BF16 matmul; the default where the CPU has AVX512_BF16 and
// the avx512 path is chosen, simd::native_bf16_conversions(); gemm_bf16 follows it too) or hold
// the bf16 values widened in float32 for sgemm (other CPUs: gemm_bf16 would widen its operands on
// every call). Both give the same products. force_bf16_gemm_native(1 / 0) makes every CPU take
// the native / widened path (tests run both: gemm_bf16 is correct on any CPU, only slower
// without AVX512_BF16); -1 restores the default. Not thread-safe against running kernels.
bool bf16_gemm_native();
void force_bf16_gemm_native(int native);

// Prepacked weights. oneDNN's matmul runs fastest on B in a layout of its choosing (blocked for
// its brgemm kernels: brg:avx512_core_bf16 for bf16); given B as stored it repacks B on every
// call. A caller whose weights stay the same over many GEMMs (a training step's forward and dX
// products, every micro-batch of a step, every batch of an evaluation) declares their memory
// stable: [data, data + bytes) holds the same values until it is declared again with another
// version (a number from new_weights_version(), unique in the process) or made unstable. A B that
// lies inside a stable range is then reordered once per version into the primitive's layout
// when that layout is blocked (one pack per weight and layout: forward's B^T and dX's B are
// two) and the GEMM reads the pack; a plain layout (oneDNN's float32 gemm:jit on AVX2) is read as
// stored, since a copy gains nothing there. Where that applies: bf16 weight operands of
// gemm_mixed_bf16 when bf16_gemm_native() (the mixed-precision shadow, train::TrainingSession), and
// float32 single GEMMs under ONYX_GEMM=onednn_matmul; never on oneDNN's reference implementation
// (there is no bf16 matmul at all without AVX512_BF16: oneDNN 2.6 needs avx512_core for bf16). The
// same products as the unpacked primitive. ONYX_PREPACK=0 (set_prepack_weights(0)) turns it off,
// ONYX_PREPACK=always (2) packs plain layouts too (tests and measurements: what the packs cost and
// give on any CPU); the packs cost their size in memory (about the weights' size per layout) until
// forget_stable_weights.
uint64_t new_weights_version();
void declare_stable_weights(const void* data, size_t bytes, uint64_t version);
// The range starting at data may change from now on: no GEMM reads its packs until it is declared
// again (the packs stay allocated: refreshed in place for the next version).
void unstable_weights(const void* data);
// unstable_weights, and frees the packs made from weights in [data, data + bytes).
void forget_stable_weights(const void* data, size_t bytes);
struct PackedWeightStats {
  size_t stable_ranges = 0, packs = 0, bytes = 0;
  int64_t reorders = 0;       // packs written (made or refreshed for a new version) since start-up
  int64_t plain_skipped = 0;  // GEMMs on a stable B that read it as stored: a plain layout
};
PackedWeightStats packed_weight_stats();
// 0 off, 1 blocked layouts only (the default), 2 always; -1: ONYX_PREPACK again.
void set_prepack_weights(int mode);
// Reads ONYX_GEMM and ONYX_PREPACK now (they are otherwise read at the first GEMM) and throws
// onyx::Error naming a bad value: the CLI and TrainingSession call it before any work is done.
void check_gemm_environment();

// Numpy batch broadcasting for batched matrix products: for each index of `batch` (row-major),
// the matrix index into A (batch shape a_batch) and into B (b_batch), both already padded with
// leading 1s to batch's rank; dims of size 1 repeat.
void broadcast_batch_offsets(const std::vector<int64_t>& batch, const std::vector<int64_t>& a_batch,
                             const std::vector<int64_t>& b_batch, std::vector<int64_t>& ai,
                             std::vector<int64_t>& bi);

}  // namespace onyx::kernels
