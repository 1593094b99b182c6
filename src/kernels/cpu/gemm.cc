// kernels/cpu/gemm.cc — sgemm / sgemm_strided_batched over oneDNN or OpenBLAS (see gemm.h), the
// bf16 matmul gemm_bf16 with its conversions, and the float64 loop dgemm.
//
// Hand-written only as a thin dispatch layer: the arithmetic is the libraries'. What lives here is
// what the libraries leave to the caller on this machine (PERF.md):
//  - oneDNN primitive creation costs far more than running a small GEMM, so matmul primitives are
//    cached per (shape, strides, transposes, alpha, beta, threads) in a mutex-guarded map;
//  - OpenBLAS (gemm_openblas.cc) is a second backend, chosen with ONYX_GEMM=openblas;
//  - Aᵀ·B over many rows into a small output (a weight gradient: 512x512 from 512-6000 rows)
//    runs as single-threaded OpenBLAS products of each thread's share of the rows, their partials
//    added (split_rows_tn): oneDNN's sgemm ran 512x512 at 56-120 GFLOP/s from 6000 rows, 106-108
//    from 1024 and 116 from 512; the split at 136-178, 154-155 and 136 (onyx_bench grad_b_f32,
//    2 cores) — with no OpenBLAS thread pool, whose spinning workers slowed the GEMMs after them
//    when OpenBLAS ran threaded. From 128 rows, or into 512x2048, the split lost (70 vs 117,
//    152 vs 165 GFLOP/s).
#include "kernels/cpu/gemm.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <dnnl.hpp>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "kernels/cpu/gemm_openblas.h"
#include "kernels/cpu/onednn_scratch.h"
#include "kernels/cpu/simd/dispatch.h"
#include "kernels/cpu/simd/simd.h"
#include "onyx/dtype.h"
#include "onyx/error.h"
#include "runtime/parallel.h"

