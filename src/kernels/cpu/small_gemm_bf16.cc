// kernels/cpu/small_gemm_bf16.cc — see small_gemm_bf16.h (why it is hand-written).
//
// vdpbf16ps multiplies 16 pairs of bf16 by 16 pairs and adds both products to 16 float32 lanes.
// A pair is two consecutive k of one row of op(A) or one column of op(B), packed in a 32-bit word
// (the lower k in the low half). The product is computed by register blocks of 4 rows × up to 4
// vectors of 16 columns: for each pair index kp, the 4 B vectors of Bp's row kp are loaded once
// and each row's A pair is broadcast against them (16 accumulators, 4 + 4 loads per 16 vdpbf16ps).
//
// Packing (per call, single-threaded): Bp is op(B) in pair rows, Kp × Np words (Np = N rounded up
// to 16, zero columns after N): B stored K×N interleaves two rows of 16 columns at a time; B
// stored N×K (transB) already holds each pair as a word of its row, so Bp is the 32-bit transpose
// of those words. A is read in place where its pairs are words of its rows (no transA, K even);
// otherwise packed pair-major (Ap[kp][i]), a transposed A by the same interleave as B. An odd K's
// last pair has a zero high half.
//
// AMX (where small_gemm_bf16_amx()): a B tile is 16 pair rows × 16 columns of such words — Bp's
// layout, its rows padded with zero pairs to a multiple of 16 — and an A tile 16 rows × 16 pairs,
// a row's pairs consecutive: Ap (Mp × Kw words, zero-padded to whole tiles) holds A's rows as
// stored, or a transposed A interleaved pair-major and transposed by words. Each block of 2×2 C
// tiles (32×32 float32) accumulates in tile registers over K and is stored into C (or, at C's
// edges and for other alpha / beta, into a scratch that alpha / beta are applied from). The tile
// configuration (all eight tiles 16 rows × 64 bytes) is loaded on every call: oneDNN's AMX
// kernels load their own.
#include "kernels/cpu/small_gemm_bf16.h"

#include "onyx/error.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "kernels/cpu/simd/simd.h"

