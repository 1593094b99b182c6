// kernels/cpu/simd/quant4.cc — bitsandbytes' 4-bit codes (quant/bnb4.h) dequantized into float32 or
// bf16 for onyx.MatMul4Bit's tiles (kernels/quant/matmul_4bit.cc), for every path of dispatch.h.
//
// Hand-written with each path's own table lookups (Highway 1.0.3 has no 16-bit lane permutes and
// no two-table lookups): a block's 16 values code[i] * scale are computed once as a vector, then
// every code of the block is a lane permute of that table —
//   avx512  bf16: vpermw (32 codes a step from 16 bytes), float32: vpermps (16 codes from 8 bytes);
//   avx2    vpermd over the table's two halves and a blend on the index's bit 3 (8 codes a step);
//   portable one byte at a time through the table.
// The values are bitsandbytes' code[index] * absmax, one float32 product each, and bf16 is that
// product rounded as kernels/cpu/gemm.h's f32_to_bf16 rounds GEMM inputs (nearest even, NaN quiet,
// denormals flushed to signed zero), so every path gives the bits the float32 dequantization
// followed by f32_to_bf16 gives.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/simd/quant4.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "kernels/cpu/simd/simd.h"
#include "onyx/dtype.h"

#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX2
#include <immintrin.h>
#endif

#ifndef ONYX_SIMD_QUANT4_ONCE
#define ONYX_SIMD_QUANT4_ONCE
namespace onyx::simd {
// f32_to_bf16's rule on one value: denormals flushed to signed zero, then nearest even.
inline uint16_t bf16_flushed(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  return (u & 0x7f800000u) == 0 ? (uint16_t)((u >> 16) & 0x8000) : float_to_bf16(v);
}
inline float code_of(const uint8_t* packed, int64_t e, const float* table) {
  const uint8_t byte = packed[e >> 1];
  return table[(e & 1) ? (byte & 0xF) : (byte >> 4)];
}
}  // namespace onyx::simd
#endif

HWY_BEFORE_NAMESPACE();
namespace onyx::simd::HWY_NAMESPACE {

// Elements [e, stop) of one block, one at a time, from its 16 scaled values.
void ScalarRun(const uint8_t* packed, const float* table, int64_t e, int64_t stop, float* out) {
  for (; e < stop; e++) *out++ = code_of(packed, e, table);
}
void ScalarRun(const uint8_t* packed, const float* table, int64_t e, int64_t stop, uint16_t* out) {
  for (; e < stop; e++) *out++ = bf16_flushed(code_of(packed, e, table));
}

#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX2
namespace hn = hwy::HWY_NAMESPACE;

// f32_to_bf16's rounding of the 16 (avx512) or 8 (avx2) floats at p, each result in the low 16
// bits of its 32-bit lane: denormals flushed to signed zero, NaN quiet, else nearest even.
template <class D>
auto Bf16Lanes(D d, const float* p) {
  const hn::RebindToUnsigned<D> du;
  const hn::RebindToSigned<D> di;
  const auto u = hn::BitCast(du, hn::LoadU(d, p));
  const auto exponent_zero = hn::Eq(hn::And(u, hn::Set(du, 0x7f800000u)), hn::Zero(du));
  const auto v = hn::IfThenElse(exponent_zero, hn::And(u, hn::Set(du, 0x80000000u)), u);
  const auto odd = hn::And(hn::ShiftRight<16>(v), hn::Set(du, 1u));
  const auto rounded = hn::ShiftRight<16>(hn::Add(v, hn::Add(odd, hn::Set(du, 0x7fffu))));
  const auto magnitude = hn::BitCast(di, hn::And(v, hn::Set(du, 0x7fffffffu)));
  const auto nan = hn::RebindMask(du, hn::Gt(magnitude, hn::Set(di, 0x7f800000)));
  return hn::IfThenElse(nan, hn::Or(hn::ShiftRight<16>(v), hn::Set(du, 0x40u)), rounded).raw;
}
#endif

#if HWY_TARGET == HWY_AVX3
// 16 codes from 8 bytes: each byte twice, shifted by 4 (the even element, high nibble) and by 0.
void RunF32(const uint8_t* packed, const float* table, int64_t e, int64_t stop, float* out) {
  const __m512 tbl = _mm512_loadu_ps(table);
  const __m512i shifts = _mm512_set_epi32(0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4);
  const __m512i nibble = _mm512_set1_epi32(0xF);
  for (; e + 16 <= stop; e += 16, out += 16) {
    const __m128i bytes = _mm_loadl_epi64((const __m128i*)(packed + (e >> 1)));
    const __m512i twice = _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(bytes, bytes));
    const __m512i idx = _mm512_and_si512(_mm512_srlv_epi32(twice, shifts), nibble);
    _mm512_storeu_ps(out, _mm512_permutexvar_ps(idx, tbl));
  }
  ScalarRun(packed, table, e, stop, out);
}

// 32 codes from 16 bytes: each byte's 32-bit lane holds its two indices as 16-bit lanes (high
// nibble first), looked up in the 16 bf16 values by one vpermw.
void RunBf16(const uint8_t* packed, const float* table, int64_t e, int64_t stop, uint16_t* out) {
  const __m512i tbl =
      _mm512_castsi256_si512(_mm512_cvtepi32_epi16(Bf16Lanes(hn::Full512<float>(), table)));
  const __m512i nibble = _mm512_set1_epi32(0xF);
  for (; e + 32 <= stop; e += 32, out += 32) {
    const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(packed + (e >> 1))));
    const __m512i idx = _mm512_or_si512(_mm512_srli_epi32(b, 4),
                                        _mm512_slli_epi32(_mm512_and_si512(b, nibble), 16));
    _mm512_storeu_si512((void*)out, _mm512_permutexvar_epi16(idx, tbl));
  }
  ScalarRun(packed, table, e, stop, out);
}

