// kernels/cpu/philox.h — Philox4x32-10, a counter-based random generator (Salmon et al., SC'11, the
// generator of Random123, cuRAND and PyTorch's CUDA RNG). Each 128-bit counter maps to four
// independent 32-bit words under a 64-bit key, so element i of a tensor draws from counter i/4 no
// matter which thread computes it: dropout masks depend only on (seed, element index), never on the
// thread count (DESIGN decision 10). Header-only because it is a dozen lines and must inline into
// kernel loops.
#pragma once
#include <immintrin.h>

#include <array>
#include <cstdint>

namespace onyx::runtime {

struct Philox4x32 {
  using Counter = std::array<uint32_t, 4>;
  using Key = std::array<uint32_t, 2>;

  static constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  static constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;

  // Ten rounds of the Philox S-P network.
  static Counter generate(Counter c, Key k) {
    for (int round = 0; round < 10; round++) {
      if (round > 0) {
        k[0] += kWeyl0;
        k[1] += kWeyl1;
      }
      uint64_t p0 = (uint64_t)kMul0 * c[0];
      uint64_t p1 = (uint64_t)kMul1 * c[2];
      uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
      uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
      c = {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
    }
    return c;
  }

  static Key key_from(uint64_t seed) { return {(uint32_t)seed, (uint32_t)(seed >> 32)}; }

  // The 4 words for block `block` of stream `stream` under `seed`.
  static Counter block(uint64_t seed, uint64_t block, uint64_t stream = 0) {
    return generate(
        {(uint32_t)block, (uint32_t)(block >> 32), (uint32_t)stream, (uint32_t)(stream >> 32)},
        key_from(seed));
  }

  // Eight generators at once (AVX2): lane l runs counter {lo32(ctr + l), hi32(ctr + l), stream, 0}
  // for ctr a multiple of 8; out[w] holds word w of the 8 lanes. Bit-identical to generate().
  static void generate8(uint64_t ctr, uint32_t stream, Key k, __m256i out[4]) {
    __m256i c0 = _mm256_add_epi32(_mm256_set1_epi32((int)(uint32_t)ctr),
                                  _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    __m256i c1 = _mm256_set1_epi32((int)(uint32_t)(ctr >> 32));
    __m256i c2 = _mm256_set1_epi32((int)stream), c3 = _mm256_setzero_si256();
    const __m256i m0 = _mm256_set1_epi32((int)kMul0), m1 = _mm256_set1_epi32((int)kMul1);
    for (int round = 0; round < 10; round++) {
      if (round > 0) {
        k[0] += kWeyl0;
        k[1] += kWeyl1;
      }
      __m256i hi0, lo0, hi1, lo1;
      mulhilo8(c0, m0, hi0, lo0);
      mulhilo8(c2, m1, hi1, lo1);
      __m256i k0 = _mm256_set1_epi32((int)k[0]), k1 = _mm256_set1_epi32((int)k[1]);
      __m256i n0 = _mm256_xor_si256(_mm256_xor_si256(hi1, c1), k0);
      __m256i n2 = _mm256_xor_si256(_mm256_xor_si256(hi0, c3), k1);
      c0 = n0;
      c1 = lo1;
      c2 = n2;
      c3 = lo0;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
  }

  // 32x32 -> 64-bit products of 8 lanes, split into high and low words.
  static void mulhilo8(__m256i a, __m256i m, __m256i& hi, __m256i& lo) {
    __m256i pe = _mm256_mul_epu32(a, m);                         // lanes 0,2,4,6
    __m256i po = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), m);  // lanes 1,3,5,7
    lo = _mm256_blend_epi32(pe, _mm256_slli_epi64(po, 32), 0xAA);
    hi = _mm256_blend_epi32(_mm256_srli_epi64(pe, 32), po, 0xAA);
  }

  // A 32-bit word as a uniform float in [0, 1) with 24 random bits.
  static float to_unit_float(uint32_t u) { return (float)(u >> 8) * (1.0f / 16777216.0f); }
};

// SplitMix64 finalizer: mixes seeds (run seed, node seed, node identity) into one 64-bit key.
inline uint64_t mix_seed(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace onyx::runtime
