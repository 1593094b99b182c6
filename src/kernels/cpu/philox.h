// kernels/cpu/philox.h — Philox4x32-10, a counter-based random generator (Salmon et al., SC'11, the
// generator of Random123, cuRAND and PyTorch's CUDA RNG). Each 128-bit counter maps to four
// independent 32-bit words under a 64-bit key, so element i of a tensor draws from counter i/4 no
// matter which thread computes it: dropout masks depend only on (seed, element index), never on the
// thread count (DESIGN decision 10). Header-only because it is a dozen lines; the vector version
// (eight generators per call, every SIMD path) is kernels/cpu/simd/dropout.cc.
#pragma once
#include <array>
#include <cstdint>

namespace onyx::kernels {

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

// FNV-1a over n bytes, continuing from h: keys draws on data (a batch's pixels, a row's ids).
inline uint64_t fnv1a_bytes(uint64_t h, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}
inline constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ull;

}  // namespace onyx::kernels
