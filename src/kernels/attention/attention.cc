// kernels/attention/attention.cc — fused multi-head scaled-dot-product attention, "onyx" domain,
// formed by passes/attention_fusion.cc from the exported Reshape/Transpose/MatMul/Softmax chains:
//
//   Attention(Q, K, V, [mask])  attrs num_heads, scale, causal [, num_kv_heads, dropout_ratio,
//                               seed, rng_key, zero_masked_rows]
//                               -> O, [LSE]
//     Q (B,Tq,H·D)  K (B,Tk,Hk·D)  V (B,Tk,Hk·Dv)  O (B,Tq,H·Dv)  mask: additive float,
//     broadcastable to (B,H,Tq,Tk). Hk = num_kv_heads (default H) divides H: grouped-query
//     attention, query head h reading key/value head h / (H/Hk) (Llama's repeat_kv without the
//     copies). Per query head h, reading the heads' columns in place:
//       S = scale * Q_h K_hᵀ + mask (causal: S_ij = -inf for j > i),  P = softmax_rows(S)
//       P' = Dropout(P): in a training run (KernelContext::training) with dropout_ratio r > 0,
//            P'_ij = M_ij · P_ij / (1 - r), M the mask the Dropout node this op replaced would
//            draw on the (B,H,Tq,Tk) probabilities — element ((b·H+h)·Tq+i)·Tk+j, Philox keyed
//            on the run seed, `seed` and `rng_key` (dropout_rng.h); otherwise P' = P
//       O_h = P' V_h   written into O at columns [h*Dv, (h+1)*Dv)
//     LSE (B,H,Tq): the softmax's row log-sum-exp (of S, before dropout), saved for the backward.
//   AttentionGrad(dO, Q, K, V, [mask], LSE)  same attrs (rng_key required with dropout) -> dQ, dK,
//   dV
//     P is recomputed from LSE (P = exp(S - LSE)) and P' from P with the same mask, then per head
//       dP' = dO_h V_hᵀ,  dV_h = P'ᵀ dO_h,  dP = M/(1-r) ∘ dP',
//       dS = P ∘ (dP - rowsum(dP ∘ P)) * scale = (P' ∘ dP' - P · rowsum(P' ∘ dP')) * scale,
//       dQ_h = dS K_h,   dK_h = dSᵀ Q_h   (dK and dV of a key/value head sum over its query
//     heads). The mask gets no gradient; the dropout mask is regenerated from its counter, never
//     stored.
//
// Mixed precision (passes/mixed_precision.cc): Q, K, V may be bfloat16, and with output_dtype =
// BFLOAT16 the forward writes O in bf16 (each P·V tile rounded as Cast rounds); the gradients are
// float32. Under KernelContext::bf16_gemm (TrainingArguments.bf16) every tile GEMM takes bf16
// operands with float32 accumulation, as PyTorch's CPU flash attention runs a bf16 SDPA under
// autocast: Q, K, V (float32 ones rounded once per call), P (the float32 softmax rounded per tile),
// dO and dS (rounded per tile); the scores, softmax, LSE, dP, the dS row pass and the dQ/dK/dV
// accumulation stay float32, and dS's row pass reads the float32 P. Two ways of running those bf16
// tiles, with the same rounding: natively (kernels::bf16_gemm_native(): oneDNN's AVX512_BF16
// matmul on bf16 arrays), or widened (other CPUs): the bf16 values held exactly in float32 and
// multiplied by sgemm — the same products (a product of two bf16 is exact in float32), so only
// the accumulation order differs. Under KernelContext::fp16_gemm (TrainingArguments.fp16,
// emulated) the same operands are rounded to float16 instead, always widened. Without either the
// tiles are float32 sgemm (bf16 Q/K/V widened exactly).
//
// Hand-written because this is the one place where the unfused graph materializes (B,H,T,T)
// tensors several times over (scores, scaled, masked, probabilities, and their gradients) plus
// four head transposes each way. Here the heads are read and written with leading dimension C
// (no transposes at all) and the T×T scores exist only as a per-thread tile of BQ query rows ×
// Tk keys that stays in L2. The backward recomputes P from the saved row LSE instead of storing
// it: storing P costs B·H·Tq·Tk floats per layer (4 MiB per layer for bert-mini at B16 T128, 8 MiB
// for gpt2-tiny at B8 T256); recomputing costs one extra (BQ×D)·(D×Tk) GEMM per tile, measured
// at 2.2 ms of 12.7 ms per layer forward+backward (1 thread, bert-mini shape): about 1% of a step.
// The row passes over a tile (mask add, softmax, dS) are the SIMD row kernels of simd/simd.h and
// simd/nn.h (AVX-512, AVX2 or portable code by run-time dispatch).
//
// Threading: the forward runs over (batch, head, query block) triples, the backward over
// (batch, key/value head) pairs (dK and dV accumulate over the query blocks of the pair's query
// heads, in a fixed order). Each task writes
// disjoint output columns/rows, so results do not depend on the thread count's split. The GEMMs
// are called inside the parallel region, where sgemm runs single-threaded (gemm.h).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <vector>

