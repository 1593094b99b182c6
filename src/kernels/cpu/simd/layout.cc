// kernels/cpu/simd/layout.cc — data movement for every SIMD path (see simd.h): 8x8 transposes of
// 4-byte elements (Transpose and strided copies, kernels/shape/shape_common.cc) and float16 <->
// float32 and float32 -> bfloat16 conversion. Hand-written because GCC does not turn the blocked
// transpose into register shuffles, and conversions want the F16C instructions where the CPU has
// them. The AVX2 and AVX-512 paths share the 256-bit shuffle network (an 8x8 block is one register
// per row either way); the portable path copies element by element.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/simd/layout.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#if HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_AVX3
#include <immintrin.h>
#endif

#include <algorithm>

#include "kernels/cpu/simd/math-inl.h"
#include "kernels/cpu/simd/simd.h"
#include "onyx/dtype.h"

HWY_BEFORE_NAMESPACE();
namespace onyx::simd::HWY_NAMESPACE {

// One 8x8 block: d[p * ld + q] = s[p + q * ls] for p < pn, q < qn (bit copies).
HWY_INLINE void TransposeBlock(uint32_t* d, int64_t ld, const uint32_t* s, int64_t ls, int64_t pn,
                               int64_t qn) {
#if HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_AVX3
  if (pn == 8 && qn == 8) {
    __m256 r[8], t[8];
    for (int q = 0; q < 8; q++) r[q] = _mm256_loadu_ps((const float*)(s + q * ls));
    for (int i = 0; i < 4; i++) {
      t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
      t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 2; i++)
      for (int h = 0; h < 2; h++) {
        __m256 a = t[4 * i + h], b = t[4 * i + 2 + h];
        r[4 * i + 2 * h] = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(1, 0, 1, 0));
        r[4 * i + 2 * h + 1] = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 2, 3, 2));
      }
    // r[i] (i < 4): columns i | i+4 of rows 0-3; r[4+i]: the same of rows 4-7.
    for (int i = 0; i < 4; i++) {
      _mm256_storeu_ps((float*)(d + i * ld), _mm256_permute2f128_ps(r[i], r[4 + i], 0x20));
      _mm256_storeu_ps((float*)(d + (i + 4) * ld), _mm256_permute2f128_ps(r[i], r[4 + i], 0x31));
    }
    return;
  }
#endif
  for (int64_t q = 0; q < qn; q++)
    for (int64_t p = 0; p < pn; p++) d[p * ld + q] = s[p + q * ls];
}

// A strip of qn <= 8 columns: d[p * ld + q] = s[p + q * ls] for p < P, q < qn, in 8x8 blocks.
void TransposeStrip32(uint32_t* d, int64_t ld, const uint32_t* s, int64_t ls, int64_t P,
                      int64_t qn) {
  for (int64_t p0 = 0; p0 < P; p0 += 8)
    TransposeBlock(d + p0 * ld, ld, s + p0, ls, std::min<int64_t>(8, P - p0), qn);
}

// y[i] = convert(x[i]): full vectors through `vec` (F16C's conversions on the x86 paths), the
// tail and the portable path through onyx's scalar conversion `one`.
template <class From, class To, class Vec, class One>
HWY_INLINE void ConvertF16(const From* x, To* y, int64_t n, Vec vec, One one) {
  int64_t i = 0;
#if HWY_TARGET != HWY_SCALAR
  const int64_t L = (int64_t)hn::Lanes(DF());
  for (; i + L <= n; i += L) vec(x + i, y + i);
#endif
  for (; i < n; i++) y[i] = one(x[i]);
}

void F16ToF32(const uint16_t* x, float* y, int64_t n) {
  ConvertF16(
      x, y, n,
      [](const uint16_t* p, float* q) {
        const DF d;
        const hn::Rebind<hwy::float16_t, DF> dh;
        hn::StoreU(hn::PromoteTo(d, hn::LoadU(dh, (const hwy::float16_t*)p)), d, q);
      },
      half_to_float);
}

// Round to nearest even (the F16C conversion under the default rounding mode).
void F32ToF16(const float* x, uint16_t* y, int64_t n) {
  ConvertF16(
      x, y, n,
      [](const float* p, uint16_t* q) {
        const DF d;
        const hn::Rebind<hwy::float16_t, DF> dh;
        hn::StoreU(hn::DemoteTo(dh, hn::LoadU(d, p)), dh, (hwy::float16_t*)q);
      },
      float_to_half);
}

// float32 -> bf16 bits by onyx's scalar rule (float_to_bf16: round to nearest even on the bits, a
// NaN made quiet, denormals kept — Cast's semantics, so not AVX512_BF16's vcvtneps2bf16, which
// flushes them), in integer lanes: the same bits on every path.
void F32ToBF16(const float* x, uint16_t* y, int64_t n) {
  int64_t i = 0;
#if HWY_TARGET != HWY_SCALAR
  const DF d;
  const hn::RebindToUnsigned<DF> du;
  const hn::RebindToSigned<DF> di;
  const hn::Rebind<uint16_t, DF> d16;
  const int64_t L = (int64_t)hn::Lanes(d);
  const auto abs_mask = hn::Set(du, 0x7fffffffu);
  const auto inf = hn::Set(di, 0x7f800000);
  const auto half = hn::Set(du, 0x7fffu), one = hn::Set(du, 1u), quiet = hn::Set(du, 0x40u);
  for (; i + L <= n; i += L) {
    const auto u = hn::BitCast(du, hn::LoadU(d, x + i));
    const auto nan = hn::RebindMask(du, hn::Gt(hn::BitCast(di, hn::And(u, abs_mask)), inf));
    const auto hi = hn::ShiftRight<16>(u);
    const auto rounded = hn::ShiftRight<16>(hn::Add(u, hn::Add(half, hn::And(hi, one))));
    const auto r = hn::IfThenElse(nan, hn::Or(hi, quiet), rounded);  // <= 0xffff: no saturation
    hn::StoreU(hn::DemoteTo(d16, hn::BitCast(di, r)), d16, y + i);
  }
#endif
  for (; i < n; i++) y[i] = float_to_bf16(x[i]);
}

}  // namespace onyx::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace onyx::simd {
HWY_EXPORT(TransposeStrip32);
HWY_EXPORT(F16ToF32);
HWY_EXPORT(F32ToF16);
HWY_EXPORT(F32ToBF16);
void transpose_strip32(uint32_t* d, int64_t ld, const uint32_t* s, int64_t ls, int64_t P,
                       int64_t qn) {
  HWY_DYNAMIC_DISPATCH(TransposeStrip32)(d, ld, s, ls, P, qn);
}
void f16_to_f32(const uint16_t* x, float* y, int64_t n) { HWY_DYNAMIC_DISPATCH(F16ToF32)(x, y, n); }
void f32_to_f16(const float* x, uint16_t* y, int64_t n) { HWY_DYNAMIC_DISPATCH(F32ToF16)(x, y, n); }
void f32_to_bf16_bits(const float* x, uint16_t* y, int64_t n) {
  HWY_DYNAMIC_DISPATCH(F32ToBF16)(x, y, n);
}
}  // namespace onyx::simd
#endif
