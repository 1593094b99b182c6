// bench_adamw.cc — one AdamW step over ~100M float32 parameters: the fused flat pass
// ("adamw_fused": vectorized, threaded) against the per-tensor scalar reference ("adamw"), and the
// global grad norm. The PyTorch side is bench/adamw_torch.py (same tensor sizes, same decay mask).
//
// AdamW moves 28 bytes per parameter per step (p, g, m, v read; p, m, v written), so the "GB/s"
// counter (SI gigabytes, printed as e.g. "14.2/s") compares directly with the memory-copy
// ceiling in shared/PERF.md; grad norm reads 4 bytes per parameter.
//   onyx_bench --benchmark_filter=adamw           # threads: /1 and /2 after the name
//   build/venv/bin/python bench/adamw_torch.py    # the torch numbers, same layout
#include <benchmark/benchmark.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/parallel.h"
#include "train/optimizer.h"

namespace {

using onyx::Shape;
using onyx::train::FlatBuffer;
using onyx::train::FlatLayout;

// A GPT-2-small-like stack (hidden 768, 8 blocks of 12 tensors) plus embeddings: 100 tensors of
// mixed sizes; the vocabulary is sized so the total is just under 100M parameters.
// bench/adamw_torch.py builds the same list: keep the two in step.
std::vector<std::pair<std::string, Shape>> bench_tensors() {
  const int64_t H = 768, layers = 8, positions = 1024, target = 100'000'000;
  std::vector<std::pair<std::string, Shape>> blocks;
  for (int64_t l = 0; l < layers; ++l) {
    std::string p = "h." + std::to_string(l) + ".";
    blocks.push_back({p + "ln_1.weight", {H}});
    blocks.push_back({p + "ln_1.bias", {H}});
    blocks.push_back({p + "attn.c_attn.weight", {H, 3 * H}});
    blocks.push_back({p + "attn.c_attn.bias", {3 * H}});
    blocks.push_back({p + "attn.c_proj.weight", {H, H}});
    blocks.push_back({p + "attn.c_proj.bias", {H}});
    blocks.push_back({p + "ln_2.weight", {H}});
    blocks.push_back({p + "ln_2.bias", {H}});
    blocks.push_back({p + "mlp.c_fc.weight", {H, 4 * H}});
    blocks.push_back({p + "mlp.c_fc.bias", {4 * H}});
    blocks.push_back({p + "mlp.c_proj.weight", {4 * H, H}});
    blocks.push_back({p + "mlp.c_proj.bias", {H}});
  }
  blocks.push_back({"ln_f.weight", {H}});
  blocks.push_back({"ln_f.bias", {H}});
  int64_t rest = positions * H;
  for (auto& [name, shape] : blocks) rest += onyx::shape_numel(shape);
  int64_t vocab = (target - rest) / H;
  std::vector<std::pair<std::string, Shape>> all = {{"wte.weight", {vocab, H}},
                                                    {"wpe.weight", {positions, H}}};
  all.insert(all.end(), blocks.begin(), blocks.end());
  return all;
}

struct Buffers {
  FlatLayout layout = FlatLayout::of(bench_tensors());
  FlatBuffer params{layout}, grads{layout};
  int64_t numel = 0;  // real parameters (layout.numel includes alignment padding)
  Buffers() {
    for (auto& e : layout.entries) numel += onyx::shape_numel(e.shape);
    // Cheap deterministic values (an LCG): params around +-0.05, grads around +-0.01.
    uint32_t s = 12345;
    for (auto& e : layout.entries) {
      float* p = params.view(e.name).data<float>();
      float* g = grads.view(e.name).data<float>();
      for (int64_t i = 0; i < onyx::shape_numel(e.shape); ++i) {
        s = s * 1664525u + 1013904223u;
        float u = (float)(s >> 8) * (1.0f / 16777216.0f) - 0.5f;
        p[i] = 0.1f * u;
        g[i] = 0.02f * u * (1 + (i & 3));
      }
    }
  }
};

Buffers& buffers() {
  static Buffers b;  // ~800 MB, built once, shared by the benchmarks below
  return b;
}

struct ScopedThreads {
  int saved = onyx::runtime::num_threads();
  explicit ScopedThreads(int n) { onyx::runtime::set_num_threads(n); }
  ~ScopedThreads() { onyx::runtime::set_num_threads(saved); }
};

void set_rates(benchmark::State& state, int64_t numel, double bytes_per_param) {
  state.counters["GB/s"] = benchmark::Counter(numel * bytes_per_param / 1e9,
                                              benchmark::Counter::kIsIterationInvariantRate);
  state.counters["params"] = (double)numel;
}

void BM_adamw(benchmark::State& state, const char* name) {
  Buffers& b = buffers();
  ScopedThreads threads((int)state.range(0));
  onyx::train::OptimizerConfig cfg;
  cfg.name = name;
  cfg.weight_decay = 0.01;
  auto opt =
      onyx::train::make_optimizer(cfg, b.layout, onyx::train::hf_decay_mask(b.layout, false));
  opt->step(b.params, b.grads, 1e-3);  // warm-up: first touch of the moment buffers
  for (auto _ : state) opt->step(b.params, b.grads, 1e-3);
  set_rates(state, b.numel, 28);
}

void BM_grad_norm(benchmark::State& state) {
  Buffers& b = buffers();
  ScopedThreads threads((int)state.range(0));
  double norm = 0;
  for (auto _ : state) benchmark::DoNotOptimize(norm = onyx::train::global_grad_norm(b.grads));
  set_rates(state, b.numel, 4);
}

BENCHMARK_CAPTURE(BM_adamw, adamw_fused, "adamw_fused")
    ->Arg(1)
    ->Arg(2)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MinTime(1.0);
BENCHMARK_CAPTURE(BM_adamw, adamw_reference, "adamw")
    ->Arg(1)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MinTime(1.0);
BENCHMARK(BM_grad_norm)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