namespace onyx::kernels {
namespace {

GemmBackend backend_from_env() {
  const char* s = std::getenv("ONYX_GEMM");
  if (s == nullptr || *s == 0) return GemmBackend::OneDNN;
  std::string v(s);
  for (char& c : v) c = (char)std::tolower((unsigned char)c);
  if (v == "onednn" || v == "dnnl") return GemmBackend::OneDNN;
  if (v == "onednn_matmul") return GemmBackend::OneDNNMatmul;
  if (v == "openblas" || v == "blas") {
    ONYX_CHECK(openblas_available(), "ONYX_GEMM=", s,
               ": this minimal build (-DONYX_MINIMAL=ON) has no OpenBLAS; use 'onednn'");
    return GemmBackend::OpenBLAS;
  }
  throw Error(cat("ONYX_GEMM=", s, ": expected 'onednn', 'onednn_matmul' or 'openblas'"));
}

std::atomic<int> g_backend{-1};

// C = beta * C, for K == 0 (no product terms) where the libraries may not touch C.
void scale_c(int64_t M, int64_t N, float beta, float* C, int64_t ldc) {
  for (int64_t i = 0; i < M; i++) {
    float* c = C + i * ldc;
    if (beta == 0.f)
      std::fill(c, c + N, 0.f);
    else if (beta != 1.f)
      for (int64_t j = 0; j < N; j++) c[j] *= beta;
  }
}

void check_args(bool transA, bool transB, int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb,
                int64_t ldc) {
  ONYX_CHECK(M >= 0 && N >= 0 && K >= 0, "sgemm: negative size M=", M, " N=", N, " K=", K);
  ONYX_CHECK(lda >= std::max<int64_t>(1, transA ? M : K) &&
                 ldb >= std::max<int64_t>(1, transB ? K : N) && ldc >= std::max<int64_t>(1, N),
             "sgemm: leading dimensions too small: M=", M, " N=", N, " K=", K, " transA=", transA,
             " transB=", transB, " lda=", lda, " ldb=", ldb, " ldc=", ldc);
}

// ---- oneDNN ----------------------------------------------------------------------------------

void dnnl_single(bool transA, bool transB, int64_t M, int64_t N, int64_t K, float alpha,
                 const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
                 int64_t ldc) {
  dnnl_status_t st = dnnl_sgemm(transA ? 'T' : 'N', transB ? 'T' : 'N', M, N, K, alpha, A, lda, B,
                                ldb, beta, C, ldc);
  ONYX_CHECK(st == dnnl_success, "dnnl_sgemm failed (status ", (int)st, ") for M=", M, " N=", N,
             " K=", K, " lda=", lda, " ldb=", ldb, " ldc=", ldc);
}

dnnl::engine& cpu_engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

struct MatmulKey {
  int64_t v[19];
  bool operator==(const MatmulKey& o) const { return std::memcmp(v, o.v, sizeof(v)) == 0; }
};
struct MatmulKeyHash {
  size_t operator()(const MatmulKey& k) const {
    uint64_t h = 1469598103934665603ull;
    for (int64_t x : k.v) h = (h ^ (uint64_t)x) * 1099511628211ull;
    return (size_t)h;
  }
};

struct CachedMatmul {
  dnnl::matmul prim;
  dnnl::memory::desc a_md, b_md, c_md;
  dnnl::memory::desc bias_md;  // (1, N) float32, or empty: no bias input
  // With packed weights: B as it is stored (b_md is the layout the primitive chose for it)
  dnnl::memory::desc b_src_md;
  dnnl::memory::desc scratch_md;  // its user-mode scratchpad (kernels/cpu/onednn_scratch.h)
  bool reference = false;         // oneDNN found only its slow reference implementation
};

std::mutex g_cache_mu;
std::unordered_map<MatmulKey, std::shared_ptr<const CachedMatmul>, MatmulKeyHash> g_cache;
constexpr size_t kMaxCached = 4096;  // plans are per bucketed signature; this is only a backstop

int64_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// One matmul primitive for `batch` GEMMs at the given strides (batch 1 → plain 2-D).
// A and B are bfloat16 with bf16_ab; C is float32, or bfloat16 with c_bf16 (the float32
// accumulator rounded to nearest even in the primitive's epilogue). With packed_b (batch 1 only)
// the primitive chooses B's layout (format_tag::any): B is then passed reordered into b_md, from
// b_src_md (prepacked weights, below). With bias (batch 1 only) the primitive adds a float32 (N)
// row to every row of the product before C is written (beta must be 0).
std::shared_ptr<const CachedMatmul> get_matmul(bool transA, bool transB, int64_t M, int64_t N,
                                               int64_t K, float alpha, int64_t lda, int64_t strideA,
                                               int64_t ldb, int64_t strideB, float beta,
                                               int64_t ldc, int64_t strideC, int64_t batch,
                                               bool bf16_ab = false, bool packed_b = false,
                                               bool bias = false, bool c_bf16 = false) {
  int nthr = omp_get_max_threads();
  MatmulKey key{{transA, transB, M, N, K, lda, strideA, ldb, strideB, ldc, strideC, batch,
                 float_bits(alpha), float_bits(beta), nthr, bf16_ab, packed_b, bias, c_bf16}};
  {
    std::lock_guard<std::mutex> lock(g_cache_mu);
    auto it = g_cache.find(key);
    if (it != g_cache.end()) return it->second;
  }
  using dims = dnnl::memory::dims;
  using dt = dnnl::memory::data_type;
  auto md = [&](int64_t rows, int64_t cols, int64_t ld, bool trans, int64_t stride, dt type) {
    // logical (rows, cols); stored (cols, rows) with leading dimension ld when trans
    dims r_c_strides = trans ? dims{1, ld} : dims{ld, 1};
    if (batch == 1) return dnnl::memory::desc(dims{rows, cols}, type, r_c_strides);
    int64_t b = stride == 0 ? 1 : batch;  // size-1 batch dim broadcasts
    int64_t bs = stride == 0 ? (trans ? cols : rows) * ld : stride;
    return dnnl::memory::desc(dims{b, rows, cols}, type, dims{bs, r_c_strides[0], r_c_strides[1]});
  };
  auto e = std::make_shared<CachedMatmul>();
  const dt ab = bf16_ab ? dt::bf16 : dt::f32;
  e->a_md = md(M, K, lda, transA, strideA, ab);
  e->b_md = md(K, N, ldb, transB, strideB, ab);
  if (packed_b) {
    ONYX_CHECK(batch == 1, "get_matmul: packed weights are for single GEMMs");
    e->b_src_md = e->b_md;
    e->b_md = dnnl::memory::desc(dims{K, N}, ab, dnnl::memory::format_tag::any);
  }
  e->c_md = md(M, N, ldc, false, strideC, c_bf16 ? dt::bf16 : dt::f32);
  if (bias) {
    ONYX_CHECK(batch == 1 && beta == 0.f, "get_matmul: a bias is for single GEMMs without beta");
    e->bias_md = dnnl::memory::desc(dims{1, N}, dt::f32, dims{N, 1});
  }
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);  // run from any thread (execute)
  if (alpha != 1.f) attr.set_output_scales(0, {alpha});
  if (beta != 0.f) {
    dnnl::post_ops po;
    po.append_sum(beta);
    attr.set_post_ops(po);
  }
  dnnl::matmul::desc d = bias ? dnnl::matmul::desc(e->a_md, e->b_md, e->bias_md, e->c_md)
                              : dnnl::matmul::desc(e->a_md, e->b_md, e->c_md);
  dnnl::matmul::primitive_desc pd(d, attr, cpu_engine());
  e->reference = std::string(pd.impl_info_str()).find("ref") != std::string::npos;
  if (packed_b) e->b_md = pd.weights_desc();
  e->scratch_md = pd.scratchpad_desc();
  e->prim = dnnl::matmul(pd);
  std::lock_guard<std::mutex> lock(g_cache_mu);
  if (g_cache.size() >= kMaxCached) g_cache.clear();
  g_cache.emplace(key, e);
  return e;
}

// Runs a cached primitive on A, B (float32 or bf16, as it was made), C (float32 or bf16, as it
// was made) and its bias, when it was made with one. Each thread
// keeps the memory objects of the primitives it ran last (holding the primitive, so a cache
// clear cannot free it under them) and only swaps their data pointers instead of building three
// dnnl::memory per call: the primitive path's per-call overhead went from about 1.7 to 1.1 µs
// (bench_kernels attention_tile/QKt/f32_primitive against /f32 at a 4x8x4 shape, AVX2 CPU); the
// attention tiles' GEMMs take 12-16 µs each there. The scratchpad is this thread's
// (onednn_scratch.h): primitives run from several threads at once.
void execute(const std::shared_ptr<const CachedMatmul>& e, const void* A, const void* B, void* C,
             const float* bias = nullptr) {
  struct Bound {
    std::shared_ptr<const CachedMatmul> prim;
    dnnl::memory a, b, c, scratch, bias;
  };
  thread_local dnnl::stream stream(cpu_engine());
  thread_local std::vector<Bound> bound;  // most recently used last
  constexpr size_t kBound = 16;
  size_t i = bound.size();
  while (i > 0 && bound[i - 1].prim != e) i--;
  if (i == 0) {
    if (bound.size() >= kBound) bound.erase(bound.begin());
    bound.push_back({e, dnnl::memory(e->a_md, cpu_engine(), const_cast<void*>(A)),
                     dnnl::memory(e->b_md, cpu_engine(), const_cast<void*>(B)),
                     dnnl::memory(e->c_md, cpu_engine(), C), dnnl::memory(), dnnl::memory()});
    if (bias) bound.back().bias = dnnl::memory(e->bias_md, cpu_engine(), const_cast<float*>(bias));
    const size_t bytes = e->scratch_md.get_size();
    if (bytes > 0)
      bound.back().scratch =
          dnnl::memory(e->scratch_md, cpu_engine(), onednn_thread_scratch(bytes));
  } else {
    if (i != bound.size()) std::rotate(bound.begin() + (i - 1), bound.begin() + i, bound.end());
    Bound& m = bound.back();
    m.a.set_data_handle(const_cast<void*>(A));
    m.b.set_data_handle(const_cast<void*>(B));
    m.c.set_data_handle(C);
    if (bias) m.bias.set_data_handle(const_cast<float*>(bias));
  }
  Bound& m = bound.back();
  std::unordered_map<int, dnnl::memory> args{
      {DNNL_ARG_SRC, m.a}, {DNNL_ARG_WEIGHTS, m.b}, {DNNL_ARG_DST, m.c}};
  ONYX_CHECK((bias != nullptr) == (bool)m.bias, "execute: a bias for a primitive made without one");
  if (bias) args[DNNL_ARG_BIAS] = m.bias;
  if (m.scratch) {
    // (the buffer may have grown for another primitive since this one was bound)
    m.scratch.set_data_handle(onednn_thread_scratch(e->scratch_md.get_size()));
    args[DNNL_ARG_SCRATCHPAD] = m.scratch;
  }
  e->prim.execute(stream, args);
  stream.wait();
}

// Elements an operand op(X) (rows, cols) with leading dimension ld spans in memory: (stored rows
// - 1) full leading dimensions and one last stored row.
int64_t stored_extent(bool trans, int64_t rows, int64_t cols, int64_t ld) {
  return ((trans ? cols : rows) - 1) * ld + (trans ? rows : cols);
}

// ---- prepacked weights (gemm.h: declare_stable_weights) -----------------------------------------

struct StableRange {
  const char* begin;
  const char* end;
  uint64_t version;
};
// A weight matrix reordered into the layout a primitive chose for it, as of `version`.
struct Pack {
  dnnl::memory::desc src, dst;
  uint64_t version = 0;
  std::shared_ptr<uint8_t> buf;  // dst.get_size() bytes
};
std::mutex g_stable_mu;  // guards g_stable and g_packs
std::vector<StableRange> g_stable;
std::unordered_map<const void*, std::vector<Pack>> g_packs;  // by the weight's first element
std::atomic<int> g_stable_count{0};                          // g_stable.size(), read unlocked
std::atomic<uint64_t> g_next_version{1};
std::atomic<int64_t> g_reorders{0};
std::atomic<int64_t> g_plain_skipped{0};
std::atomic<int> g_prepack{-1};  // -1: ONYX_PREPACK not read yet; else 0, 1 or 2 (always)

int prepack_mode() {
  int p = g_prepack.load(std::memory_order_relaxed);
  if (p < 0) {
    const char* s = std::getenv("ONYX_PREPACK");
    const std::string v = s ? s : "";
    if (v.empty() || v == "1")
      p = 1;
    else if (v == "0")
      p = 0;
    else if (v == "always")
      p = 2;
    else
      throw Error(cat("ONYX_PREPACK=", v, ": expected '0', '1' or 'always'"));
    g_prepack.store(p, std::memory_order_relaxed);
  }
  return p;
}

// Whether a layout oneDNN chose is blocked (its brgemm kernels' packed weights) rather than a
// plain strided matrix.
bool blocked_layout(const dnnl::memory::desc& md) {
  return md.data.format_kind == dnnl_blocked && md.data.format_desc.blocking.inner_nblks > 0;
}

// The version of the stable range holding [p, p + bytes), or 0 (not all of it in one).
uint64_t stable_version_locked(const void* p, size_t bytes) {
  const char* b = (const char*)p;
  for (const StableRange& r : g_stable)
    if (b >= r.begin && b + bytes <= r.end) return r.version;
  return 0;
}

// Drops the packs of weights in [begin, end) (the caller holds g_stable_mu).
void drop_packs_locked(const char* begin, const char* end) {
  for (auto it = g_packs.begin(); it != g_packs.end();) {
    const char* w = (const char*)it->first;
    it = w >= begin && w < end ? g_packs.erase(it) : std::next(it);
  }
}

// B (stored as e's b_src_md) in e's packed layout as of `version`: the pack made for that layout
// earlier, reordered again if the weights changed since, or a new one.
std::shared_ptr<uint8_t> packed_weights(const CachedMatmul& e, const void* B, uint64_t version) {
  std::lock_guard<std::mutex> lock(g_stable_mu);
  std::vector<Pack>& packs = g_packs[B];
  Pack* pk = nullptr;
  for (Pack& q : packs)
    if (q.src == e.b_src_md && q.dst == e.b_md) pk = &q;
  if (pk != nullptr && pk->version == version) return pk->buf;
  if (pk == nullptr) {
    Pack q;
    q.src = e.b_src_md;
    q.dst = e.b_md;
    const size_t bytes = q.dst.get_size();
    q.buf = std::shared_ptr<uint8_t>((uint8_t*)std::aligned_alloc(64, (bytes + 63) / 64 * 64),
                                     [](uint8_t* x) { std::free(x); });
    ONYX_CHECK(q.buf != nullptr, "packed weights: could not allocate ", bytes, " bytes");
    packs.push_back(std::move(q));
    pk = &packs.back();
  }
  dnnl::memory src(pk->src, cpu_engine(), const_cast<void*>(B));
  dnnl::memory dst(pk->dst, cpu_engine(), pk->buf.get());
  dnnl::stream stream(cpu_engine());
  dnnl::reorder(src, dst).execute(stream, src, dst);
  stream.wait();
  pk->version = version;
  g_reorders.fetch_add(1, std::memory_order_relaxed);
  return pk->buf;
}

// C = alpha * op(A) · op(B) + beta * C (+ bias) by a matmul primitive that reads B prepacked, when
// B lies in a stable range and oneDNN has a real (not reference) implementation: true when it
// ran. C is bf16 with c_bf16 (get_matmul).
bool try_packed_matmul(bool transA, bool transB, int64_t M, int64_t N, int64_t K, float alpha,
                       const void* A, int64_t lda, const void* B, int64_t ldb, float beta, void* C,
                       int64_t ldc, bool bf16, const float* bias = nullptr, bool c_bf16 = false) {
  if (g_stable_count.load(std::memory_order_acquire) == 0) return false;
  const int mode = prepack_mode();
  if (mode == 0) return false;
  const size_t bytes = (size_t)stored_extent(transB, K, N, ldb) * (bf16 ? 2 : 4);
  uint64_t version;
  {
    std::lock_guard<std::mutex> lock(g_stable_mu);
    version = stable_version_locked(B, bytes);
  }
  if (version == 0) return false;
  std::shared_ptr<const CachedMatmul> e;
  try {
    e = get_matmul(transA, transB, M, N, K, alpha, lda, 0, ldb, 0, beta, ldc, 0, 1, bf16, true,
                   bias != nullptr, c_bf16);
  } catch (const dnnl::error&) {
    return false;  // no implementation for this type on this CPU (bf16 without AVX512_BF16)
  }
  if (e->reference) return false;
  if (mode == 1 && !blocked_layout(e->b_md)) {
    // A plain layout (float32 on AVX2: gemm:jit, at most B transposed) gains nothing from a
    // copy: measured, bert-mini float32 under onednn_matmul took 467-512 ms/step packing such
    // copies against 381-428 without (bf16_bench.py, AVX2 CPU, two runs each, alternated).
    // ONYX_PREPACK=always packs them.
    g_plain_skipped.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  std::shared_ptr<uint8_t> packed = packed_weights(*e, B, version);
  execute(e, A, packed.get(), C, bias);  // (packed held: a forget meanwhile cannot free it)
  return true;
}

void dnnl_matmul(bool transA, bool transB, int64_t M, int64_t N, int64_t K, float alpha,
                 const float* A, int64_t lda, int64_t strideA, const float* B, int64_t ldb,
                 int64_t strideB, float beta, float* C, int64_t ldc, int64_t strideC,
                 int64_t batch) {
  if (batch == 1 &&
      try_packed_matmul(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, false))
    return;
  std::shared_ptr<const CachedMatmul> e;
  try {
    e = get_matmul(transA, transB, M, N, K, alpha, lda, strideA, ldb, strideB, beta, ldc, strideC,
                   batch);
  } catch (const dnnl::error&) {
    e = nullptr;  // a layout oneDNN's matmul rejects: fall through to dnnl_sgemm per matrix
  }
  if (e == nullptr || e->reference) {
    for (int64_t i = 0; i < batch; i++)
      dnnl_single(transA, transB, M, N, K, alpha, A + i * strideA, lda, B + i * strideB, ldb, beta,
                  C + i * strideC, ldc);
    return;
  }
  execute(e, A, B, C);
}

// ---- bfloat16 -----------------------------------------------------------------------------------

// float32 -> bf16 without AVX512_BF16: denormals flushed to signed zero first, as that
// instruction does, then rounded to nearest even.
void f32_to_bf16_portable(const float* x, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    uint32_t u;
    std::memcpy(&u, &x[i], 4);
    y[i] = (u & 0x7f800000u) == 0 ? (uint16_t)((u >> 16) & 0x8000) : float_to_bf16(x[i]);
  }
}

#if defined(__x86_64__)
// 16 floats -> 16 bf16 with AVX512_BF16 (round to nearest even, NaN quiet); the last < 16 by a
// masked load and store (attention's rows of 50 or 200 are converted one by one).
__attribute__((target("avx512f,avx512bw,avx512bf16,avx512vl"))) void f32_to_bf16_avx512(
    const float* x, uint16_t* y, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256bh v = _mm512_cvtneps_pbh(_mm512_loadu_ps(x + i));
    _mm256_storeu_si256((__m256i*)(y + i), (__m256i)v);
  }
  if (i < n) {
    const __mmask16 k = (__mmask16)((1u << (n - i)) - 1u);
    __m256bh v = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(k, x + i));
    _mm256_mask_storeu_epi16(y + i, k, (__m256i)v);
  }
}
#else
// (never called: cpu_has_avx512_bf16() is false off x86)
void f32_to_bf16_avx512(const float* x, uint16_t* y, int64_t n) { f32_to_bf16_portable(x, y, n); }
#endif