#include "kernels/cpu/dropout_rng.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/nn_util.h"
#include "kernels/cpu/simd/nn.h"
#include "kernels/cpu/simd/simd.h"
#include "kernels/cpu/small_gemm_bf16.h"
#include "kernels/elementwise/elementwise.h"
#include "kernels/kernel_api.h"

namespace onyx::kernels {
namespace {

using kernels::sgemm;

// Query rows per score tile (BQ). Measured (1 thread, B16 T128 H4 D64 and causal B8 T256):
// 16 and 32 lose to 64 by 5-15%; 128/256 tie at T128 and lose 10-40% on causal T256, where
// tiles let whole blocks of masked keys be skipped. Long key rows without a causal mask take
// kLongBlockQ: every tile GEMM packs the head's keys or values (Tk × D) once per block, and
// more rows per pack paid off on Whisper's encoder (T 1500, onyx_bench attention_node/whisper,
// AVX-512 Zen 4: forward 132 -> 109 ms, backward 279 -> 256 ms; 96 to 384 rows all within 4%).
constexpr int64_t kBlockQ = 64;
constexpr int64_t kLongBlockQ = 128;
constexpr int64_t kLongKeys = 512;      // key rows from which kLongBlockQ applies
constexpr int64_t kMaxLongKeys = 8192;  // a (kLongBlockQ, Tk) float32 tile stays under 4 MiB

// How the tile GEMMs run (see the header): float32; bf16 values held in float32 (widened); bf16
// arrays and oneDNN's bf16 matmul (native).
// Fp16Widened: TrainingArguments.fp16, float16 values held in float32 (no float16 math here).
enum class TileMode { F32, Bf16Widened, Bf16Native, Fp16Widened };

TileMode tile_mode(const KernelContext& ctx) {
  switch (kernels::low_precision(ctx)) {
    case kernels::LowPrecision::None:
      return TileMode::F32;
    case kernels::LowPrecision::Fp16:
      return TileMode::Fp16Widened;
    case kernels::LowPrecision::Bf16:
      break;
  }
  return kernels::bf16_gemm_native() ? TileMode::Bf16Native : TileMode::Bf16Widened;
}

// A tile GEMM operand: float32 values (F32, Bf16Widened) or bf16 bits (Bf16Native).
struct Operand {
  const float* f = nullptr;
  const uint16_t* h = nullptr;
  Operand at(int64_t offset) const { return {f ? f + offset : nullptr, h ? h + offset : nullptr}; }
};

// C = alpha * op(A) op(B) + beta * C: on bf16 operands the hand-written small_gemm_bf16 (AVX512_
// BF16: 1.2-1.6x oneDNN's matmul on these tiles, onyx_bench tile_bf16) — except, without AMX, a
// transposed B wider than 64 columns (the scores Q·Kᵀ of longer sequences), where packing Kᵀ
// costs more than it gains (0.93x at 64x128x64) and oneDNN's gemm_bf16 runs. With AMX
// small_gemm_bf16 takes every tile: oneDNN 2.6 runs a transposed B read in place from the heads
// (row stride C) by its gemm:jit, not by its AMX kernels — ~4 µs for bert-mini's 64x128x64
// scores alone (onyx_bench tile_bf16/bert/QKt_in_heads), but ~45-50 µs a call from the
// attention's two threads (ONEDNN_VERBOSE in a training step), against ~4 µs for the AMX tile
// kernel. sgemm on float32 operands (both operands are of one kind: the mode's).
void tile_gemm(bool transA, bool transB, int64_t M, int64_t N, int64_t K, float alpha, Operand A,
               int64_t lda, Operand B, int64_t ldb, float beta, float* C, int64_t ldc) {
  static const bool small = kernels::small_gemm_bf16_supported();
  static const bool amx = kernels::small_gemm_bf16_amx();
  if (A.h != nullptr && small && (!transB || N <= 64 || amx))
    kernels::small_gemm_bf16(transA, transB, M, N, K, alpha, A.h, lda, B.h, ldb, beta, C, ldc);
  else if (A.h != nullptr)
    kernels::gemm_bf16(transA, transB, M, N, K, alpha, A.h, lda, B.h, ldb, beta, C, ldc);
  else
    sgemm(transA, transB, M, N, K, alpha, A.f, lda, B.f, ldb, beta, C, ldc);
}

// A float32 tile as a tile GEMM operand, with its leading dimension.
struct TileOperand {
  Operand op;
  int64_t ld;
};

// A per-thread buffer float32 tiles (P, dS, dO) are rounded into for the bf16 tile GEMMs.
struct Rounder {
  std::vector<float> f;
  std::vector<uint16_t> h;
  // rows × cols of src (leading dimension ld): in F32 mode src itself; in the bf16 modes rounded to
  // bf16 (as kernels::f32_to_bf16 rounds) into this buffer, contiguous.
  TileOperand operator()(TileMode m, const float* src, int64_t rows, int64_t cols, int64_t ld) {
    if (m == TileMode::F32) return {{src, nullptr}, ld};
    const size_t n = (size_t)(rows * cols);
    if (m == TileMode::Bf16Native) {
      if (h.size() < n) h.resize(n);
      if (ld == cols) {
        kernels::f32_to_bf16(src, h.data(), rows * cols);
      } else {
        for (int64_t i = 0; i < rows; i++)
          kernels::f32_to_bf16(src + i * ld, h.data() + i * cols, cols);
      }
      return {{nullptr, h.data()}, cols};
    }
    if (f.size() < n) f.resize(n);
    for (int64_t i = 0; i < rows; i++)
      if (m == TileMode::Fp16Widened)
        kernels::round_to_fp16(src + i * ld, f.data() + i * cols, cols);
      else
        kernels::round_to_bf16(src + i * ld, f.data() + i * cols, cols);
    return {{f.data(), nullptr}, cols};
  }
};

// Sizes and attributes of one Attention / AttentionGrad node.
struct AttnDims {
  // C = H·D (Q's channels), Ck = Hk·D (K's), Cv = Hk·Dv (V's), Co = H·Dv (O's); G = H / Hk query
  // heads per key/value head.
  int64_t B = 0, Tq = 0, Tk = 0, H = 0, Hk = 0, G = 1, D = 0, Dv = 0, C = 0, Ck = 0, Cv = 0, Co = 0;
  float scale = 1.0f;
  bool causal = false;
  // A query row whose every score is -inf (the mask hides every key): softmax gives NaN there;
  // with zero_masked_rows the row's P (and so its output) is 0 instead, as the dynamo exporter's
  // SDPA writes it (Where(IsNaN(P), 0, P)). Its LSE is +inf, so backward recomputes P = 0.
  bool zero_masked_rows = false;
  // Additive mask viewed as (B,H,Tq,Tk) through element strides (0 on broadcast dims).
  bool has_mask = false;
  int64_t mb = 0, mh = 0, mq = 0, mk = 0;
  double dropout_ratio = 0;   // applied only in training runs (see dropout_draw)
  int64_t block_q = kBlockQ;  // query rows per score tile (see kLongBlockQ)
};

AttnDims attention_dims(const ir::Node& node, const TensorMeta& q, const TensorMeta& k,
                        const TensorMeta& v, const TensorMeta* mask) {
  AttnDims d;
  for (const TensorMeta* m : {&q, &k, &v})
    ONYX_CHECK(m->dtype == DType::Float32 || m->dtype == DType::BFloat16, node.describe(),
               ": Q, K and V must be float32 or bfloat16, got ", dtype_name(m->dtype));
  ONYX_CHECK(q.shape.size() == 3 && k.shape.size() == 3 && v.shape.size() == 3, node.describe(),
             ": Q, K, V must be (B,T,C); got ", shape_str(q.shape), ", ", shape_str(k.shape), ", ",
             shape_str(v.shape));
  d.B = q.shape[0];
  d.Tq = q.shape[1];
  d.C = q.shape[2];
  d.Tk = k.shape[1];
  d.Ck = k.shape[2];
  d.Cv = v.shape[2];
  d.H = node.attr_int_required("num_heads");
  d.Hk = node.attr_int("num_kv_heads", d.H);
  ONYX_CHECK(d.H > 0 && d.Hk > 0 && d.H % d.Hk == 0, node.describe(), ": num_kv_heads ", d.Hk,
             " must divide num_heads ", d.H);
  d.G = d.H / d.Hk;
  ONYX_CHECK(d.C % d.H == 0 && d.Cv % d.Hk == 0, node.describe(), ": num_heads ", d.H,
             " must divide Q's channels (", d.C, ") and num_kv_heads ", d.Hk, " V's (", d.Cv, ")");
  d.D = d.C / d.H;
  d.Dv = d.Cv / d.Hk;
  d.Co = d.H * d.Dv;
  ONYX_CHECK(k.shape[0] == d.B && v.shape[0] == d.B && d.Ck == d.Hk * d.D && v.shape[1] == d.Tk,
             node.describe(), ": Q ", shape_str(q.shape), ", K ", shape_str(k.shape), ", V ",
             shape_str(v.shape), " do not agree (num_heads ", d.H, ", num_kv_heads ", d.Hk, ")");
  d.scale = node.attr_float("scale", d.D > 0 ? 1.0f / std::sqrt((float)d.D) : 1.0f);
  d.causal = node.attr_int("causal", 0) != 0;
  d.zero_masked_rows = node.attr_int("zero_masked_rows", 0) != 0;
  d.dropout_ratio = node.attr_float("dropout_ratio", 0.0f);
  ONYX_CHECK(d.dropout_ratio >= 0 && d.dropout_ratio <= 1, node.describe(), ": dropout_ratio ",
             d.dropout_ratio, " must be in [0, 1]");
  ONYX_CHECK(!d.causal || d.Tq == d.Tk, node.describe(), ": causal attention needs Tq == Tk, got ",
             d.Tq, " and ", d.Tk);
  if (!d.causal && d.Tk >= kLongKeys && d.Tk <= kMaxLongKeys) d.block_q = kLongBlockQ;
  if (mask) {
    ONYX_CHECK(mask->dtype == DType::Float32, node.describe(), ": the mask must be float32, got ",
               dtype_name(mask->dtype));
    const Shape& ms = mask->shape;
    ONYX_CHECK(ms.size() <= 4, node.describe(), ": mask ", shape_str(ms), " has rank > 4");
    int64_t full[4] = {d.B, d.H, d.Tq, d.Tk}, dims[4] = {1, 1, 1, 1}, strides[4];
    for (size_t i = 0; i < ms.size(); i++) dims[4 - ms.size() + i] = ms[i];
    int64_t s = 1;
    for (int i = 3; i >= 0; i--) {
      ONYX_CHECK(dims[i] == full[i] || dims[i] == 1, node.describe(), ": mask ", shape_str(ms),
                 " does not broadcast to (B,H,Tq,Tk) = ", shape_str(Shape(full, full + 4)));
      strides[i] = dims[i] == 1 ? 0 : s;
      s *= dims[i];
    }
    d.has_mask = true;
    d.mb = strides[0];
    d.mh = strides[1];
    d.mq = strides[2];
    d.mk = strides[3];
  }
  return d;
}

// The probabilities' dropout draw when it is active (a training run and dropout_ratio > 0), as the
// Dropout node this op replaced would draw it; nullopt otherwise. The backward must regenerate the
// forward's mask, so AttentionGrad needs the forward's identity in rng_key.
std::optional<dropout_rng::Draw> dropout_draw(const KernelContext& ctx, const AttnDims& d,
                                              bool grad) {
  if (!ctx.training || !(d.dropout_ratio > 0)) return std::nullopt;
  ONYX_CHECK(!grad || ctx.node.has_attr("rng_key"), ctx.node.describe(),
             ": dropout needs the forward's rng_key attribute to regenerate its mask");
  return dropout_rng::make_draw(ctx.seed, ctx.node.attr_int("seed", 0),
                                dropout_rng::rng_key_of(ctx.node), d.dropout_ratio);
}

// Scores of query rows [r0, r0+rows) of head (b,h) against keys [0, n): S = scale * Q Kᵀ + mask,
// into S (rows, n) with leading dimension n. Returns nothing; causal limits are applied by callers.
void scores_tile(const AttnDims& d, Operand Q, Operand K, const float* mask, int64_t b, int64_t h,
                 int64_t r0, int64_t rows, int64_t n, float* S) {
  Operand q = Q.at((b * d.Tq + r0) * d.C + h * d.D);    // (rows, D), ld C
  Operand k = K.at(b * d.Tk * d.Ck + (h / d.G) * d.D);  // (n, D), ld Ck
  tile_gemm(false, true, rows, n, d.D, d.scale, q, d.C, k, d.Ck, 0.0f, S, n);
  if (!mask) return;
  for (int64_t i = 0; i < rows; i++) {
    const float* m = mask + b * d.mb + h * d.mh + (r0 + i) * d.mq;
    float* s = S + i * n;
    if (d.mk == 1) {
      simd::add_arrays(s, m, s, n);
    } else {
      for (int64_t j = 0; j < n; j++) s[j] += m[0];
    }
  }
}

// Number of keys query row i may see: all Tk, or i+1 when causal.
inline int64_t row_keys(const AttnDims& d, int64_t n, int64_t i) {
  return d.causal ? std::min<int64_t>(n, i + 1) : n;
}

// ---- forward ------------------------------------------------------------------------------------

// O is float32, or bfloat16 when O16 is given instead (output_dtype = BFLOAT16, set by
// passes/mixed_precision.cc when only GEMMs read O): each tile's P·V is formed in float32 and
// rounded as Cast rounds into O16's columns.
void attention_forward(const AttnDims& d, TileMode mode, Operand Q, Operand K, Operand V,
                       const float* mask, const dropout_rng::Draw* drop, float* O, BFloat16* O16,
                       float* LSE) {
  const int64_t BQ = d.block_q;
  int64_t nblk = (d.Tq + BQ - 1) / BQ;
  int64_t tasks = d.B * d.H * nblk;
  parallel_for(tasks, 1, [&](int64_t t0, int64_t t1) {
    const int64_t bq = std::min(BQ, d.Tq);
    std::vector<float> tile((size_t)(bq * d.Tk));             // per-thread scores (BQ,Tk)
    std::vector<float> otile(O16 ? (size_t)(bq * d.Dv) : 0);  // P·V before rounding to bf16
    float* S = tile.data();
    Rounder round_p;
    for (int64_t t = t0; t < t1; t++) {
      int64_t bh = t / nblk, blk = t % nblk, b = bh / d.H, h = bh % d.H;
      int64_t r0 = blk * BQ, rows = std::min(BQ, d.Tq - r0);
      int64_t n = d.causal ? r0 + rows : d.Tk;  // keys any row of this block may see
      scores_tile(d, Q, K, mask, b, h, r0, rows, n, S);
      for (int64_t i = 0; i < rows; i++) {
        float* s = S + i * n;
        int64_t ni = row_keys(d, n, r0 + i);
        float mx = simd::row_max(s, ni);
        if (d.zero_masked_rows && mx == -INFINITY) {
          std::fill(s, s + n, 0.0f);
          if (LSE) LSE[bh * d.Tq + r0 + i] = INFINITY;
          continue;
        }
        float sum = simd::row_sum_exp(s, ni, mx, s);
        simd::row_scale(s, ni, 1.0f / sum);
        std::fill(s + ni, s + n, 0.0f);
        if (LSE) LSE[bh * d.Tq + r0 + i] = mx + std::log(sum);
        if (drop) dropout_rng::apply_row(*drop, (bh * d.Tq + r0 + i) * d.Tk, ni, s);
      }
      Operand v = V.at(b * d.Tk * d.Cv + (h / d.G) * d.Dv);  // (n, Dv), ld Cv
      TileOperand p = round_p(mode, S, rows, n, n);
      if (O16) {
        tile_gemm(false, false, rows, d.Dv, n, 1.0f, p.op, p.ld, v, d.Cv, 0.0f, otile.data(), d.Dv);
        for (int64_t i = 0; i < rows; i++)
          ew::from_float(otile.data() + i * d.Dv, O16 + (b * d.Tq + r0 + i) * d.Co + h * d.Dv,
                         d.Dv);
        continue;
      }
      float* o = O + (b * d.Tq + r0) * d.Co + h * d.Dv;  // (rows, Dv), ld Co
      tile_gemm(false, false, rows, d.Dv, n, 1.0f, p.op, p.ld, v, d.Cv, 0.0f, o, d.Co);
    }
  });
}

// ---- backward -----------------------------------------------------------------------------------

void attention_backward(const AttnDims& d, TileMode mode, const float* dO, Operand Q, Operand K,
                        Operand V, const float* mask, const float* LSE,
                        const dropout_rng::Draw* drop, float* dQ, float* dK, float* dV) {
  int64_t pairs = d.B * d.Hk;
  parallel_for(pairs, 1, [&](int64_t p0, int64_t p1) {
    const int64_t BQ = d.block_q;
    size_t tile_elems = (size_t)(std::min(BQ, d.Tq) * d.Tk);
    // per-thread P and dP/dS tiles (BQ,Tk), and the dropped P' with dropout
    std::vector<float> tiles((drop ? 3 : 2) * tile_elems);
    float* P = tiles.data();
    float* dS = P + tile_elems;
    float* Pd = drop ? dS + tile_elems : nullptr;
    Rounder round_o, round_p, round_s;  // dO, P (or P'), dS as bf16 tile operands
    for (int64_t bk = p0; bk < p1; bk++) {
      int64_t b = bk / d.Hk, kh = bk % d.Hk;
      Operand k = K.at(b * d.Tk * d.Ck + kh * d.D);   // (Tk, D), ld Ck
      Operand v = V.at(b * d.Tk * d.Cv + kh * d.Dv);  // (Tk, Dv), ld Cv
      float* dk = dK + b * d.Tk * d.Ck + kh * d.D;
      float* dv = dV + b * d.Tk * d.Cv + kh * d.Dv;
      for (int64_t j = 0; j < d.Tk; j++) {  // dK, dV accumulate over query heads and blocks
        std::fill(dk + j * d.Ck, dk + j * d.Ck + d.D, 0.0f);
        std::fill(dv + j * d.Cv, dv + j * d.Cv + d.Dv, 0.0f);
      }
      // the group's query heads h, each in blocks of rows [r0, r0 + rows)
      for (int64_t h = kh * d.G, bh = b * d.H + h; h < (kh + 1) * d.G; h++, bh++)
        for (int64_t r0 = 0; r0 < d.Tq; r0 += BQ) {
          int64_t rows = std::min(BQ, d.Tq - r0);
          int64_t n = d.causal ? r0 + rows : d.Tk;
          Operand q = Q.at((b * d.Tq + r0) * d.C + h * d.D);  // (rows, D), ld C
          TileOperand dout = round_o(mode, dO + (b * d.Tq + r0) * d.Co + h * d.Dv, rows, d.Dv,
                                     d.Co);                  // (rows, Dv)
          float* dq = dQ + (b * d.Tq + r0) * d.C + h * d.D;  // (rows, D)
          // P = exp(S - LSE), zero where causal hides the key.
          scores_tile(d, Q, K, mask, b, h, r0, rows, n, P);
          for (int64_t i = 0; i < rows; i++) {
            float* p = P + i * n;
            int64_t ni = row_keys(d, n, r0 + i);
            simd::row_sum_exp(p, ni, LSE[bh * d.Tq + r0 + i], p);
            std::fill(p + ni, p + n, 0.0f);
          }
          if (drop) {
            // P' = M/(1-r) ∘ P;  dP' = dO Vᵀ;  dV += P'ᵀ dO;
            // dS = (P' ∘ dP' - P · rowsum(P' ∘ dP')) * scale   (P ∘ dP = P' ∘ dP')
            for (int64_t i = 0; i < rows; i++) {
              std::memcpy(Pd + i * n, P + i * n, (size_t)n * sizeof(float));
              dropout_rng::apply_row(*drop, (bh * d.Tq + r0 + i) * d.Tk, row_keys(d, n, r0 + i),
                                     Pd + i * n);
            }
            tile_gemm(false, true, rows, n, d.Dv, 1.0f, dout.op, dout.ld, v, d.Cv, 0.0f, dS, n);
            TileOperand pd = round_p(mode, Pd, rows, n, n);
            tile_gemm(true, false, n, d.Dv, rows, 1.0f, pd.op, pd.ld, dout.op, dout.ld, 1.0f, dv,
                      d.Cv);
            for (int64_t i = 0; i < rows; i++)
              simd::attention_grad_row_dropout(P + i * n, Pd + i * n, dS + i * n, n, d.scale);
          } else {
            // dP = dO Vᵀ (rows, n);  dV += Pᵀ dO (n, Dv)
            tile_gemm(false, true, rows, n, d.Dv, 1.0f, dout.op, dout.ld, v, d.Cv, 0.0f, dS, n);
            TileOperand p = round_p(mode, P, rows, n, n);
            tile_gemm(true, false, n, d.Dv, rows, 1.0f, p.op, p.ld, dout.op, dout.ld, 1.0f, dv,
                      d.Cv);
            // dS = P ∘ (dP - rowsum(dP ∘ P)) * scale
            for (int64_t i = 0; i < rows; i++)
              simd::attention_grad_row(P + i * n, dS + i * n, n, d.scale);
          }
          // dQ = dS K (rows, D);  dK += dSᵀ Q (n, D)
          TileOperand ds = round_s(mode, dS, rows, n, n);
          tile_gemm(false, false, rows, d.D, n, 1.0f, ds.op, ds.ld, k, d.Ck, 0.0f, dq, d.C);
          tile_gemm(true, false, n, d.D, rows, 1.0f, ds.op, ds.ld, q, d.C, 1.0f, dk, d.Ck);
        }
    }
  });
}

// ---- registration -------------------------------------------------------------------------------

const TensorMeta* optional_meta(InferContext& ctx, int i) {
  return ctx.has_input(i) ? &ctx.input(i) : nullptr;
}

// Per-thread storage for Q, K or V converted for the tiles (kept across calls).
struct QkvBuffer {
  std::vector<float> f;
  std::vector<uint16_t> h;
};

// Q, K or V (float32, or a bf16 projection the mixed-precision pass stores in bf16) as the tiles'
// operand: F32 mode: float32 in place, a bf16 input widened (exact); Bf16Widened: a bf16 input
// widened, a float32 one rounded to bf16 and held in float32; Bf16Native: a bf16 input in place,
// a float32 one rounded; Fp16Widened: rounded to float16, held in float32.
Operand qkv_operand(const Tensor& t, TileMode mode, QkvBuffer& buf) {
  const int64_t n = t.numel();
  const bool is_bf16 = t.dtype() == DType::BFloat16;
  if (mode == TileMode::F32 && !is_bf16) return {t.data<float>(), nullptr};
  if (mode == TileMode::Bf16Native) {
    if (is_bf16) return {nullptr, t.data<uint16_t>()};
    if (buf.h.size() < (size_t)n) buf.h.resize((size_t)n);
    kernels::f32_to_bf16(t.data<float>(), buf.h.data(), n);
    return {nullptr, buf.h.data()};
  }
  if (buf.f.size() < (size_t)n) buf.f.resize((size_t)n);
  if (is_bf16) kernels::bf16_to_f32(t.data<uint16_t>(), buf.f.data(), n);
  if (mode == TileMode::Fp16Widened)  // (a bf16 input too: autocast would cast it to float16)
    kernels::round_to_fp16(is_bf16 ? buf.f.data() : t.data<float>(), buf.f.data(), n);
  else if (!is_bf16)  // Bf16Widened, a float32 input
    kernels::round_to_bf16(t.data<float>(), buf.f.data(), n);
  return {buf.f.data(), nullptr};
}

OpKernel make_attention_kernel() {
  OpKernel k;
  k.infer = [](InferContext& ctx) {
    AttnDims d =
        attention_dims(ctx.node, ctx.input(0), ctx.input(1), ctx.input(2), optional_meta(ctx, 3));
    ctx.set_output(0, nnutil::low_precision_output(ctx.node, DType::Float32), {d.B, d.Tq, d.Co});
    if (ctx.num_outputs() > 1) ctx.set_output(1, DType::Float32, {d.B, d.H, d.Tq});
  };
  k.compute = [](KernelContext& ctx) {
    const TensorMeta* mm = nullptr;
    TensorMeta mask_meta;
    if (ctx.has_input(3)) {
      mask_meta = ctx.input(3).meta();
      mm = &mask_meta;
    }
    AttnDims d =
        attention_dims(ctx.node, ctx.input(0).meta(), ctx.input(1).meta(), ctx.input(2).meta(), mm);
    if (ctx.output(0).numel() == 0) return;
    Tensor& out = ctx.output(0);
    const bool o16 = out.dtype() == DType::BFloat16;
    if (d.Tk == 0) {  // no keys: empty sums
      if (o16)
        std::memset(out.raw(), 0, out.nbytes());
      else
        std::fill(out.data<float>(), out.data<float>() + out.numel(), 0.f);
      if (ctx.has_output(1)) {
        Tensor& l = ctx.output(1);
        std::fill(l.data<float>(), l.data<float>() + l.numel(), -INFINITY);
      }
      return;
    }
    float* lse = ctx.has_output(1) ? ctx.output(1).data<float>() : nullptr;
    auto drop = dropout_draw(ctx, d, false);
    thread_local QkvBuffer qb, kb, vb;
    const TileMode mode = tile_mode(ctx);
    attention_forward(d, mode, qkv_operand(ctx.input(0), mode, qb),
                      qkv_operand(ctx.input(1), mode, kb), qkv_operand(ctx.input(2), mode, vb),
                      mm ? ctx.input(3).data<float>() : nullptr, drop ? &*drop : nullptr,
                      o16 ? nullptr : out.data<float>(), o16 ? out.data<BFloat16>() : nullptr, lse);
  };
  return k;
}

// AttentionGrad(dO, Q, K, V, [mask], LSE) -> dQ, dK, dV
OpKernel make_attention_grad_kernel() {
  OpKernel k;
  k.infer = [](InferContext& ctx) {
    AttnDims d =
        attention_dims(ctx.node, ctx.input(1), ctx.input(2), ctx.input(3), optional_meta(ctx, 4));
    const TensorMeta& dO = ctx.input(0);
    const TensorMeta& lse = ctx.input(5);
    ONYX_CHECK(dO.dtype == DType::Float32 && dO.shape == Shape({d.B, d.Tq, d.Co}),
               ctx.node.describe(), ": dO ", shape_str(dO.shape),
               " must be float32 (B,Tq,H·Dv) = ", shape_str(Shape{d.B, d.Tq, d.Co}));
    ONYX_CHECK(lse.dtype == DType::Float32 && lse.shape == Shape({d.B, d.H, d.Tq}),
               ctx.node.describe(), ": LSE ", shape_str(lse.shape),
               " must be float32 (B,H,Tq) = ", shape_str(Shape{d.B, d.H, d.Tq}));
    ctx.set_output(0, DType::Float32, ctx.input(1).shape);
    if (ctx.num_outputs() > 1) ctx.set_output(1, DType::Float32, ctx.input(2).shape);
    if (ctx.num_outputs() > 2) ctx.set_output(2, DType::Float32, ctx.input(3).shape);
  };
  k.compute = [](KernelContext& ctx) {
    const TensorMeta* mm = nullptr;
    TensorMeta mask_meta;
    if (ctx.has_input(4)) {
      mask_meta = ctx.input(4).meta();
      mm = &mask_meta;
    }
    AttnDims d =
        attention_dims(ctx.node, ctx.input(1).meta(), ctx.input(2).meta(), ctx.input(3).meta(), mm);
    // Outputs the graph does not read still need somewhere to go.
    std::vector<float> spare[3];
    float* out[3];
    const Tensor* like[3] = {&ctx.input(1), &ctx.input(2), &ctx.input(3)};
    for (int i = 0; i < 3; i++) {
      if (ctx.has_output(i)) {
        out[i] = ctx.output(i).data<float>();
      } else {
        spare[i].resize((size_t)like[i]->numel());
        out[i] = spare[i].data();
      }
    }
    if (d.B * d.Tq == 0 || d.Tk == 0) {
      for (int i = 0; i < 3; i++) std::fill(out[i], out[i] + like[i]->numel(), 0.0f);
      return;
    }
    auto drop = dropout_draw(ctx, d, true);
    thread_local QkvBuffer qb, kb, vb;
    const TileMode mode = tile_mode(ctx);
    attention_backward(d, mode, ctx.input(0).data<float>(), qkv_operand(ctx.input(1), mode, qb),
                       qkv_operand(ctx.input(2), mode, kb), qkv_operand(ctx.input(3), mode, vb),
                       mm ? ctx.input(4).data<float>() : nullptr, ctx.input(5).data<float>(),
                       drop ? &*drop : nullptr, out[0], out[1], out[2]);
  };
  return k;
}

}  // namespace

ONYX_REGISTER_KERNELS(attention, Cpu) {
  using Metas = std::vector<const TensorMeta*>;
  OpTraits& fwd = r.add("onyx", "Attention", make_attention_kernel());
  fwd.precision = OpTraits::Precision::LowPrecision;
  fwd.flops = [](const ir::Node&, const Metas& in, const Metas&) {
    // Q (B,T,C), K (B,S,C): S = Q·Kᵀ and O = P·V, 2·B·T·S·C each
    return in[0] && in.size() > 1 && in[1] && in[0]->shape.size() == 3 && in[1]->shape.size() >= 2
               ? 4 * shape_product(in[0]->shape) * (double)in[1]->shape[1]
               : 0.0;
  };
  OpTraits& bwd = r.add("onyx", "AttentionGrad", make_attention_grad_kernel());
  bwd.precision = OpTraits::Precision::LowPrecision;
  bwd.flops = [](const ir::Node&, const Metas& in, const Metas&) {
    // S = Q·Kᵀ again (P is recomputed from the saved log-sum-exp), dP = dO·Vᵀ, dV = Pᵀ·dO,
    // dQ = dS·K, dK = dSᵀ·Q: five GEMMs of 2·B·T·S·C (causal masking skips none of the count)
    const TensorMeta* q = in.size() > 1 ? in[1] : nullptr;
    const TensorMeta* k = in.size() > 2 ? in[2] : nullptr;
    return q && k && q->shape.size() == 3 && k->shape.size() >= 2
               ? 10 * shape_product(q->shape) * (double)k->shape[1]
               : 0.0;
  };
}

}  // namespace onyx::kernels
