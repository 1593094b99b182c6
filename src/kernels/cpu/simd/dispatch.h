// kernels/cpu/simd/dispatch.h — which SIMD path the hand-written kernels run (AVX-512, AVX2 or
// portable on x86-64; NEON or portable on aarch64), chosen once at start-up from the CPU's
// features, or forced.
//
// The kernels in this directory are compiled once per path by Highway (foreach_target.h) and
// called through its dynamic dispatch tables; this file picks the table entry. ONYX_CPU (read at
// program start: auto | avx512 | avx2 | neon | portable) forces a path, so CI runs the kernel
// tables on every one; forcing a path the CPU lacks or the build has not compiled is an error at
// start-up.
#pragma once
#include <string>
#include <vector>

namespace onyx::simd {

// The paths compiled into this build, best first: "avx512", "avx2", "portable" (x86-64) or
// "neon", "portable" (aarch64).
std::vector<std::string> compiled_paths();
// The compiled paths this CPU can run.
std::vector<std::string> supported_paths();
// The path the kernels run now.
std::string chosen_path();
// Runs the kernels on `path` ("auto" = the best one this CPU supports). Throws onyx::Error naming
// the path when it is unknown or this CPU cannot run it. Not thread-safe against running kernels:
// call it before training (tests call it between cases).
void select_path(const std::string& path);
// Whether float32 -> bf16 conversions run on AVX512_BF16 (the CPU has it and the avx512 path is
// chosen; the other paths test the portable rounding).
bool native_bf16_conversions();
// The instruction set oneDNN runs (its own dispatch, capped by ONYX_CPU at start-up): "avx2",
// "avx512_core_bf16", ...
std::string onednn_isa();
// One line for `onyx --version`: the chosen path, the others, and how bf16 conversions run.
std::string describe();

}  // namespace onyx::simd
