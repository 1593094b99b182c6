// kernels/cpu/simd/simd.h — the SIMD kernels' entry points (float32 arrays and rows), each
// compiled for every path of dispatch.h and called through Highway's dispatch table. Callers
// (the op kernels of kernels/cpu/, the optimizer) are plain baseline code; they call these per
// row or per block, so the indirect call is noise against the work.
#pragma once
#include <cstdint>

namespace onyx::simd {

// HWY_TARGET of the code the dispatch tables run now (rows.cc; dispatch.cc's chosen_path).
int64_t dispatched_target();

// ---- rows (rows.cc)
// ------------------------------------------------------------------------------
float row_sum(const float* x, int64_t n);
float row_sum_sq_dev(const float* x, int64_t n, float c);  // sum((x - c)^2)
float row_max(const float* x, int64_t n);
float row_min(const float* x, int64_t n);
// sum(exp(x - m)); if y != nullptr also stores exp(x - m) there (x == y allowed).
float row_sum_exp(const float* x, int64_t n, float m, float* y);
void row_scale(float* y, int64_t n, float s);  // y *= s

// ---- activations (activations.cc); x == y allowed -----------------------------------------------
void exp(const float* x, float* y, int64_t n);   // ~1 ulp, +inf above 88.72
void tanh(const float* x, float* y, int64_t n);  // abs error < 1e-7
void sigmoid(const float* x, float* y, int64_t n);
void silu(const float* x, float* y, int64_t n);  // x * sigmoid(x)
void sqrt(const float* x, float* y, int64_t n);
void erf(const float* x, float* y, int64_t n);       // abs error < 1e-7
void gelu_erf(const float* x, float* y, int64_t n);  // 0.5 x (1 + erf(x / sqrt 2))
void gelu_tanh(const float* x, float* y,
               int64_t n);  // x * sigmoid(2 sqrt(2/pi) (x + 0.044715 x^3))
// The fused activation gradients over one block (n <= kGradBlock; dx may alias dy, never x/y).
constexpr int64_t kGradBlock = 512;
void gelu_erf_grad(const float* dy, const float* x, float* dx, int64_t n);
void gelu_tanh_grad(const float* dy, const float* x, float* dx, int64_t n);
void silu_grad(const float* dy, const float* x, float* dx, int64_t n);
void erf_grad(const float* dy, const float* x, float* dx, int64_t n);
void relu_grad(const float* dy, const float* y, float* dx, int64_t n);
void sigmoid_grad(const float* dy, const float* y, float* dx, int64_t n);
void tanh_grad(const float* dy, const float* y, float* dx, int64_t n);

// ---- dropout (dropout.cc; the draw is defined in kernels/cpu/dropout_rng.h) --------------------
// The 32 Philox words of dropout group `group` (elements 32g..32g+31) in element order.
void philox_group_words(uint64_t group, uint32_t k0, uint32_t k1, uint32_t* u);
// out[i] = (keep(e0 + i) ? x[i] * scale : 0) + (res ? res[i] : 0) and mask[i] = keep(e0 + i) (mask
// may be null), i in [0, n); keep(e) iff (word(e) >> 8) >= t24. x == out allowed.
void dropout_range(uint32_t k0, uint32_t k1, uint32_t t24, float scale, int64_t e0, int64_t n,
                   const float* x, const float* res, float* out, bool* mask);
void dropout_grad_mask(const bool* m, const float* dy, float* dx, float scale, int64_t n);

// ---- arithmetic (arith.cc)
// -----------------------------------------------------------------------
enum class BinaryOp { Add, Sub, Mul, Div };
// o[i] = a[a_vec ? i : 0] op b[b_vec ? i : 0], i in [0, n) (o may alias a vector operand).
void binary(BinaryOp op, const float* a, bool a_vec, const float* b, bool b_vec, float* o,
            int64_t n);
// y = a + b over n elements (y may be a or b).
inline void add_arrays(const float* a, const float* b, float* y, int64_t n) {
  binary(BinaryOp::Add, a, true, b, true, y, n);
}

// ---- layout (layout.cc)
// -------------------------------------------------------------------------- d[p * ld + q] = s[p +
// q * ls] for p < P, q < qn <= 8 (4-byte bit copies, in 8x8 blocks).
void transpose_strip32(uint32_t* d, int64_t ld, const uint32_t* s, int64_t ls, int64_t P,
                       int64_t qn);
void f16_to_f32(const uint16_t* x, float* y, int64_t n);
void f32_to_f16(const float* x, uint16_t* y, int64_t n);  // round to nearest even
// float32 -> bf16 by the scalar float_to_bf16 (nearest even, NaN quiet, denormals kept): Cast's
// rule, vectorized (kernels/cpu/gemm.h f32_to_bf16 is the GEMM inputs' rule, denormals flushed).
void f32_to_bf16_bits(const float* x, uint16_t* y, int64_t n);

// ---- bitsandbytes' 4-bit codes (quant4.cc) ------------------------------------------------------
// Elements [begin, begin + count) of a 4-bit weight (two codes a byte, the even element in the
// high nibble; `packed` the whole weight's), each code[index] * scale of its block (code: the 16
// values; scales[i]: block begin / blocksize + i's): quant::Quant4View::dequantize's values, into
// float32, or into bf16 rounded as kernels/cpu/gemm.h's f32_to_bf16 rounds.
void dequant4_f32(const uint8_t* packed, const float* code, const float* scales, int64_t blocksize,
                  int64_t begin, int64_t count, float* out);
void dequant4_bf16(const uint8_t* packed, const float* code, const float* scales, int64_t blocksize,
                   int64_t begin, int64_t count, uint16_t* out);

}  // namespace onyx::simd
