// kernels/cpu/small_gemm_bf16.h — bf16 products of attention-tile size on AVX512_BF16, single-
// threaded: C(M,N) (float32) = alpha · op(A) · op(B) + beta · C with A and B bfloat16 (raw bits),
// row-major as gemm.h, float32 accumulation by vdpbf16ps.
//
// What the fused attention kernel (kernels/attention/attention.cc) multiplies per head: tiles of
// at most a few hundred rows and columns over K = the head size (64) or the keys of a tile, one
// call per tile from inside its own parallel region. oneDNN's bf16 matmul runs those at 40-75% of
// one core's bf16 rate (onyx_bench tile_bf16 / attention_tile, Zen 5 AVX512_BF16 machine: 218-263
// GFLOP/s on vit-tiny's 50-row tiles, 350-390 on bert's 64×128×64, of ~520): its blocking and
// per-call setup target large products; this kernel runs the same tiles at 270-460.
// Hand-written because no library at hand does these small shapes well: the operands are packed
// into vdpbf16ps's pair layout (two consecutive k of a row or column in one 32-bit word) and
// multiplied in 4-row × 64-column register blocks. On CPUs with AMX (Intel Xeon since Sapphire
// Rapids) the same packed pairs are AMX's tile layout and the products run on the tile unit
// (tdpbf16ps, 2×2 tiles of 16×16 float32 per block): there vdpbf16ps reached 74-102 GFLOP/s on
// these tiles and oneDNN's AMX matmul 150-450 (onyx_bench tile_bf16, a 2-core Xeon), but called
// from inside the attention kernel's threads oneDNN's per-call work made the attention slower
// than vdpbf16ps; oneDNN 2.6 has no public small-GEMM (brgemm) interface.
#pragma once
#include <cstdint>

namespace onyx::kernels {

// Whether small_gemm_bf16 can run here: the CPU has AVX512_BF16 (and AVX512BW/VL).
bool small_gemm_bf16_supported();
// Whether it runs on AMX tiles: the CPU has AMX-TILE and AMX-BF16 and the kernel granted this
// process the tile state (Linux's arch_prctl(ARCH_REQ_XCOMP_PERM), asked for on the first call).
bool small_gemm_bf16_amx();
// Tests: 1 / 0 makes small_gemm_bf16 take the AMX / vdpbf16ps path (AMX only where
// small_gemm_bf16_amx()), -1 restores the default (AMX where available). Not thread-safe
// against running kernels.
void force_small_gemm_bf16_amx(int amx);

// C = alpha · op(A) · op(B) + beta · C (beta 0: C is not read). Products of bf16 values are exact
// in float32; they are summed in float32 with vdpbf16ps's rounding (two products per step, as
// oneDNN's AVX512_BF16 kernels sum them; a denormal input or result counts as 0), in an order of
// its own. Needs small_gemm_bf16_supported(); M, N, K >= 0.
void small_gemm_bf16(bool transA, bool transB, int64_t M, int64_t N, int64_t K, float alpha,
                     const uint16_t* A, int64_t lda, const uint16_t* B, int64_t ldb, float beta,
                     float* C, int64_t ldc);

}  // namespace onyx::kernels