// Elements per parallel chunk of the conversions (memory bound: large chunks).
constexpr int64_t kConvertGrain = 1 << 16;

// C = alpha * op(A) · op(B) + beta * C by sgemm on A and B as float32 values that
// `fill(operand, n, dst)` writes into per-thread scratch kept across calls (no page faults per
// call): the widened bf16 path and the emulated float16 one. lda / ldb as stored.
template <class Operand, class Fill>
void sgemm_on_scratch(bool transA, bool transB, int64_t M, int64_t N, int64_t K, float alpha,
                      Operand A, int64_t lda, Operand B, int64_t ldb, float beta, float* C,
                      int64_t ldc, Fill fill) {
  thread_local std::vector<float> a, b;
  auto in_scratch = [&](Operand x, int64_t n, std::vector<float>& buf) {
    if (buf.size() < (size_t)n) buf.resize((size_t)n);
    fill(x, n, buf.data());
    return (const float*)buf.data();
  };
  const float* a32 = in_scratch(A, stored_extent(transA, M, K, lda), a);
  const float* b32 = in_scratch(B, stored_extent(transB, K, N, ldb), b);
  sgemm(transA, transB, M, N, K, alpha, a32, lda, b32, ldb, beta, C, ldc);
}

}  // namespace

void fill_rows(void* C, int64_t R, size_t row_bytes, const void* row) {
  char* c = static_cast<char*>(C);
  runtime::parallel_for(R, std::max<int64_t>(1, 65536 / (int64_t)std::max<size_t>(1, row_bytes)),
                        [&](int64_t r0, int64_t r1) {
                          for (int64_t r = r0; r < r1; r++)
                            std::memcpy(c + r * row_bytes, row, row_bytes);
                        });
}