namespace onyx::kernels {
namespace {

#define ONYX_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

// Where op(A)'s pair (i, kp) is: base + i * row + kp * pair, in uint16 elements (a 32-bit load).
struct PairView {
  const uint16_t* base;
  int64_t row, pair;
};

// dst[j] = lo[j] | hi[j] << 16 for j < n (hi null: 0), zeros for n <= j < n_padded: two rows of
// 16-bit values interleaved into pairs, 16 at a time (dst has room for n_padded rounded up to 16).
ONYX_BF16_TARGET void interleave_rows(const uint16_t* lo, const uint16_t* hi, int64_t n,
                                      int64_t n_padded, uint32_t* dst) {
  for (int64_t j = 0; j < n_padded; j += 16) {
    const int64_t m = std::max<int64_t>(0, std::min<int64_t>(16, n - j));
    const __mmask16 k = (__mmask16)((1u << m) - 1u);
    __m512i w = _mm512_maskz_cvtepu16_epi32(k, _mm256_maskz_loadu_epi16(k, lo + j));
    if (hi) {
      const __m512i h = _mm512_maskz_cvtepu16_epi32(k, _mm256_maskz_loadu_epi16(k, hi + j));
      w = _mm512_or_si512(w, _mm512_maskz_slli_epi32((__mmask16)0xffff, h, 16));
    }
    _mm512_storeu_si512(dst + j, w);
  }
}

// Bp (Kp × Np words) from B as stored: (K, N) with row stride ldb, or (N, K) with transB.
void pack_b(bool transB, int64_t N, int64_t K, const uint16_t* B, int64_t ldb, int64_t Np,
            uint32_t* Bp) {
  const int64_t Kp = (K + 1) / 2;
  if (!transB) {
    for (int64_t kp = 0; kp < Kp; kp++) {
      const uint16_t* hi = 2 * kp + 1 < K ? B + (2 * kp + 1) * ldb : nullptr;
      interleave_rows(B + 2 * kp * ldb, hi, N, Np, Bp + kp * Np);
    }
    return;
  }
  // transB: pair (kp, j) is the word at B + j*ldb + 2kp — Bp is the words' transpose
  for (int64_t kp = 0; kp < Kp; kp++) std::fill(Bp + kp * Np + N, Bp + (kp + 1) * Np, 0u);
  const bool words = K % 2 == 0 && ldb % 2 == 0 && reinterpret_cast<uintptr_t>(B) % 4 == 0;
  if (words) {
    const uint32_t* w = reinterpret_cast<const uint32_t*>(B);
    for (int64_t j0 = 0; j0 < N; j0 += 8)
      simd::transpose_strip32(Bp + j0, Np, w + j0 * (ldb / 2), ldb / 2, Kp,
                              std::min<int64_t>(8, N - j0));
    return;
  }
  for (int64_t j = 0; j < N; j++)
    for (int64_t kp = 0; kp < Kp; kp++) {
      const uint16_t* b = B + j * ldb + 2 * kp;
      Bp[kp * Np + j] = (uint32_t)b[0] | (2 * kp + 1 < K ? (uint32_t)b[1] << 16 : 0u);
    }
}

// C rows [i0, i0 + MR) × columns [j0, j0 + 16·NV) (the last vector masked by `last`).
template <int MR, int NV>
ONYX_BF16_TARGET void block(const PairView& a, int64_t i0, int64_t Kp, const uint32_t* Bp,
                            int64_t Np, int64_t j0, __mmask16 last, float alpha, float beta,
                            float* C, int64_t ldc) {
  // (fully unrolled, so the accumulators live in registers)
  __m512 acc[MR][NV];
#pragma GCC unroll 4
  for (int r = 0; r < MR; r++)
#pragma GCC unroll 4
    for (int v = 0; v < NV; v++) acc[r][v] = _mm512_setzero_ps();
  const uint16_t* ap = a.base + i0 * a.row;
  for (int64_t kp = 0; kp < Kp; kp++, ap += a.pair) {
    __m512i b[NV];
    const uint32_t* bp = Bp + kp * Np + j0;
#pragma GCC unroll 4
    for (int v = 0; v < NV; v++) b[v] = _mm512_loadu_si512(bp + 16 * v);
#pragma GCC unroll 4
    for (int r = 0; r < MR; r++) {
      uint32_t w;
      std::memcpy(&w, ap + r * a.row, 4);
      const __m512bh x = (__m512bh)_mm512_set1_epi32((int)w);
#pragma GCC unroll 4
      for (int v = 0; v < NV; v++) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], x, (__m512bh)b[v]);
    }
  }
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
#pragma GCC unroll 4
  for (int r = 0; r < MR; r++)
#pragma GCC unroll 4
    for (int v = 0; v < NV; v++) {
      float* c = C + (i0 + r) * ldc + j0 + 16 * v;
      const __mmask16 k = v == NV - 1 ? last : (__mmask16)0xffff;
      __m512 y = alpha == 1.0f ? acc[r][v] : _mm512_mul_ps(acc[r][v], va);
      if (beta != 0.0f) {
        const __m512 old = _mm512_maskz_loadu_ps(k, c);
        y = _mm512_add_ps(y, beta == 1.0f ? old : _mm512_mul_ps(old, vb));
      }
      _mm512_mask_storeu_ps(c, k, y);
    }
}

using BlockFn = void (*)(const PairView&, int64_t, int64_t, const uint32_t*, int64_t, int64_t,
                         __mmask16, float, float, float*, int64_t);
template <int MR>
BlockFn block_for(int nv) {
  switch (nv) {
    case 1:
      return block<MR, 1>;
    case 2:
      return block<MR, 2>;
    case 3:
      return block<MR, 3>;
    default:
      return block<MR, 4>;
  }
}
BlockFn block_fn(int rows, int nv) {
  switch (rows) {
    case 1:
      return block_for<1>(nv);
    case 2:
      return block_for<2>(nv);
    case 3:
      return block_for<3>(nv);
    default:
      return block_for<4>(nv);
  }
}

// ---- AMX ----------------------------------------------------------------------------------------

#define ONYX_AMX_TARGET \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,amx-tile,amx-bf16")))

