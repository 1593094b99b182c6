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
// multiplied in 4-row × 64-column register blocks.
#pragma once
#include <cstdint>

namespace onyx::kernels {

// Whether small_gemm_bf16 can run here: the CPU has AVX512_BF16 (and AVX512BW/VL).
bool small_gemm_bf16_supported();

// C = alpha · op(A) · op(B) + beta · C (beta 0: C is not read). Products of bf16 values are exact
// in float32; they are summed in float32 with vdpbf16ps's rounding (two products per step, as
// oneDNN's AVX512_BF16 kernels sum them; a denormal input or result counts as 0), in an order of
// its own. Needs small_gemm_bf16_supported(); M, N, K >= 0.
void small_gemm_bf16(bool transA, bool transB, int64_t M, int64_t N, int64_t K, float alpha,
                     const uint16_t* A, int64_t lda, const uint16_t* B, int64_t ldb, float beta,
                     float* C, int64_t ldc);

}  // namespace onyx::kernels
