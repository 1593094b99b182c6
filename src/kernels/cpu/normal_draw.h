// kernels/cpu/normal_draw.h — standard normal floats from Philox4x32-10 by Box–Muller: element
// pair (2k, 2k+1) from block k of stream `stream` under `key` (words 0 and 1 as two uniforms in
// (0, 1)), so a value depends only on (key, stream, index), never on the thread split.
// Header-only: shared by onyx.DrawNormal (kernels/random/draws.cc) and the diffusion sampler's
// starting and step noise (diffusion/sampler.cc).
#pragma once
#include <cmath>
#include <cstdint>

#include "kernels/cpu/philox.h"
#include "runtime/parallel.h"

namespace onyx::kernels {

inline void philox_normals(const Philox4x32::Key& key, uint32_t stream, float* out, int64_t n) {
  auto unit = [](uint32_t w) { return ((double)w + 0.5) * (1.0 / 4294967296.0); };
  runtime::parallel_for((n + 1) / 2, 4096, [&](int64_t b, int64_t e) {
    for (int64_t p = b; p < e; p++) {
      auto w = Philox4x32::generate({(uint32_t)p, (uint32_t)(p >> 32), stream, 0}, key);
      const double r = std::sqrt(-2.0 * std::log(unit(w[0])));
      const double a = 2.0 * M_PI * unit(w[1]);
      out[2 * p] = (float)(r * std::cos(a));
      if (2 * p + 1 < n) out[2 * p + 1] = (float)(r * std::sin(a));
    }
  });
}

}  // namespace onyx::kernels