constexpr int64_t kTile = 16;  // rows of a tile; 16 words (pairs, or float32 lanes) a row

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// CPUID leaf 7: AMX-TILE (EDX bit 24) and AMX-BF16 (bit 22); then Linux's permission to use the
// tile data state (ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18), which it grants per
// process (oneDNN asks for it too).
bool amx_available() {
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  if (!(d & (1u << 24)) || !(d & (1u << 22))) return false;
  return syscall(SYS_arch_prctl, 0x1023, 18) == 0;
}

std::atomic<int> g_force_amx{-1};

// palette 1, the eight tiles 16 rows × 64 bytes
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {64, 64, 64, 64, 64, 64, 64, 64};
  uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};

// Ap (Mp × Kw words, zeros outside op(A)): row i holds op(A)'s pairs (i, 0..Kp).
void pack_a_rows(bool transA, int64_t M, int64_t K, const uint16_t* A, int64_t lda, int64_t Mp,
                 int64_t Kw, std::vector<uint32_t>& tmp, uint32_t* Ap) {
  const int64_t Kp = (K + 1) / 2;
  if (!transA) {
    for (int64_t i = 0; i < M; i++) {
      uint16_t* row = reinterpret_cast<uint16_t*>(Ap + i * Kw);
      std::memcpy(row, A + i * lda, (size_t)K * sizeof(uint16_t));
      std::memset(row + K, 0, (size_t)(2 * Kw - K) * sizeof(uint16_t));
    }
  } else {
    // pair-major first (tmp[kp][i], as vdpbf16ps's packing), then the words transposed
    const int64_t Mw = round_up(M, 16);
    if (tmp.size() < (size_t)(Kp * Mw)) tmp.resize((size_t)(Kp * Mw));
    for (int64_t kp = 0; kp < Kp; kp++)
      interleave_rows(A + 2 * kp * lda, 2 * kp + 1 < K ? A + (2 * kp + 1) * lda : nullptr, M, Mw,
                      tmp.data() + kp * Mw);
    for (int64_t kp0 = 0; kp0 < Kp; kp0 += 8)
      simd::transpose_strip32(Ap + kp0, Kw, tmp.data() + kp0 * Mw, Mw, M,
                              std::min<int64_t>(8, Kp - kp0));
    for (int64_t i = 0; i < M; i++) std::fill(Ap + i * Kw + Kp, Ap + (i + 1) * Kw, 0u);
  }
  std::fill(Ap + M * Kw, Ap + Mp * Kw, 0u);
}

