// kernels/cpu/simd/optimizer.h — the optimizers' flat-buffer kernels (AdamW and SGD updates, the
// grad norm's block sums of squares), compiled for every path of dispatch.h and
// called through Highway's dispatch tables (optimizer.cc). train/optimizer.cc keeps the threading,
// the weight-decay ranges and the scalars; it calls these once per contiguous range, so the
// indirect call is noise against the work. The buffer scale is simd.h's row_scale.
//
// Every path gives the same float32 bits for every element, tails included: the updates round
// exactly as PyTorch's float32 CPU kernels do (see optimizer.cc), with the same FMAs everywhere.
#pragma once
#include <cstdint>

namespace onyx::simd {

// ---- AdamW -----------------------------------------------------------------------------------
// The per-step constants, rounded to float where torch's kernels receive them.
struct AdamWConstants {
  float beta1, one_minus_beta1, beta2, one_minus_beta2;
  float bias_correction2_sqrt, eps, neg_step_size;  // neg_step_size = -lr / (1 - beta1^t)
  // the gradient clipping's factor, read into the update (the g below is g * grad_scale, the
  // product train::scale would have stored): 1 when there is none (exact: g * 1 == g)
  float grad_scale = 1.0f;
};
// One AdamW update of elements [0, n) of p (params), g (grads), m (exp_avg), v (exp_avg_sq):
//   g = g * grad_scale
//   p = p * keep;  m = fma(g, 1-b1, m*b1);  v = fma((1-b2)*g, g, v*b2)
//   p = p + (neg_step_size * m) / (sqrt(v) / bias_correction2_sqrt + eps)
// keep is 1 - lr * weight_decay for tensors with weight decay, 1 for the others.
void adamw_update(float* p, const float* g, float* m, float* v, int64_t n, const AdamWConstants& k,
                  float keep);

// ---- SGD -------------------------------------------------------------------------------------
struct SgdConstants {
  float weight_decay, momentum, neg_lr;
};
// sgd_update's flags. kSgdFirst and kSgdNesterov only count with kSgdMomentum.
enum SgdFlags : unsigned {
  kSgdDecay = 1,     // d = fma(p, weight_decay, g), else d = g
  kSgdMomentum = 2,  // buf = first ? d : buf * momentum + d (separate roundings); d = buf
  kSgdFirst = 4,     // the first step: buf starts as d
  kSgdNesterov = 8,  // d = fma(buf, momentum, d) instead of d = buf
};
// One SGD update of elements [0, n) of p, g and buf (the momentum buffer; unused without
// kSgdMomentum): the d above, then p = fma(d, neg_lr, p).
void sgd_update(float* p, const float* g, float* buf, int64_t n, const SgdConstants& k,
                unsigned flags);

// ---- grad norm -------------------------------------------------------------------------------
constexpr int64_t kSquareSumBlock = 64;
// sums[j] = the sum of x[i]^2 over block j, i in [64 j, min(64 j + 64, n)), in double and in one
// fixed order (optimizer.cc), so the same bits on every path. sums has (n + 63) / 64 entries.
void block_sum_squares(const float* x, int64_t n, double* sums);

}  // namespace onyx::simd
