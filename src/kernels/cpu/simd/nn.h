// kernels/cpu/simd/nn.h — the SIMD row kernels of the nn, loss, attention and Llama ops (float32
// rows and blocks), each compiled for every path of dispatch.h and called through Highway's
// dispatch table, like simd.h's. Callers (nn.cc, loss.cc, linear_cross_entropy.cc, attention.cc,
// llama_ops.cc) keep dtypes, shapes and threading and call these once per row or per block.
#pragma once
#include <cstdint>

namespace onyx::simd {

// ---- softmax rows and gradients, attention and loss rows (softmax.cc) ---------------------------
// y = softmax(x) over one contiguous row (y may alias x). NaN-propagating; a row of all -inf gives
// NaN (as numpy does).
void softmax_row(const float* x, float* y, int64_t n);
// y = x - max - log(sum(exp(x - max))) over one contiguous row (y may alias x).
void log_softmax_row(const float* x, float* y, int64_t n);
// One row r of softmax over a strided axis, vectorized over its n inner columns j:
// e = exp(x[j] - m[j]) (x <= m), s[j] += e, and y[j] = e when y != nullptr.
void softmax_cols_exp(const float* x, const float* m, float* y, float* s, int64_t n);
// dx = y * (dy - dot(dy, y)) over one contiguous row.
void softmax_grad_row(const float* dy, const float* y, float* dx, int64_t n);
// dx = dy - exp(y) * sum(dy) over one contiguous row (y = log-softmax <= 0).
void log_softmax_grad_row(const float* dy, const float* y, float* dx, int64_t n);
// dx[j] = dy[j] - exp(y[j]) * s[j]: one row of LogSoftmaxGrad over a strided axis (y <= 0).
void log_softmax_grad_cols(const float* dy, const float* y, const float* s, float* dx, int64_t n);
// Attention's dS row, in place over ds = dP: ds = (ds - dot(ds, p)) * p * scale.
void attention_grad_row(const float* p, float* ds, int64_t n, float scale);
// The same with dropout (pd = P', ds = dP'): ds = pd * ds, r = sum(ds), ds = (ds - p * r) * scale.
void attention_grad_row_dropout(const float* p, const float* pd, float* ds, int64_t n, float scale);
// y = exp(x) * c (x <= 0: log-probabilities); x == y allowed.
void scaled_exp_row(const float* x, float* y, int64_t n, float c);
void row_mul_sub(float* y, int64_t n, float a, float b);  // y = y * a - b (one FMA)

// ---- LayerNorm / RMSNorm rows, forward and backward (norm.cc) -----------------------------------
// y = (x - mean) * inv * scale [+ bias] (bias may be null); *mean and *inv (1 / sqrt(var + eps))
// returned. Two passes over x for the statistics (row_sum, row_sum_sq_dev). xhat (may be null)
// receives the normalized row (x - mean) * inv.
void layer_norm_row(const float* x, float* y, int64_t n, const float* scale, const float* bias,
                    float eps, float* mean, float* inv, float* xhat = nullptr);
// One row of LayerNormGrad: writes dx, adds dy * xhat into ds and dy into db. `normalized`: x is
// the forward's xhat itself (mean unused).
void layer_norm_grad_row(const float* dy, const float* x, const float* scale, float mean, float inv,
                         int64_t n, float* dx, float* ds, float* db, bool normalized = false);
// y = x * inv * scale with inv = 1 / sqrt(row_sum(x * x) / n + eps) (the squares rounded, as the
// unfused Mul and ReduceMean take them); returns inv. y holds the squares first (y != x). xhat
// (may be null) receives x * inv.
float rms_norm_row(const float* x, float* y, int64_t n, const float* scale, float eps,
                   float* xhat = nullptr);
// One row of RMSNormGrad: writes dx, adds dy * xhat into ds. `normalized`: x is xhat itself.
void rms_norm_grad_row(const float* dy, const float* x, const float* scale, float inv, int64_t n,
                       float* dx, float* ds, bool normalized = false);

// GroupNormalization's rows (float32; one channel's positions of one sample):
// y = (x - c) * a + b
void scale_shift_row(const float* x, float* y, int64_t n, float c, float a, float b);
// *s_dy = sum(dy), *s_dyx = sum(dy * (x - c))
void norm_grad_sums_row(const float* dy, const float* x, int64_t n, float c, float* s_dy,
                        float* s_dyx);
// dx = dy * a + (x - c) * b + e
void norm_grad_row(const float* dy, const float* x, float* dx, int64_t n, float a, float b, float c,
                   float e);

// ---- SwiGLU and rotary (llama.cc) ---------------------------------------------------------------
// y = silu(g) * u over a block (y may alias g or u).
void swiglu(const float* g, const float* u, float* y, int64_t n);
// dg = dy * u * s * (1 + g (1 - s)), du = dy * silu(g), s = sigmoid(g), over a block of any n
// (dg may alias dy, du may alias u).
void swiglu_grad(const float* dy, const float* g, const float* u, float* dg, float* du, int64_t n);
// One row of D (even) elements, h = D / 2, without FMA contraction (each product and sum rounded
// as the unfused Mul / Add nodes round it):
//   rotary_row       y1 = x1 c1 - x2 s1,  y2 = x2 c2 + x1 s2        (y = x c + rotate_half(x) s)
//   rotary_grad_row  y1 = x1 c1 + x2 s2,  y2 = x2 c2 - x1 s1        (the transposed rotation)
void rotary_row(const float* x, const float* c, const float* s, float* y, int64_t D);
void rotary_grad_row(const float* x, const float* c, const float* s, float* y, int64_t D);

}  // namespace onyx::simd