bool cpu_has_avx512_bf16() {
#if defined(__x86_64__)
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512vl");
  }();
  return has;
#else
  return false;
#endif
}

namespace {
std::atomic<int> g_force_native{-1};
}

bool bf16_gemm_native() {
  int f = g_force_native.load(std::memory_order_relaxed);
  return f < 0 ? simd::native_bf16_conversions() : f != 0;
}

void force_bf16_gemm_native(int native) {
  g_force_native.store(native < 0 ? -1 : (native ? 1 : 0), std::memory_order_relaxed);
}

void f32_to_bf16(const float* x, uint16_t* y, int64_t n) {
  const bool fast = simd::native_bf16_conversions();
  auto convert = [&](int64_t b, int64_t e) {
    if (fast)
      f32_to_bf16_avx512(x + b, y + b, e - b);
    else
      f32_to_bf16_portable(x + b, y + b, e - b);
  };
  if (n <= kConvertGrain) return convert(0, n);  // (a tile's row: no threading to ask about)
  runtime::parallel_for(n, kConvertGrain, convert);
}

void bf16_to_f32(const uint16_t* x, float* y, int64_t n) {
  runtime::parallel_for(n, kConvertGrain, [&](int64_t b, int64_t e) {
#pragma omp simd
    for (int64_t i = b; i < e; i++) y[i] = bf16_to_float(x[i]);
  });
}

