// kernels/cpu/dropout_rng.h — the Dropout mask, for kernels that apply dropout inside a fused op
// (onyx.Attention's dropout on the probabilities, onyx.DropoutAdd). Hand-written, header-only: it
// is what the Dropout kernel (kernels/dropout/dropout.cc) draws too, so a fused op and the
// Dropout it replaces keep and drop the same elements for the same run seed (DESIGN decision 10):
//
//   key   = mix_seed(run_seed ^ mix_seed(node seed attr + 0x5eed) ^ fnv1a(rng key))
//           rng key: the Dropout's rng_key attribute, or its output name
//   word  of element e = Philox4x32(counter (e/32)*8 + e%8, key) word (e%32)/8
//   keep  e  iff  (word >> 8) >= ceil(ratio * 2^24);  kept values are multiplied by
//                 (float)(1 / (1 - ratio)), dropped ones are 0
//
// The mask depends only on (key, element index), so a backward can regenerate it instead of
// storing it, and any thread split draws the same bits.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "ir/graph.h"
#include "kernels/cpu/philox.h"
#include "kernels/cpu/simd/simd.h"

namespace onyx::kernels::dropout_rng {

inline uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// One Dropout's draw: the Philox key, the 24-bit threshold and the float scale of kept values.
struct Draw {
  Philox4x32::Key key{};
  uint32_t t24 = 0;
  float scale = 1.0f;
};

// `seed_attr` and `rng_key` as the Dropout node carries them (dropout/dropout.cc: the node's seed
// attribute and its rng_key attribute or output name); `run_seed` = KernelContext::seed.
inline Draw make_draw(uint64_t run_seed, int64_t seed_attr, const std::string& rng_key,
                      double ratio) {
  Draw d;
  uint64_t k = mix_seed(run_seed ^ mix_seed((uint64_t)seed_attr + 0x5eed) ^ fnv1a(rng_key));
  d.key = Philox4x32::key_from(k);
  d.t24 = (uint32_t)std::ceil(ratio * 16777216.0);
  d.scale = (float)(ratio >= 1 ? 0.0 : 1.0 / (1.0 - ratio));
  return d;
}

// x[j] = keep(e0 + j) ? x[j] * scale : 0 for j in [0, n): elements e0.. of the tensor the Dropout
// would have seen. One Philox call per 32-element group the range touches (simd/dropout.cc).
inline void apply_row(const Draw& d, int64_t e0, int64_t n, float* x) {
  if (n <= 0) return;
  simd::dropout_range(d.key[0], d.key[1], d.t24, d.scale, e0, n, x, nullptr, x, nullptr);
}

// The Dropout identity of a node carrying the fused dropout: its rng_key attribute, else its first
// output's name, else its name (as dropout/dropout.cc picks for Dropout itself).
inline std::string rng_key_of(const ir::Node& n) {
  if (n.has_attr("rng_key")) return n.attr_string("rng_key", "");
  return n.outputs.empty() ? n.name : n.outputs[0];
}

}  // namespace onyx::kernels::dropout_rng
