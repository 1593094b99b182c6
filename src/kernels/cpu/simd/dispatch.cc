// kernels/cpu/simd/dispatch.cc — choosing the SIMD path (see dispatch.h).
// Highway (Debian libhwy-dev) builds each kernel file of this directory for AVX3 (AVX-512
// F/BW/DQ/VL), AVX2 (with FMA and F16C) and Highway's baseline (HWY_SCALAR or EMU128: portable
// C++; the build has no -march). We use Highway rather than GCC function
// multi-versioning because the kernels need one source for several vector widths (Highway's
// ops), and because Highway's tables can be re-pointed at run time, which is what lets CI force
// the AVX2 and portable paths on an AVX-512 machine. bf16 conversions are the exception: Highway
// 1.0.3 truncates f32 -> bf16, so kernels/cpu/gemm.cc keeps its own rounding conversion with an
// AVX512_BF16 path.
//
// oneDNN (the GEMMs and convolutions) dispatches on its own; ONYX_CPU caps it too, at start-up
// (oneDNN takes a cap only before its first primitive): avx2 at oneDNN's avx2, portable at its
// lowest JIT level (sse41), so a forced path runs what a CPU of that kind would, bf16 matmuls
// included (kernels::bf16_gemm_native() follows the chosen path). select_path() later in the
// process moves only the hand-written kernels.
#include "kernels/cpu/simd/dispatch.h"

#include <hwy/highway.h>
#include <hwy/targets.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <dnnl.hpp>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/simd/simd.h"
#include "onyx/error.h"

namespace onyx::simd {
namespace {

struct Path {
  const char* name;
  int64_t target;
};
// Best first. The portable path is Highway's baseline target, HWY_SCALAR with GCC < 12.3 (which
// Highway 1.0.3 treats as unable to build EMU128), else HWY_EMU128; the build has no -march, so it
// is always compiled.
constexpr int64_t kPortable = HWY_SCALAR | HWY_EMU128;
#if HWY_ARCH_X86
constexpr Path kPaths[] = {{"avx512", HWY_AVX3}, {"avx2", HWY_AVX2}, {"portable", kPortable}};
#else
// aarch64: SVE2 with 128-bit vectors (Neoverse N2 / V2), SVE with 256-bit ones (Neoverse V1),
// SVE2 and SVE at whatever length the CPU has, NEON (with AES, as Highway's NEON target needs),
// and the portable path.
constexpr Path kPaths[] = {{"sve2_128", HWY_SVE2_128}, {"sve_256", HWY_SVE_256},
                           {"sve2", HWY_SVE2},         {"sve", HWY_SVE},
                           {"neon", HWY_NEON},         {"portable", kPortable}};
#endif

// The targets this CPU runs, asked of Highway once, before any selection disables some.
int64_t cpu_targets() {
  static const int64_t cpu = [] {
    hwy::DisableTargets(0);
    return hwy::SupportedTargets();
  }();
  return cpu;
}

bool runs(const Path& p) {
  return (HWY_TARGETS & p.target) && (p.target == kPortable || (cpu_targets() & p.target));
}

std::atomic<bool> g_native_bf16{false};

// ONYX_CPU, applied before main() so every kernel call of the process sees one path.
struct SelectAtStartup {
  SelectAtStartup() {
    const char* env = std::getenv("ONYX_CPU");
    try {
      const std::string path = env && *env ? env : "auto";
      select_path(path);
      if (HWY_ARCH_X86 && (path == "avx2" || path == "portable")) {
        auto isa = path == "avx2" ? dnnl::cpu_isa::avx2 : dnnl::cpu_isa::sse41;
        if (dnnl::set_max_cpu_isa(isa) != dnnl::status::success)
          throw Error("oneDNN did not accept an instruction-set cap");
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr, "onyx: ONYX_CPU: %s\n", e.what());
      std::exit(2);
    }
  }
} g_select_at_startup;

}  // namespace

std::vector<std::string> compiled_paths() {
  std::vector<std::string> out;
  for (const Path& p : kPaths)
    if (HWY_TARGETS & p.target) out.push_back(p.name);
  return out;
}

std::vector<std::string> supported_paths() {
  std::vector<std::string> out;
  for (const Path& p : kPaths)
    if (runs(p)) out.push_back(p.name);
  return out;
}

std::string chosen_path() {
  // Asked of a dispatched function, so it names the code that actually runs.
  const int64_t t = dispatched_target();
  for (const Path& p : kPaths)
    if (t & p.target) return p.name;
  return hwy::TargetName(t);
}

void select_path(const std::string& path) {
  const Path* want = nullptr;
  for (const Path& p : kPaths)
    if (path == "auto" ? runs(p) : path == p.name) {
      want = &p;
      break;
    }
  if (!want) {
    std::string names = "auto";
    for (const Path& p : kPaths) names += cat(", ", p.name);
    throw Error(cat("unknown CPU path '", path, "' (expected ", names, ")"));
  }
  if (!(HWY_TARGETS & want->target))
    throw Error(cat("CPU path '", want->name, "' is not compiled into this build"));
  if (!runs(*want))
    throw Error(cat("CPU path '", want->name, "' needs instructions this CPU does not have"));
  // Highway numbers better targets with lower bits: disabling every bit below the wanted
  // target's lowest one leaves it the best target enabled.
  const int64_t lowest = want->target & -want->target;
  hwy::DisableTargets(lowest - 1);
  hwy::GetChosenTarget().Update(hwy::SupportedTargets());
  g_native_bf16 = want->target == HWY_AVX3 && kernels::cpu_has_avx512_bf16();
}

bool native_bf16_conversions() { return g_native_bf16; }

std::string onednn_isa() {
  if (!HWY_ARCH_X86) return "aarch64";  // oneDNN's aarch64 levels are not in its public enum
  using I = dnnl::cpu_isa;
  switch (dnnl::get_effective_cpu_isa()) {
    case I::sse41:
      return "sse41";
    case I::avx:
      return "avx";
    case I::avx2:
      return "avx2";
    case I::avx2_vnni:
      return "avx2_vnni";
    case I::avx512_mic:
    case I::avx512_mic_4ops:
      return "avx512_mic";
    case I::avx512_core:
      return "avx512_core";
    case I::avx512_core_vnni:
      return "avx512_core_vnni";
    case I::avx512_core_bf16:
      return "avx512_core_bf16";
    case I::avx512_core_amx:
      return "avx512_core_amx";
    default:
      return "all";
  }
}

std::string describe() {
  std::string s = "cpu path " + chosen_path() + " (compiled:";
  for (const std::string& p : compiled_paths()) s += " " + p;
  s += "; this CPU:";
  for (const std::string& p : supported_paths()) s += " " + p;
  s += std::string("); bf16 conversions ") +
       (native_bf16_conversions() ? "avx512_bf16" : "portable rounding") + "; GEMMs oneDNN " +
       onednn_isa();
  return s;
}

}  // namespace onyx::simd