// A block of 16·MT × 16·NT results: Ap's rows [i0, ..) · Bp's columns [j0, ..) over Kw pairs,
// written as float32 to c (row stride ldc floats) — added to what c holds when load_c.
template <int MT, int NT>
ONYX_AMX_TARGET void amx_block(const uint32_t* Ap, int64_t Kw, const uint32_t* Bp, int64_t Np,
                               int64_t i0, int64_t j0, float* c, int64_t ldc, bool load_c) {
  // tiles 0-3: C (row block r, column block q at 2r + q); 4-5: A; 6-7: B
  const int64_t a_stride = Kw * 4, b_stride = Np * 4, c_stride = ldc * 4;
  if (load_c) {
    _tile_loadd(0, c, c_stride);
    if (NT > 1) _tile_loadd(1, c + kTile, c_stride);
    if (MT > 1) _tile_loadd(2, c + kTile * ldc, c_stride);
    if (MT > 1 && NT > 1) _tile_loadd(3, c + kTile * ldc + kTile, c_stride);
  } else {
    _tile_zero(0);
    if (NT > 1) _tile_zero(1);
    if (MT > 1) _tile_zero(2);
    if (MT > 1 && NT > 1) _tile_zero(3);
  }
  for (int64_t k0 = 0; k0 < Kw; k0 += kTile) {
    _tile_loadd(4, Ap + i0 * Kw + k0, a_stride);
    _tile_loadd(6, Bp + k0 * Np + j0, b_stride);
    _tile_dpbf16ps(0, 4, 6);
    if (NT > 1) {
      _tile_loadd(7, Bp + k0 * Np + j0 + kTile, b_stride);
      _tile_dpbf16ps(1, 4, 7);
    }
    if (MT > 1) {
      _tile_loadd(5, Ap + (i0 + kTile) * Kw + k0, a_stride);
      _tile_dpbf16ps(2, 5, 6);
      if (NT > 1) _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, c, c_stride);
  if (NT > 1) _tile_stored(1, c + kTile, c_stride);
  if (MT > 1) _tile_stored(2, c + kTile * ldc, c_stride);
  if (MT > 1 && NT > 1) _tile_stored(3, c + kTile * ldc + kTile, c_stride);
}

using AmxBlockFn = void (*)(const uint32_t*, int64_t, const uint32_t*, int64_t, int64_t, int64_t,
                            float*, int64_t, bool);

// C (M × N, ldc) = alpha · Cb + beta · C, Cb a block's results (row stride ldb floats).
ONYX_BF16_TARGET void amx_epilogue(int64_t M, int64_t N, const float* Cb, int64_t ldb, float alpha,
                                   float beta, float* C, int64_t ldc) {
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
  for (int64_t i = 0; i < M; i++)
    for (int64_t j = 0; j < N; j += 16) {
      const int64_t m = std::min<int64_t>(16, N - j);
      const __mmask16 k = (__mmask16)(m == 16 ? 0xffffu : (1u << m) - 1u);
      float* c = C + i * ldc + j;
      __m512 y = _mm512_loadu_ps(Cb + i * ldb + j);
      if (alpha != 1.0f) y = _mm512_mul_ps(y, va);
      if (beta != 0.0f) {
        const __m512 old = _mm512_maskz_loadu_ps(k, c);
        y = _mm512_add_ps(y, beta == 1.0f ? old : _mm512_mul_ps(old, vb));
      }
      _mm512_mask_storeu_ps(c, k, y);
    }
}

// Blocks of 2×2 tiles (1 at an odd edge). A block wholly inside C is written to C by the tile
// stores (started from C's values when beta is 1) where alpha is 1 and beta 0 or 1; any other
// block goes through a 32×32 scratch and amx_epilogue.
ONYX_AMX_TARGET void small_gemm_amx(bool transA, bool transB, int64_t M, int64_t N, int64_t K,
                                    float alpha, const uint16_t* A, int64_t lda, const uint16_t* B,
                                    int64_t ldb, float beta, float* C, int64_t ldc) {
  const int64_t Kp = (K + 1) / 2, Kw = round_up(Kp, kTile);
  const int64_t Mp = round_up(M, kTile), Np = round_up(N, kTile);
  thread_local std::vector<uint32_t> ap, bp, tmp;
  if (ap.size() < (size_t)(Mp * Kw)) ap.resize((size_t)(Mp * Kw));
  if (bp.size() < (size_t)(Kw * Np)) bp.resize((size_t)(Kw * Np));
  pack_a_rows(transA, M, K, A, lda, Mp, Kw, tmp, ap.data());
  pack_b(transB, N, K, B, ldb, Np, bp.data());
  std::fill(bp.data() + Kp * Np, bp.data() + Kw * Np, 0u);
  static const TileConfig config;
  static constexpr AmxBlockFn blocks[2][2] = {{amx_block<1, 1>, amx_block<1, 2>},
                                              {amx_block<2, 1>, amx_block<2, 2>}};
  const bool direct = alpha == 1.0f && (beta == 0.0f || beta == 1.0f);
  alignas(64) float scratch[2 * kTile * 2 * kTile];
  _tile_loadconfig(&config);
  for (int64_t i0 = 0; i0 < Mp; i0 += 2 * kTile) {
    const int mt = Mp - i0 > kTile ? 2 : 1;
    for (int64_t j0 = 0; j0 < Np; j0 += 2 * kTile) {
      const int nt = Np - j0 > kTile ? 2 : 1;
      const AmxBlockFn block = blocks[mt - 1][nt - 1];
      float* c = C + i0 * ldc + j0;
      if (direct && i0 + kTile * mt <= M && j0 + kTile * nt <= N) {
        block(ap.data(), Kw, bp.data(), Np, i0, j0, c, ldc, beta != 0.0f);
        continue;
      }
      block(ap.data(), Kw, bp.data(), Np, i0, j0, scratch, 2 * kTile, false);
      amx_epilogue(std::min<int64_t>(kTile * mt, M - i0), std::min<int64_t>(kTile * nt, N - j0),
                   scratch, 2 * kTile, alpha, beta, c, ldc);
    }
  }
  _tile_release();
}

}  // namespace