#elif HWY_TARGET == HWY_AVX2
// The indices of 8 codes from 4 bytes (each byte twice, shifted by 4 and by 0).
__m256i Indices8(const uint8_t* bytes) {
  int32_t word;
  std::memcpy(&word, bytes, 4);
  const __m128i b = _mm_cvtsi32_si128(word);
  const __m256i twice = _mm256_cvtepu8_epi32(_mm_unpacklo_epi8(b, b));
  const __m256i shifts = _mm256_set_epi32(0, 4, 0, 4, 0, 4, 0, 4);
  return _mm256_and_si256(_mm256_srlv_epi32(twice, shifts), _mm256_set1_epi32(0xF));
}

// Table lanes lo (indices 0-7) and hi (8-15) at idx: vpermd on each, index bit 3 picks.
__m256i Lookup16(__m256i lo, __m256i hi, __m256i idx) {
  const __m256 pick = _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28));
  return _mm256_castps_si256(
      _mm256_blendv_ps(_mm256_castsi256_ps(_mm256_permutevar8x32_epi32(lo, idx)),
                       _mm256_castsi256_ps(_mm256_permutevar8x32_epi32(hi, idx)), pick));
}

void RunF32(const uint8_t* packed, const float* table, int64_t e, int64_t stop, float* out) {
  const __m256i lo = _mm256_loadu_si256((const __m256i*)table);
  const __m256i hi = _mm256_loadu_si256((const __m256i*)(table + 8));
  for (; e + 8 <= stop; e += 8, out += 8)
    _mm256_storeu_si256((__m256i*)out, Lookup16(lo, hi, Indices8(packed + (e >> 1))));
  ScalarRun(packed, table, e, stop, out);
}

// 16 codes a step: two lookups of bf16 values held in 32-bit lanes, packed to 16 bits (packus
// interleaves the 128-bit halves; the 64-bit permute puts them back in order).
void RunBf16(const uint8_t* packed, const float* table, int64_t e, int64_t stop, uint16_t* out) {
  const __m256i lo = Bf16Lanes(hn::Full256<float>(), table);
  const __m256i hi = Bf16Lanes(hn::Full256<float>(), table + 8);
  for (; e + 16 <= stop; e += 16, out += 16) {
    const __m256i a = Lookup16(lo, hi, Indices8(packed + (e >> 1)));
    const __m256i b = Lookup16(lo, hi, Indices8(packed + (e >> 1) + 4));
    const __m256i packed16 = _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xD8);
    _mm256_storeu_si256((__m256i*)out, packed16);
  }
  ScalarRun(packed, table, e, stop, out);
}

#else
void RunF32(const uint8_t* packed, const float* table, int64_t e, int64_t stop, float* out) {
  ScalarRun(packed, table, e, stop, out);
}
void RunBf16(const uint8_t* packed, const float* table, int64_t e, int64_t stop, uint16_t* out) {
  ScalarRun(packed, table, e, stop, out);
}
#endif

// Elements [begin, begin + count), block by block: the block's 16 values, an odd first element
// alone (the vector steps start on a byte), then the block's run.
template <class T>
void Dequant4(const uint8_t* packed, const float* code, const float* scales, int64_t blocksize,
              int64_t begin, int64_t count, T* out) {
  HWY_ALIGN float table[16];
  const int64_t end = begin + count;
  for (int64_t e = begin; e < end; scales++) {
    const int64_t stop = std::min(end, (e / blocksize + 1) * blocksize);
    for (int i = 0; i < 16; i++) table[i] = code[i] * *scales;
    T* o = out + (e - begin);
    if (e & 1) ScalarRun(packed, table, e, e + 1, o++), e++;
    if constexpr (std::is_same_v<T, float>)
      RunF32(packed, table, e, stop, o);
    else
      RunBf16(packed, table, e, stop, o);
    e = stop;
  }
}
void Dequant4F32(const uint8_t* packed, const float* code, const float* scales, int64_t blocksize,
                 int64_t begin, int64_t count, float* out) {
  Dequant4(packed, code, scales, blocksize, begin, count, out);
}
void Dequant4Bf16(const uint8_t* packed, const float* code, const float* scales, int64_t blocksize,
                  int64_t begin, int64_t count, uint16_t* out) {
  Dequant4(packed, code, scales, blocksize, begin, count, out);
}

}  // namespace onyx::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace onyx::simd {
HWY_EXPORT(Dequant4F32);
HWY_EXPORT(Dequant4Bf16);
void dequant4_f32(const uint8_t* packed, const float* code, const float* scales, int64_t blocksize,
                  int64_t begin, int64_t count, float* out) {
  HWY_DYNAMIC_DISPATCH(Dequant4F32)(packed, code, scales, blocksize, begin, count, out);
}
void dequant4_bf16(const uint8_t* packed, const float* code, const float* scales, int64_t blocksize,
                   int64_t begin, int64_t count, uint16_t* out) {
  HWY_DYNAMIC_DISPATCH(Dequant4Bf16)(packed, code, scales, blocksize, begin, count, out);
}
}  // namespace onyx::simd
#endif