void round_to_bf16(const float* x, float* y, int64_t n) {
  const bool fast = simd::native_bf16_conversions();
  runtime::parallel_for(n, kConvertGrain, [&](int64_t b, int64_t e) {
    uint16_t h[1024];
    for (int64_t i = b; i < e; i += 1024) {
      const int64_t m = std::min<int64_t>(1024, e - i);
      if (fast)
        f32_to_bf16_avx512(x + i, h, m);
      else
        f32_to_bf16_portable(x + i, h, m);
      for (int64_t j = 0; j < m; j++) y[i + j] = bf16_to_float(h[j]);
    }
  });
}

void round_to_fp16(const float* x, float* y, int64_t n) {
  runtime::parallel_for(n, kConvertGrain, [&](int64_t b, int64_t e) {
    uint16_t h[1024];
    for (int64_t i = b; i < e; i += 1024) {
      const int64_t m = std::min<int64_t>(1024, e - i);
      simd::f32_to_f16(x + i, h, m);
      simd::f16_to_f32(h, y + i, m);
    }
  });
}

void round_to(LowPrecision lp, const float* x, float* y, int64_t n) {
  if (lp == LowPrecision::Bf16) return round_to_bf16(x, y, n);
  if (lp == LowPrecision::Fp16) return round_to_fp16(x, y, n);
  if (y != x) std::memcpy(y, x, (size_t)n * sizeof(float));
}

void gemm_as_fp16(bool transA, bool transB, int64_t M, int64_t N, int64_t K, float alpha,
                  const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
                  int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) return scale_c(M, N, beta, C, ldc);
  sgemm_on_scratch(transA, transB, M, N, K, alpha, A, std::max<int64_t>(1, lda), B,
                   std::max<int64_t>(1, ldb), beta, C, ldc,
                   [](const float* x, int64_t n, float* y) { round_to_fp16(x, y, n); });
}