bool small_gemm_bf16_amx() {
  static const bool ok = small_gemm_bf16_supported() && amx_available();
  return ok;
}

void force_small_gemm_bf16_amx(int amx) {
  g_force_amx.store(amx < 0 ? -1 : (amx ? 1 : 0), std::memory_order_relaxed);
}

bool small_gemm_bf16_supported() {
  static const bool ok = __builtin_cpu_supports("avx512bf16") &&
                         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
  return ok;
}

void small_gemm_bf16(bool transA, bool transB, int64_t M, int64_t N, int64_t K, float alpha,
                     const uint16_t* A, int64_t lda, const uint16_t* B, int64_t ldb, float beta,
                     float* C, int64_t ldc) {
  ONYX_CHECK(small_gemm_bf16_supported(), "small_gemm_bf16 needs AVX512_BF16");
  ONYX_CHECK(M >= 0 && N >= 0 && K >= 0, "small_gemm_bf16: negative size");
  if (M == 0 || N == 0) return;
  const int force = g_force_amx.load(std::memory_order_relaxed);
  if (force != 0 && small_gemm_bf16_amx() && K > 0)
    return small_gemm_amx(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  const int64_t Kp = (K + 1) / 2, Np = (N + 15) / 16 * 16;
  thread_local std::vector<uint32_t> bp, ap;
  if (bp.size() < (size_t)(Kp * Np)) bp.resize((size_t)(Kp * Np));
  pack_b(transB, N, K, B, ldb, Np, bp.data());
  PairView a{A, lda, 2};  // a row's pairs in place
  if (transA || K % 2 != 0) {
    // Ap[kp][i]: stored A (K, M) interleaves two of its rows; a row-major A with an odd K is
    // packed the same way from its transpose's view (pair by pair).
    // (+16: a row's last vector of 16 may run past M into the next row, written after it)
    if (ap.size() < (size_t)(Kp * M + 16)) ap.resize((size_t)(Kp * M + 16));
    for (int64_t kp = 0; kp < Kp; kp++) {
      uint32_t* dst = ap.data() + kp * M;
      if (transA) {
        interleave_rows(A + 2 * kp * lda, 2 * kp + 1 < K ? A + (2 * kp + 1) * lda : nullptr, M, M,
                        dst);
      } else {
        for (int64_t i = 0; i < M; i++) {
          const uint16_t* x = A + i * lda + 2 * kp;
          dst[i] = (uint32_t)x[0] | (2 * kp + 1 < K ? (uint32_t)x[1] << 16 : 0u);
        }
      }
    }
    a = {reinterpret_cast<const uint16_t*>(ap.data()), 2, 2 * M};
  }
  for (int64_t j0 = 0; j0 < N; j0 += 64) {
    const int64_t cols = std::min<int64_t>(64, N - j0);
    const int nv = (int)((cols + 15) / 16);
    const int tail = (int)(cols - 16 * (nv - 1));
    const __mmask16 last = (__mmask16)(tail == 16 ? 0xffffu : (1u << tail) - 1u);
    for (int64_t i0 = 0; i0 < M; i0 += 4) {
      const int rows = (int)std::min<int64_t>(4, M - i0);
      block_fn(rows, nv)(a, i0, Kp, bp.data(), Np, j0, last, alpha, beta, C, ldc);
    }
  }
}

}  // namespace onyx::kernels
#else  // not x86-64: no vdpbf16ps; the attention kernel takes oneDNN's bf16 matmul

namespace onyx::kernels {

bool small_gemm_bf16_supported() { return false; }
bool small_gemm_bf16_amx() { return false; }
void force_small_gemm_bf16_amx(int) {}

void small_gemm_bf16(bool, bool, int64_t, int64_t, int64_t, float, const uint16_t*, int64_t,
                     const uint16_t*, int64_t, float, float*, int64_t) {
  throw Error("small_gemm_bf16 needs AVX512_BF16 (an x86-64 CPU)");
}

}  // namespace onyx::kernels
#endif
