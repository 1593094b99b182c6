// kernels/cpu/simd/dropout.cc — the Philox dropout draw and its application (Dropout, DropoutGrad,
// onyx.DropoutAdd, the dropout inside onyx.Attention) for every SIMD path (see simd.h and
// kernels/cpu/dropout_rng.h for the draw's definition). Hand-written because the draw must be
// bit-identical to Philox4x32::generate on every path and cost far less than the GEMMs around it:
// eight Philox generators run in one vector (32x32->64 products through MulEven), and a
// 32-element group is masked and scaled in full vectors.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/simd/dropout.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/philox.h"
#include "kernels/cpu/simd/math-inl.h"
#include "kernels/cpu/simd/simd.h"

HWY_BEFORE_NAMESPACE();
namespace onyx::simd::HWY_NAMESPACE {

using kernels::Philox4x32;

// Philox for the N generators of counters c0 .. c0 + N - 1 of dropout group words u (generator l
// writes u[w * 8 + l] for its words w): N 32x32 -> 64-bit products per MulEven pair.
template <size_t N>
HWY_INLINE void PhiloxLanes(uint64_t ctr, uint32_t k0, uint32_t k1, uint32_t* HWY_RESTRICT u) {
  const hn::FixedTag<uint32_t, N> du;
  const hn::Repartition<uint64_t, decltype(du)> d64;
  using VU = hn::Vec<decltype(du)>;
  VU c0 = hn::Add(hn::Set(du, (uint32_t)ctr), hn::Iota(du, 0));
  VU c1 = hn::Set(du, (uint32_t)(ctr >> 32)), c2 = hn::Zero(du), c3 = hn::Zero(du);
  // The multipliers are broadcast in mulhilo: a capture by copy cannot hold SVE's sizeless vectors.
  // 32x32 -> 64-bit products of N lanes, split into high and low words.
  auto mulhilo = [&](VU a, uint32_t mul, VU& hi, VU& lo) {
    const VU m = hn::Set(du, mul);
    const VU pe = hn::BitCast(du, hn::MulEven(a, m));  // even lanes as (lo, hi) pairs
    const VU po =
        hn::BitCast(du, hn::MulEven(hn::BitCast(du, hn::ShiftRight<32>(hn::BitCast(d64, a))), m));
    lo = hn::OddEven(hn::BitCast(du, hn::ShiftLeft<32>(hn::BitCast(d64, po))), pe);
    hi = hn::OddEven(po, hn::BitCast(du, hn::ShiftRight<32>(hn::BitCast(d64, pe))));
  };
  for (int round = 0; round < 10; round++) {
    if (round > 0) {
      k0 += Philox4x32::kWeyl0;
      k1 += Philox4x32::kWeyl1;
    }
    VU hi0, lo0, hi1, lo1;
    mulhilo(c0, Philox4x32::kMul0, hi0, lo0);
    mulhilo(c2, Philox4x32::kMul1, hi1, lo1);
    const VU n0 = hn::Xor(hn::Xor(hi1, c1), hn::Set(du, k0));
    const VU n2 = hn::Xor(hn::Xor(hi0, c3), hn::Set(du, k1));
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
  }
  hn::StoreU(c0, du, u);
  hn::StoreU(c1, du, u + 8);
  hn::StoreU(c2, du, u + 16);
  hn::StoreU(c3, du, u + 24);
}

// The 32 words of dropout group `g` in element order: element j of the group takes word j / 8 of
// counter {lo32(8g + j % 8), hi32(8g + j % 8), 0, 0}. Eight generators in one vector where it holds
// eight words (x86), two vectors of four on the 128-bit paths (NEON, SVE, whose fixed-size vectors
// Highway caps at 128 bits), the scalar loop on Highway's scalar target.
HWY_INLINE void GroupWords(uint64_t g, uint32_t k0, uint32_t k1, uint32_t* HWY_RESTRICT u) {
#if HWY_TARGET == HWY_SCALAR
  for (int l = 0; l < 8; l++) {
    const Philox4x32::Counter c = Philox4x32::generate(
        {(uint32_t)(g * 8 + l), (uint32_t)((g * 8 + l) >> 32), 0, 0}, {k0, k1});
    for (int w = 0; w < 4; w++) u[w * 8 + l] = c[w];
  }
#elif HWY_TARGET == HWY_NEON || HWY_TARGET == HWY_EMU128 || ONYX_SIMD_SVE
  PhiloxLanes<4>(g * 8, k0, k1, u);
  PhiloxLanes<4>(g * 8 + 4, k0, k1, u + 4);
#else
  PhiloxLanes<8>(g * 8, k0, k1, u);
#endif
}

void PhiloxGroupWords(uint64_t g, uint32_t k0, uint32_t k1, uint32_t* u) {
  GroupWords(g, k0, k1, u);
}

// out[i] = (keep(e) ? x[i] * scale : 0) + (res ? res[i] : 0), mask[i] = keep(e), for elements
// e = e0 + i, i in [0, n). Whole groups of 32 in vectors, partial ones element by element.
void DropoutRange(uint32_t k0, uint32_t k1, uint32_t t24, float scale, int64_t e0, int64_t n,
                  const float* x, const float* res, float* out, bool* mask) {
  const DF d;
  const hn::RebindToSigned<DF> di;  // words >> 8 and t24 fit in 24 bits: signed compares
  const int64_t L = (int64_t)hn::Lanes(d);
  HWY_ALIGN uint32_t u[32];
  const VF vs = hn::Set(d, scale);
  const auto vt = hn::Set(di, (int32_t)t24);
  for (int64_t e = e0, end = e0 + n; e < end;) {
    const int64_t g = e / 32, gs = g * 32, ge = std::min(gs + 32, end);
    GroupWords((uint64_t)g, k0, k1, u);
    const int64_t i0 = e - e0;
    if (e == gs && ge == gs + 32 && L <= 32) {
      for (int64_t j = 0; j < 32; j += L) {
        const auto w24 =
            hn::BitCast(di, hn::ShiftRight<8>(hn::Load(hn::RebindToUnsigned<DF>(), u + j)));
        const auto drop = hn::RebindMask(d, hn::Gt(vt, w24));
        VF v = hn::IfThenZeroElse(drop, hn::Mul(hn::LoadU(d, x + i0 + j), vs));
        if (res) v = hn::Add(v, hn::LoadU(d, res + i0 + j));
        hn::StoreU(v, d, out + i0 + j);
      }
      if (mask)
        for (int64_t j = 0; j < 32; j++) mask[i0 + j] = (u[j] >> 8) >= t24;
    } else {
      for (int64_t i = e; i < ge; i++) {
        const bool keep = (u[i - gs] >> 8) >= t24;
        const int64_t k = i - e0;
        const float v = keep ? x[k] * scale : 0.0f;
        out[k] = res ? v + res[k] : v;
        if (mask) mask[k] = keep;
      }
    }
    e = ge;
  }
}

// dx = m ? dy * scale : 0 (DropoutGrad); vectorized by GCC at this target's width.
void DropoutGradMask(const bool* m, const float* dy, float* dx, float scale, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; i++) dx[i] = m[i] ? dy[i] * scale : 0.0f;
}

}  // namespace onyx::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace onyx::simd {
HWY_EXPORT(PhiloxGroupWords);
HWY_EXPORT(DropoutRange);
HWY_EXPORT(DropoutGradMask);
void philox_group_words(uint64_t group, uint32_t k0, uint32_t k1, uint32_t* u) {
  HWY_DYNAMIC_DISPATCH(PhiloxGroupWords)(group, k0, k1, u);
}
void dropout_range(uint32_t k0, uint32_t k1, uint32_t t24, float scale, int64_t e0, int64_t n,
                   const float* x, const float* res, float* out, bool* mask) {
  HWY_DYNAMIC_DISPATCH(DropoutRange)(k0, k1, t24, scale, e0, n, x, res, out, mask);
}
void dropout_grad_mask(const bool* m, const float* dy, float* dx, float scale, int64_t n) {
  HWY_DYNAMIC_DISPATCH(DropoutGradMask)(m, dy, dx, scale, n);
}
}  // namespace onyx::simd
#endif