namespace {
// x's bf16 bits: x.bf16 as it is, or x.f32 (n elements) rounded into `scratch`.
const uint16_t* bf16_bits(Bf16Operand x, int64_t n, std::vector<uint16_t>& scratch) {
  if (x.bf16) return x.bf16;
  if (scratch.size() < (size_t)n) scratch.resize((size_t)n);
  f32_to_bf16(x.f32, scratch.data(), n);
  return scratch.data();
}

// C = alpha * op(A) · op(B) + beta * C (+ bias; C bf16 with c_bf16) by oneDNN's bf16 matmul,
// prepacked B first where b_maybe_stable (a weight): true when it ran — false where the bf16
// matmul is not native or oneDNN has only its reference (the caller's fallback runs then).
bool native_bf16_matmul(bool transA, bool transB, int64_t M, int64_t N, int64_t K, float alpha,
                        const uint16_t* A, int64_t lda, const uint16_t* B, int64_t ldb, float beta,
                        void* C, int64_t ldc, bool b_maybe_stable, const float* bias = nullptr,
                        bool c_bf16 = false) {
  if (!bf16_gemm_native()) return false;
  if (b_maybe_stable && try_packed_matmul(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C,
                                          ldc, true, bias, c_bf16))
    return true;
  std::shared_ptr<const CachedMatmul> e;
  try {
    e = get_matmul(transA, transB, M, N, K, alpha, lda, 0, ldb, 0, beta, ldc, 0, 1, true, false,
                   bias != nullptr, c_bf16);
  } catch (const dnnl::error&) {
    return false;
  }
  if (e->reference) return false;
  execute(e, A, B, C, bias);
  return true;
}

// gemm_bf16; b_maybe_stable: B may lie in a stable range (a weight: try the packed primitive).
void gemm_bf16_impl(bool transA, bool transB, int64_t M, int64_t N, int64_t K, float alpha,
                    const uint16_t* A, int64_t lda, const uint16_t* B, int64_t ldb, float beta,
                    float* C, int64_t ldc, bool b_maybe_stable) {
  check_args(transA, transB, M, N, K, lda, ldb, ldc);
  if (M == 0 || N == 0) return;
  if (K == 0) return scale_c(M, N, beta, C, ldc);
  if (native_bf16_matmul(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc,
                         b_maybe_stable))
    return;
  // widen both operands (exact) and run sgemm
  sgemm_on_scratch(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc,
                   [](const uint16_t* x, int64_t n, float* y) { bf16_to_f32(x, y, n); });
}
}  // namespace

void gemm_bf16(bool transA, bool transB, int64_t M, int64_t N, int64_t K, float alpha,
               const uint16_t* A, int64_t lda, const uint16_t* B, int64_t ldb, float beta, float* C,
               int64_t ldc) {
  gemm_bf16_impl(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, false);
}

void gemm_mixed_bf16(bool transA, bool transB, int64_t M, int64_t N, int64_t K, float alpha,
                     Bf16Operand A, int64_t lda, Bf16Operand B, int64_t ldb, float beta, float* C,
                     int64_t ldc) {
  ONYX_CHECK((A.f32 == nullptr) != (A.bf16 == nullptr) && (B.f32 == nullptr) != (B.bf16 == nullptr),
             "gemm_mixed_bf16: each operand needs exactly one of its float32 / bf16 pointers");
  if (M <= 0 || N <= 0) return;
  if (K <= 0) return scale_c(M, N, beta, C, ldc);
  lda = std::max<int64_t>(1, lda);
  ldb = std::max<int64_t>(1, ldb);
  if (!bf16_gemm_native()) {
    // Widened (no AVX512_BF16): each operand's bf16 values straight into float32 scratch — a
    // float32 one rounded in one pass (round_to_bf16), not rounded to bf16 bits and widened
    // again — and sgemm; the same products.
    return sgemm_on_scratch(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc,
                            [](Bf16Operand x, int64_t n, float* y) {
                              if (x.f32)
                                round_to_bf16(x.f32, y, n);
                              else
                                bf16_to_f32(x.bf16, y, n);
                            });
  }
  thread_local std::vector<uint16_t> a16, b16;
  const uint16_t* a = bf16_bits(A, stored_extent(transA, M, K, lda), a16);
  const uint16_t* b = bf16_bits(B, stored_extent(transB, K, N, ldb), b16);
  // (a bf16 B may be a weight's shadow: the linear layers' forward and dX products)
  gemm_bf16_impl(transA, transB, M, N, K, alpha, a, lda, b, ldb, beta, C, ldc, B.bf16 != nullptr);
}

namespace {
// Y = A · op(B) (+ bias) by one oneDNN bf16 primitive whose epilogue adds the bias and writes
// Y in its type (float32, or bf16 rounded by vcvtneps2bf16): true when it ran — false where
// there is no native bf16 matmul, oneDNN has only its reference, or alpha is not 1.
bool linear_native(bool transB, int64_t M, int64_t N, int64_t K, float alpha, Bf16Operand A,
                   int64_t lda, Bf16Operand B, int64_t ldb, const LinearOut& Y) {
  if (!bf16_gemm_native() || alpha != 1.f) return false;
  thread_local std::vector<uint16_t> a16, b16;
  const uint16_t* a = bf16_bits(A, stored_extent(false, M, K, lda), a16);
  const uint16_t* b = bf16_bits(B, stored_extent(transB, K, N, ldb), b16);
  void* C = Y.f32 ? (void*)Y.f32 : (void*)Y.bf16;
  // (a bf16 B may be a weight's shadow, read prepacked)
  return native_bf16_matmul(false, transB, M, N, K, 1.f, a, lda, b, ldb, 0.f, C, N,
                            B.bf16 != nullptr, Y.bias, Y.bf16 != nullptr);
}
}  // namespace

void linear_f32(bool transB, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                int64_t lda, const float* B, int64_t ldb, const float* bias, float* Y) {
  if (M <= 0 || N <= 0) return;
  lda = std::max<int64_t>(1, lda);
  ldb = std::max<int64_t>(1, ldb);
  if (K > 0 && gemm_backend() != GemmBackend::OpenBLAS &&
      try_packed_matmul(false, transB, M, N, K, alpha, A, lda, B, ldb, 0.0f, Y, N, false, bias))
    return;
  if (bias) fill_rows(Y, M, (size_t)N * sizeof(float), bias);  // (the GEMM adds onto them)
  sgemm(false, transB, M, N, K, alpha, A, lda, B, ldb, bias ? 1.0f : 0.0f, Y, N);
}

void linear_mixed_bf16(bool transB, int64_t M, int64_t N, int64_t K, float alpha, Bf16Operand A,
                       int64_t lda, Bf16Operand B, int64_t ldb, const LinearOut& Y) {
  ONYX_CHECK((Y.f32 == nullptr) != (Y.bf16 == nullptr),
             "linear_mixed_bf16: the output needs exactly one of its float32 / bf16 pointers");
  if (M <= 0 || N <= 0) return;
  if (K > 0 && linear_native(transB, M, N, K, alpha, A, std::max<int64_t>(1, lda), B,
                             std::max<int64_t>(1, ldb), Y))
    return;
  // Elsewhere: the float32 product starting from the bias rows (the GEMM accumulates onto them:
  // the same sum as the epilogue's), rounded afterwards as the epilogue rounds.
  thread_local std::vector<float> y32;
  float* C = Y.f32;
  if (C == nullptr) {
    if (y32.size() < (size_t)(M * N)) y32.resize((size_t)(M * N));
    C = y32.data();
  }
  if (Y.bias) fill_rows(C, M, N * sizeof(float), Y.bias);
  gemm_mixed_bf16(false, transB, M, N, K, alpha, A, lda, B, ldb, Y.bias ? 1.f : 0.f, C, N);
  if (Y.bf16) f32_to_bf16(C, Y.bf16, M * N);
}

void gemm_f32_bf16(bool transB, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                   int64_t lda, const uint16_t* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  gemm_mixed_bf16(false, transB, M, N, K, alpha, {A, nullptr}, lda, {nullptr, B}, ldb, beta, C,
                  ldc);
}

void gemm_as_bf16(bool transA, bool transB, int64_t M, int64_t N, int64_t K, float alpha,
                  const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
                  int64_t ldc) {
  gemm_mixed_bf16(transA, transB, M, N, K, alpha, {A, nullptr}, lda, {B, nullptr}, ldb, beta, C,
                  ldc);
}

GemmBackend gemm_backend() {
  int b = g_backend.load(std::memory_order_relaxed);
  if (b < 0) {
    b = (int)backend_from_env();
    g_backend.store(b, std::memory_order_relaxed);
  }
  return (GemmBackend)b;
}

void set_gemm_backend(GemmBackend b) {
  ONYX_CHECK(b != GemmBackend::OpenBLAS || openblas_available(),
             "the OpenBLAS GEMM backend is not in this minimal build (-DONYX_MINIMAL=ON)");
  g_backend.store((int)b, std::memory_order_relaxed);
}

std::vector<GemmBackend> available_gemm_backends() {
  std::vector<GemmBackend> out = {GemmBackend::OneDNN, GemmBackend::OneDNNMatmul};
  if (openblas_available()) out.push_back(GemmBackend::OpenBLAS);
  return out;
}

const char* gemm_backend_name(GemmBackend b) {
  switch (b) {
    case GemmBackend::OneDNN:
      return "onednn";
    case GemmBackend::OneDNNMatmul:
      return "onednn_matmul";
    case GemmBackend::OpenBLAS:
      return "openblas";
  }
  return "?";
}

uint64_t new_weights_version() { return g_next_version.fetch_add(1, std::memory_order_relaxed); }

void declare_stable_weights(const void* data, size_t bytes, uint64_t version) {
  ONYX_CHECK(version != 0, "declare_stable_weights: version 0 is not a version");
  if (data == nullptr || bytes == 0) return;
  const char* b = (const char*)data;
  std::lock_guard<std::mutex> lock(g_stable_mu);
  for (StableRange& r : g_stable)
    if (r.begin == b) {
      if (r.version == version && r.end == b + bytes) return;
      if (r.end != b + bytes) drop_packs_locked(r.begin, r.end);  // (a different buffer)
      r = {b, b + bytes, version};
      return;
    }
  g_stable.push_back({b, b + bytes, version});
  g_stable_count.store((int)g_stable.size(), std::memory_order_release);
}

void unstable_weights(const void* data) {
  if (data == nullptr) return;
  std::lock_guard<std::mutex> lock(g_stable_mu);
  for (size_t i = 0; i < g_stable.size(); i++)
    if (g_stable[i].begin == (const char*)data) {
      g_stable.erase(g_stable.begin() + (ptrdiff_t)i);
      break;
    }
  g_stable_count.store((int)g_stable.size(), std::memory_order_release);
}

void forget_stable_weights(const void* data, size_t bytes) {
  if (data == nullptr) return;
  unstable_weights(data);
  std::lock_guard<std::mutex> lock(g_stable_mu);
  drop_packs_locked((const char*)data, (const char*)data + bytes);
}

PackedWeightStats packed_weight_stats() {
  std::lock_guard<std::mutex> lock(g_stable_mu);
  PackedWeightStats st;
  st.stable_ranges = g_stable.size();
  for (auto& [w, packs] : g_packs)
    for (const Pack& p : packs) {
      st.packs++;
      st.bytes += p.dst.get_size();
    }
  st.reorders = g_reorders.load(std::memory_order_relaxed);
  st.plain_skipped = g_plain_skipped.load(std::memory_order_relaxed);
  return st;
}

void set_prepack_weights(int mode) {
  ONYX_CHECK(mode >= -1 && mode <= 2, "set_prepack_weights: mode ", mode, " is not -1, 0, 1 or 2");
  g_prepack.store(mode, std::memory_order_relaxed);
}

void check_gemm_environment() {
  gemm_backend();
  prepack_mode();
}

namespace {

// Whether C = alpha · Aᵀ B + beta · C goes through sgemm_split_rows_tn (see the header).
bool split_rows_tn(bool transA, bool transB, int64_t M, int64_t N, int64_t K) {
  return transA && !transB && M * N <= 512 * 512 && K >= 512 && openblas_available() &&
         runtime::num_threads() > 1 && !omp_in_parallel();
}

// C (M,N) = alpha · Aᵀ B + beta · C, A (K,M) and B (K,N): each thread's share of the K rows as one
// single-threaded OpenBLAS product into its own partial, the partials then added in thread order.
void sgemm_split_rows_tn(int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                         const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  const int64_t T = runtime::num_threads();
  std::vector<float> part((size_t)(T * M * N));
  runtime::parallel_for(T, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; p++) {
      const int64_t r0 = p * K / T, r1 = (p + 1) * K / T;
      openblas_sgemm(true, false, M, N, r1 - r0, 1.0f, A + r0 * lda, lda, B + r0 * ldb, ldb, 0.0f,
                     part.data() + p * M * N, N);
    }
  });
  runtime::parallel_for(M, 16, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; i++)
      for (int64_t j = 0; j < N; j++) {
        float s = part[(size_t)(i * N + j)];
        for (int64_t p = 1; p < T; p++) s += part[(size_t)((p * M + i) * N + j)];
        float& c = C[i * ldc + j];
        c = beta == 0.0f ? alpha * s : alpha * s + beta * c;
      }
  });
}

}  // namespace

void sgemm(bool transA, bool transB, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
           int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  check_args(transA, transB, M, N, K, lda, ldb, ldc);
  if (M == 0 || N == 0) return;
  if (K == 0) return scale_c(M, N, beta, C, ldc);
  GemmBackend be = gemm_backend();
  if (be == GemmBackend::OneDNN && split_rows_tn(transA, transB, M, N, K))
    return sgemm_split_rows_tn(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  if (be == GemmBackend::OpenBLAS)
    openblas_sgemm(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  else if (be == GemmBackend::OneDNNMatmul)
    dnnl_matmul(transA, transB, M, N, K, alpha, A, lda, 0, B, ldb, 0, beta, C, ldc, 0, 1);
  else
    dnnl_single(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void sgemm_strided_batched(bool transA, bool transB, int64_t M, int64_t N, int64_t K, float alpha,
                           const float* A, int64_t lda, int64_t strideA, const float* B,
                           int64_t ldb, int64_t strideB, float beta, float* C, int64_t ldc,
                           int64_t strideC, int64_t batch) {
  check_args(transA, transB, M, N, K, lda, ldb, ldc);
  ONYX_CHECK(batch >= 0 && strideA >= 0 && strideB >= 0 && strideC >= 0,
             "sgemm_strided_batched: negative batch or stride");
  if (batch == 0 || M == 0 || N == 0) return;
  if (K == 0) {
    for (int64_t i = 0; i < batch; i++) scale_c(M, N, beta, C + i * strideC, ldc);
    return;
  }
  if (batch == 1) return sgemm(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  if (gemm_backend() == GemmBackend::OpenBLAS) {
    for (int64_t i = 0; i < batch; i++)
      openblas_sgemm(transA, transB, M, N, K, alpha, A + i * strideA, lda, B + i * strideB, ldb,
                     beta, C + i * strideC, ldc);
    return;
  }
  dnnl_matmul(transA, transB, M, N, K, alpha, A, lda, strideA, B, ldb, strideB, beta, C, ldc,
              strideC, batch);
}

void dgemm(bool transA, bool transB, int64_t M, int64_t N, int64_t K, double alpha, const double* A,
           int64_t lda, const double* B, int64_t ldb, double beta, double* C, int64_t ldc) {
  runtime::parallel_for(M, std::max<int64_t>(1, 4096 / std::max<int64_t>(1, N * K)),
                        [&](int64_t i0, int64_t i1) {
                          std::vector<double> acc(N);
                          for (int64_t i = i0; i < i1; i++) {
                            std::fill(acc.begin(), acc.end(), 0.0);
                            for (int64_t k = 0; k < K; k++) {
                              double a = transA ? A[k * lda + i] : A[i * lda + k];
                              if (transB)
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

void broadcast_batch_offsets(const std::vector<int64_t>& batch, const std::vector<int64_t>& a_batch,
                             const std::vector<int64_t>& b_batch, std::vector<int64_t>& ai,
                             std::vector<int64_t>& bi) {
  int r = (int)batch.size();
  int64_t nb = 1;
  for (int64_t d : batch) nb *= d;
  ai.assign(nb, 0);
  bi.assign(nb, 0);
  std::vector<int64_t> as(r), bs(r), idx(r, 0);
  int64_t sa = 1, sb = 1;
  for (int d = r - 1; d >= 0; d--) {
    as[d] = a_batch[d] == 1 ? 0 : sa;
    bs[d] = b_batch[d] == 1 ? 0 : sb;
    sa *= a_batch[d];
    sb *= b_batch[d];
  }
  for (int64_t i = 0; i < nb; i++) {
    for (int d = 0; d < r; d++) {
      ai[i] += idx[d] * as[d];
      bi[i] += idx[d] * bs[d];
    }
    for (int d = r - 1; d >= 0; d--) {
      if (++idx[d] < batch[d]) break;
      idx[d] = 0;
    }
  }
}

}  // namespace onyx::kernels
