// bench_kernels.cc — microbenchmarks of onyx's CPU kernels, GEMM backends side by side.
//
// Each GEMM shape runs under every backend of kernels/cpu/gemm.h in the same process, so the
// ratios are comparable even on a noisy shared machine. The "GFLOPS" column is a rate counter:
// Google Benchmark prints it as FLOP/s with SI prefixes (e.g. 97.3G/s = 97.3 GFLOP/s).
//   onyx_bench --benchmark_filter=sgemm      # only the GEMM table
//   OMP_NUM_THREADS=1 onyx_bench ...         # single-thread ceilings
#include <benchmark/benchmark.h>

#include <array>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/small_gemm_bf16.h"
#include "quant/bnb4.h"
#include "quant/store_4bit.h"
#include "runtime/parallel.h"
#include "runtime/session.h"

namespace {

using onyx::kernels::GemmBackend;

std::vector<float> random_vec(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

// random_vec's values rounded to bf16 bits.
std::vector<uint16_t> random_bf16(size_t n, uint32_t seed) {
  std::vector<uint16_t> v(n);
  onyx::kernels::f32_to_bf16(random_vec(n, seed).data(), v.data(), (int64_t)n);
  return v;
}

void set_flops(benchmark::State& state, double flops_per_iter) {
  state.counters["GFLOPS"] = benchmark::Counter(
      flops_per_iter, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}

const GemmBackend kBackends[] = {GemmBackend::OneDNN, GemmBackend::OneDNNMatmul,
                                 GemmBackend::OpenBLAS};

// C(M,N) = A(M,K) · op(B): op(B) = B^T (stored (N,K)) when transB, as PyTorch's Linear exports.
void bm_sgemm(benchmark::State& state, GemmBackend be, int64_t M, int64_t N, int64_t K,
              bool transB) {
  onyx::kernels::set_gemm_backend(be);
  auto a = random_vec(M * K, 1), b = random_vec(K * N, 2);
  std::vector<float> c(M * N);
  for (auto _ : state) {
    onyx::kernels::sgemm(false, transB, M, N, K, 1.f, a.data(), K, b.data(), transB ? K : N, 0.f,
                         c.data(), N);
    benchmark::DoNotOptimize(c.data());
  }
  set_flops(state, 2.0 * M * N * K);
}

// The GEMM ceilings bench/llama_bench.py reports next to its model numbers: float32 sgemm and the
// bf16 path of a frozen bf16 weight (gemm_f32_bf16: A rounded per call, B bf16, float32 out), on
// the MLP's 512×768 · 768×2048 with the weight transposed, as the linear layers read it; and
// bf16_prepacked: the same with the weight declared stable (kernels::declare_stable_weights, as
// a training step's shadow is), read from oneDNN's packed layout (on CPUs with AVX512_BF16; others
// have no bf16 matmul to pack for and run the widened path either way).
void bm_gemm_ceiling(benchmark::State& state, bool bf16, bool prepacked = false) {
  const int64_t M = 512, N = 2048, K = 768;
  onyx::kernels::set_gemm_backend(GemmBackend::OneDNN);
  auto a = random_vec(M * K, 1), b = random_vec(N * K, 2);
  std::vector<uint16_t> b16(b.size());
  onyx::kernels::f32_to_bf16(b.data(), b16.data(), (int64_t)b.size());
  std::vector<float> c(M * N);
  if (prepacked)
    onyx::kernels::declare_stable_weights(b16.data(), b16.size() * 2,
                                          onyx::kernels::new_weights_version());
  for (auto _ : state) {
    if (bf16)
      onyx::kernels::gemm_f32_bf16(true, M, N, K, 1.f, a.data(), K, b16.data(), K, 0.f, c.data(),
                                   N);
    else
      onyx::kernels::sgemm(false, true, M, N, K, 1.f, a.data(), K, b.data(), K, 0.f, c.data(), N);
    benchmark::DoNotOptimize(c.data());
  }
  if (prepacked) onyx::kernels::forget_stable_weights(b16.data(), b16.size() * 2);
  set_flops(state, 2.0 * M * N * K);
}

// The attention kernel's tile products at bert-mini's shape (64 query rows, Tk = 128 keys,
// D = 64, heads read in place with leading dimension C = 256), single-threaded as the kernel runs
// them, float32 sgemm or bf16 operands (gemm_bf16): whether bf16 tiles pay. which = 0
// S = Q·Kᵀ (64,128), 1 O = P·V (64,64), 2 dV += Pᵀ·dO (128,64). f32_primitive: float32 through
// the cached oneDNN matmul primitive (ONYX_GEMM=onednn_matmul), the per-call path gemm_bf16 takes
// natively — against f32 it shows that path's call overhead on any CPU.
void bm_attention_tile(benchmark::State& state, int which, bool bf16, bool primitive = false) {
  const int64_t R = 64, T = 128, D = 64, C = 256;
  onyx::kernels::set_gemm_backend(primitive ? GemmBackend::OneDNNMatmul : GemmBackend::OneDNN);
  const int threads = onyx::runtime::num_threads();
  onyx::runtime::set_num_threads(1);
  auto q = random_vec(T * C, 1), k = random_vec(T * C, 2), p = random_vec(R * T, 3);
  std::vector<uint16_t> q16(q.size()), k16(k.size()), p16(p.size());
  onyx::kernels::f32_to_bf16(q.data(), q16.data(), (int64_t)q.size());
  onyx::kernels::f32_to_bf16(k.data(), k16.data(), (int64_t)k.size());
  onyx::kernels::f32_to_bf16(p.data(), p16.data(), (int64_t)p.size());
  std::vector<float> out(T * T);
  using onyx::kernels::gemm_bf16;
  using onyx::kernels::sgemm;
  for (auto _ : state) {
    if (which == 0) {
      if (bf16)
        gemm_bf16(false, true, R, T, D, 1.f, q16.data(), C, k16.data(), C, 0.f, out.data(), T);
      else
        sgemm(false, true, R, T, D, 1.f, q.data(), C, k.data(), C, 0.f, out.data(), T);
    } else if (which == 1) {
      if (bf16)
        gemm_bf16(false, false, R, D, T, 1.f, p16.data(), T, k16.data(), C, 0.f, out.data(), D);
      else
        sgemm(false, false, R, D, T, 1.f, p.data(), T, k.data(), C, 0.f, out.data(), D);
    } else {
      if (bf16)
        gemm_bf16(true, false, T, D, R, 1.f, p16.data(), T, q16.data(), C, 1.f, out.data(), D);
      else
        sgemm(true, false, T, D, R, 1.f, p.data(), T, q.data(), C, 1.f, out.data(), D);
    }
    benchmark::DoNotOptimize(out.data());
  }
  onyx::runtime::set_num_threads(threads);
  onyx::kernels::set_gemm_backend(GemmBackend::OneDNN);
  set_flops(state, 2.0 * R * T * D);
}

// LinearCrossEntropy's per-chunk products at gpt2-small's tied head (V = 50257, C = 768, r chunk
// rows), float32 or bf16 operands, single-threaded as the kernel runs them (one row range per
// thread): which = 0 logits (r,V) = H·Wᵀ, 1 dH (r,C) = Z·W, 2 dW (V,C) += Zᵀ·H.
void bm_lce_chunk(benchmark::State& state, int which, int64_t r, bool bf16) {
  const int64_t V = 50257, C = 768;
  onyx::kernels::set_gemm_backend(GemmBackend::OneDNN);
  const int threads = onyx::runtime::num_threads();
  onyx::runtime::set_num_threads(1);
  auto w = random_vec(V * C, 1), h = random_vec(r * C, 2), z = random_vec(r * V, 3);
  std::vector<uint16_t> w16(w.size()), h16(h.size()), z16(z.size());
  onyx::kernels::f32_to_bf16(w.data(), w16.data(), (int64_t)w.size());
  onyx::kernels::f32_to_bf16(h.data(), h16.data(), (int64_t)h.size());
  onyx::kernels::f32_to_bf16(z.data(), z16.data(), (int64_t)z.size());
  std::vector<float> out(which == 0 ? r * V : which == 1 ? r * C : V * C);  // 2, 3: V*C
  using onyx::kernels::Bf16Operand;
  for (auto _ : state) {
    if (which == 0 && bf16)
      onyx::kernels::gemm_mixed_bf16(false, true, r, V, C, 1.f, Bf16Operand{nullptr, h16.data()}, C,
                                     Bf16Operand{nullptr, w16.data()}, C, 0.f, out.data(), V);
    else if (which == 0)
      onyx::kernels::sgemm(false, true, r, V, C, 1.f, h.data(), C, w.data(), C, 0.f, out.data(), V);
    else if (which == 1 && bf16)
      onyx::kernels::gemm_mixed_bf16(false, false, r, C, V, 1.f, Bf16Operand{nullptr, z16.data()},
                                     V, Bf16Operand{nullptr, w16.data()}, C, 0.f, out.data(), C);
    else if (which == 1)
      onyx::kernels::sgemm(false, false, r, C, V, 1.f, z.data(), V, w.data(), C, 0.f, out.data(),
                           C);
    else if (which == 2 && bf16)
      onyx::kernels::gemm_mixed_bf16(true, false, V, C, r, 1.f, Bf16Operand{nullptr, z16.data()}, V,
                                     Bf16Operand{nullptr, h16.data()}, C, 1.f, out.data(), C);
    else if (which == 2)
      onyx::kernels::sgemm(true, false, V, C, r, 1.f, z.data(), V, h.data(), C, 1.f, out.data(), C);
    else if (bf16)  // 3: dWᵀ (C,V) += Hᵀ·Z
      onyx::kernels::gemm_mixed_bf16(true, false, C, V, r, 1.f, Bf16Operand{nullptr, h16.data()}, C,
                                     Bf16Operand{nullptr, z16.data()}, V, 1.f, out.data(), V);
    else
      onyx::kernels::sgemm(true, false, C, V, r, 1.f, h.data(), C, z.data(), V, 1.f, out.data(), V);
    benchmark::DoNotOptimize(out.data());
  }
  onyx::runtime::set_num_threads(threads);
  set_flops(state, 2.0 * r * V * C);
}

// Attention-like batch: scores(b) = Q(b)(T,d) · K(b)^T, b over batch·heads.
void bm_sgemm_batched(benchmark::State& state, GemmBackend be, int64_t batch, int64_t M, int64_t N,
                      int64_t K, bool transB) {
  onyx::kernels::set_gemm_backend(be);
  auto a = random_vec(batch * M * K, 1), b = random_vec(batch * K * N, 2);
  std::vector<float> c(batch * M * N);
  for (auto _ : state) {
    onyx::kernels::sgemm_strided_batched(false, transB, M, N, K, 1.f, a.data(), K, M * K, b.data(),
                                         transB ? K : N, K * N, 0.f, c.data(), N, M * N, batch);
    benchmark::DoNotOptimize(c.data());
  }
  set_flops(state, 2.0 * batch * M * N * K);
}

// The same batch as independent single-threaded GEMMs spread over the pool by onyx's parallel_for
// (the alternative to one batched oneDNN primitive).
void bm_sgemm_batched_parallel_for(benchmark::State& state, GemmBackend be, int64_t batch,
                                   int64_t M, int64_t N, int64_t K, bool transB) {
  onyx::kernels::set_gemm_backend(be);
  auto a = random_vec(batch * M * K, 1), b = random_vec(batch * K * N, 2);
  std::vector<float> c(batch * M * N);
  for (auto _ : state) {
    onyx::runtime::parallel_for(batch, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t i = b0; i < b1; i++)
        onyx::kernels::sgemm(false, transB, M, N, K, 1.f, a.data() + i * M * K, K,
                             b.data() + i * K * N, transB ? K : N, 0.f, c.data() + i * M * N, N);
    });
    benchmark::DoNotOptimize(c.data());
  }
  set_flops(state, 2.0 * batch * M * N * K);
}

// A GEMM followed by an OpenMP elementwise pass over its output (GELU-like), as a transformer
// alternates them: shows whether the BLAS pool and the OpenMP pool get in each other's way.
void bm_sgemm_then_elementwise(benchmark::State& state, GemmBackend be, int64_t M, int64_t N,
                               int64_t K) {
  onyx::kernels::set_gemm_backend(be);
  auto a = random_vec(M * K, 1), b = random_vec(K * N, 2);
  std::vector<float> c(M * N), d(M * N);
  for (auto _ : state) {
    onyx::kernels::sgemm(false, false, M, N, K, 1.f, a.data(), K, b.data(), N, 0.f, c.data(), N);
    onyx::runtime::parallel_for(M * N, 1 << 14, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; i++) d[i] = c[i] / (1.f + std::exp(-1.702f * c[i]));
    });
    benchmark::DoNotOptimize(d.data());
  }
  set_flops(state, 2.0 * M * N * K);
}

// MatMul node through the kernel registry: (B,T,C) x (C,N) broadcast weight → one GEMM.
void bm_matmul_node(benchmark::State& state, int64_t B, int64_t T, int64_t C, int64_t N) {
  onyx::kernels::set_gemm_backend(GemmBackend::OneDNN);
  onyx::ir::Node node;
  node.op_type = "MatMul";
  node.inputs = {"a", "b"};
  node.outputs = {"y"};
  auto x = onyx::Tensor::from_vector(onyx::DType::Float32, {B, T, C}, random_vec(B * T * C, 1));
  auto w = onyx::Tensor::from_vector(onyx::DType::Float32, {C, N}, random_vec(C * N, 2));
  for (auto _ : state) {
    auto out = onyx::runtime::run_node(node, 17, {x, w});
    benchmark::DoNotOptimize(out[0].raw());
  }
  set_flops(state, 2.0 * B * T * C * N);
}

// QLoRA's linear layers at Llama-3.2-1B's MLP (W (N, K) NF4 with double quantization, X 512 rows,
// bf16 compute): onyx.MatMul4Bit (transB 1: the forward, 0: dX), against the same product on the
// weight held bf16 and declared stable (prepacked, as the bf16 base's shadow is: the ceiling
// the 4-bit kernel's dequantization and tiling pay against).
void bm_matmul_4bit(benchmark::State& state, int64_t N, int64_t K, bool transB, bool bf16_base) {
  onyx::kernels::set_gemm_backend(GemmBackend::OneDNN);
  const int64_t M = 512, in = transB ? K : N, out = transB ? N : K;
  auto w = random_vec(N * K, 2);
  for (auto& v : w) v *= 0.05f;
  auto x = onyx::Tensor::from_vector(onyx::DType::Float32, {1, M, in}, random_vec(M * in, 1));
  std::vector<float> y(M * out);
  if (bf16_base) {
    std::vector<uint16_t> w16(w.size());
    onyx::kernels::f32_to_bf16(w.data(), w16.data(), (int64_t)w.size());
    onyx::kernels::declare_stable_weights(w16.data(), w16.size() * 2,
                                          onyx::kernels::new_weights_version());
    for (auto _ : state) {
      onyx::kernels::gemm_mixed_bf16(
          false, transB, M, out, in, 1.f, onyx::kernels::Bf16Operand{x.data<float>(), nullptr}, in,
          onyx::kernels::Bf16Operand{nullptr, w16.data()}, K, 0.f, y.data(), out);
      benchmark::DoNotOptimize(y.data());
    }
    onyx::kernels::forget_stable_weights(w16.data(), w16.size() * 2);
  } else {
    onyx::ir::Graph g;
    g.add_initializer("W", onyx::Tensor::from_vector(onyx::DType::Float32, {N, K}, w));
    const auto q =
        onyx::quant::quantize_4bit(w.data(), {N, K}, onyx::quant::Code4::Nf4, 64, true, "W");
    onyx::quant::store_initializer_4bit(g, "W", q, "bfloat16");
    onyx::ir::Node n = g.nodes[0];
    n.op_type = "MatMul4Bit";
    n.inputs.insert(n.inputs.begin(), "X");
    n.attrs["transB"] = onyx::ir::Attribute::of_int(transB);
    std::vector<onyx::Tensor> args = {x};
    for (size_t i = 1; i < n.inputs.size(); i++) args.push_back(g.initializers.at(n.inputs[i]));
    for (auto _ : state) {
      auto r = onyx::runtime::run_node(n, 1, args);
      benchmark::DoNotOptimize(r[0].raw());
    }
  }
  set_flops(state, 2.0 * M * N * K);
}

// Conv node (NCHW), e.g. a ViT patch embedding or a ResNet 3x3 layer; bf16: as mixed precision
// runs it (RunOptions::bf16_gemm: operands rounded to bf16, float32 accumulation).
void bm_conv_node(benchmark::State& state, int64_t N, int64_t C, int64_t H, int64_t M, int64_t k,
                  int64_t stride, int64_t pad, bool bf16) {
  onyx::ir::Node node;
  node.op_type = "Conv";
  node.inputs = {"x", "w"};
  node.outputs = {"y"};
  onyx::ir::Attribute s;
  s.kind = onyx::ir::Attribute::Kind::Ints;
  s.ints = {stride, stride};
  node.attrs["strides"] = s;
  onyx::ir::Attribute p;
  p.kind = onyx::ir::Attribute::Kind::Ints;
  p.ints = {pad, pad, pad, pad};
  node.attrs["pads"] = p;
  auto x =
      onyx::Tensor::from_vector(onyx::DType::Float32, {N, C, H, H}, random_vec(N * C * H * H, 1));
  auto w =
      onyx::Tensor::from_vector(onyx::DType::Float32, {M, C, k, k}, random_vec(M * C * k * k, 2));
  int64_t OH = (H + 2 * pad - k) / stride + 1;
  onyx::runtime::RunOptions opts;
  opts.bf16_gemm = bf16;
  for (auto _ : state) {
    auto out = onyx::runtime::run_node(node, 17, {x, w}, opts);
    benchmark::DoNotOptimize(out[0].raw());
  }
  set_flops(state, 2.0 * N * M * OH * OH * C * k * k);
}

// A weight gradient's bf16 GEMM, dW (K,N) = Xᵀ · dY with X (R,K) and dY (R,N) row-major (as
// onyx.MatMulGradB reads them, transA) — or, with `transposed_copy`, the same product from a
// copy of X stored transposed (K,R) (not counting the copy): what reading X transposed costs.
void bm_grad_b_bf16(benchmark::State& state, int64_t R, int64_t K, int64_t N,
                    bool transposed_copy) {
  onyx::kernels::set_gemm_backend(GemmBackend::OneDNN);
  std::vector<uint16_t> x = random_bf16(R * K, 1), dy = random_bf16(R * N, 2), xt(R * K);
  for (int64_t r = 0; r < R; r++)
    for (int64_t k = 0; k < K; k++) xt[k * R + r] = x[r * K + k];
  std::vector<float> c(K * N);
  for (auto _ : state) {
    if (transposed_copy)
      onyx::kernels::gemm_bf16(false, false, K, N, R, 1.f, xt.data(), R, dy.data(), N, 0.f,
                               c.data(), N);
    else
      onyx::kernels::gemm_bf16(true, false, K, N, R, 1.f, x.data(), K, dy.data(), N, 0.f, c.data(),
                               N);
    benchmark::DoNotOptimize(c.data());
  }
  set_flops(state, 2.0 * R * K * N);
}

// The float32 weight gradient dW (K,N) = Xᵀ · dY (onyx.MatMulGradB: X (R,K) read transposed;
// kernels::sgemm splits the rows of the small outputs, gemm.cc), or with `transposed_copy` the
// same product as oneDNN's NN sgemm after copying X transposed (K,R) — the copy timed.
void bm_grad_b_f32(benchmark::State& state, int64_t R, int64_t K, int64_t N, bool transposed_copy) {
  onyx::kernels::set_gemm_backend(GemmBackend::OneDNN);
  std::vector<float> x = random_vec(R * K, 1), dy = random_vec(R * N, 2), xt(R * K), c(K * N);
  for (auto _ : state) {
    if (transposed_copy) {
      onyx::runtime::parallel_for(K / 16, 1, [&](int64_t k0, int64_t k1) {
        for (int64_t r0 = 0; r0 < R; r0 += 64)
          for (int64_t k = k0 * 16; k < k1 * 16; k++)
            for (int64_t r = r0; r < std::min(R, r0 + 64); r++) xt[k * R + r] = x[r * K + k];
      });
      onyx::kernels::sgemm(false, false, K, N, R, 1.f, xt.data(), R, dy.data(), N, 0.f, c.data(),
                           N);
    } else {
      onyx::kernels::sgemm(true, false, K, N, R, 1.f, x.data(), K, dy.data(), N, 0.f, c.data(), N);
    }
    benchmark::DoNotOptimize(c.data());
  }
  set_flops(state, 2.0 * R * K * N);
}

// A linear layer's bf16 forward, Y (M,N) = X (M,K) · Wᵀ + bias with X and W bf16 (W declared
// stable: read prepacked, as in training) and Y bf16: in one oneDNN primitive whose epilogue adds
// the bias and rounds (kernels::linear_mixed_bf16), or `separate`: the bias rows written first,
// the float32 product accumulated onto them, then a rounding pass (what MatMulT did before).
void bm_linear_bf16(benchmark::State& state, int64_t M, int64_t N, int64_t K, bool separate) {
  onyx::kernels::set_gemm_backend(GemmBackend::OneDNN);
  std::vector<uint16_t> x = random_bf16(M * K, 1), w = random_bf16(N * K, 2), y(M * N);
  std::vector<float> bias = random_vec(N, 3), y32(M * N);
  onyx::kernels::declare_stable_weights(w.data(), w.size() * 2,
                                        onyx::kernels::new_weights_version());
  for (auto _ : state) {
    if (separate) {
      onyx::runtime::parallel_for(M, 16, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; r++) std::copy(bias.begin(), bias.end(), &y32[r * N]);
      });
      onyx::kernels::gemm_mixed_bf16(false, true, M, N, K, 1.f, {nullptr, x.data()}, K,
                                     {nullptr, w.data()}, K, 1.f, y32.data(), N);
      onyx::kernels::f32_to_bf16(y32.data(), y.data(), M * N);
    } else {
      onyx::kernels::LinearOut out;
      out.bf16 = y.data();
      out.bias = bias.data();
      onyx::kernels::linear_mixed_bf16(true, M, N, K, 1.f, {nullptr, x.data()}, K,
                                       {nullptr, w.data()}, K, out);
    }
    benchmark::DoNotOptimize(y.data());
  }
  onyx::kernels::forget_stable_weights(w.data(), w.size() * 2);
  set_flops(state, 2.0 * M * N * K);
}

// One attention tile product in bf16, single-threaded as the attention kernel runs it, by
// oneDNN's matmul (gemm_bf16) or by the hand-written small_gemm_bf16 (path: its default, AMX where
// the CPU has it; or forced onto vdpbf16ps): C (M,N) = op(A) · op(B) over K, operands in their own
// contiguous buffers.
enum class TilePath { OneDnn, Small, SmallVdpbf16ps };
// heads > 1: A and B read in place from rows `heads` times wider, as attention reads a head's Q,
// K and V out of (B, T, heads·D).
void bm_tile_bf16(benchmark::State& state, int64_t M, int64_t N, int64_t K, bool ta, bool tb,
                  TilePath path, int64_t heads) {
  const bool small = path != TilePath::OneDnn;
  if (small && !onyx::kernels::small_gemm_bf16_supported()) {
    state.SkipWithError("no AVX512_BF16");
    return;
  }
  if (path == TilePath::SmallVdpbf16ps) onyx::kernels::force_small_gemm_bf16_amx(0);
  const int threads = onyx::runtime::num_threads();
  onyx::runtime::set_num_threads(1);
  std::vector<uint16_t> a = random_bf16(M * K * heads, 1), b = random_bf16(K * N * heads, 2);
  std::vector<float> c(M * N);
  const int64_t lda = (ta ? M : K) * heads, ldb = (tb ? K : N) * heads;
  for (auto _ : state) {
    if (small)
      onyx::kernels::small_gemm_bf16(ta, tb, M, N, K, 1.f, a.data(), lda, b.data(), ldb, 0.f,
                                     c.data(), N);
    else
      onyx::kernels::gemm_bf16(ta, tb, M, N, K, 1.f, a.data(), lda, b.data(), ldb, 0.f, c.data(),
                               N);
    benchmark::DoNotOptimize(c.data());
  }
  onyx::runtime::set_num_threads(threads);
  onyx::kernels::force_small_gemm_bf16_amx(-1);
  set_flops(state, 2.0 * M * N * K);
}

// A float32 attention tile GEMM as the fused attention kernel runs it: single-threaded (its tiles
// are spread over the pool), the heads read in place (leading dimensions lda / ldb / ldc), C +=
// when `accumulate` (dK and dV sum over query blocks).
struct F32Tile {
  int64_t M, N, K;
  bool ta, tb;
  int64_t lda, ldb, ldc;
  bool accumulate;
  const char* what;
};
void bm_tile_f32(benchmark::State& state, F32Tile t) {
  const int threads = onyx::runtime::num_threads();
  onyx::runtime::set_num_threads(1);
  onyx::kernels::set_gemm_backend(GemmBackend::OneDNN);
  std::vector<float> a = random_vec((t.ta ? t.K : t.M) * t.lda, 1);
  std::vector<float> b = random_vec((t.tb ? t.N : t.K) * t.ldb, 2);
  std::vector<float> c(t.M * t.ldc);
  for (auto _ : state) {
    onyx::kernels::sgemm(t.ta, t.tb, t.M, t.N, t.K, 1.f, a.data(), t.lda, b.data(), t.ldb,
                         t.accumulate ? 1.f : 0.f, c.data(), t.ldc);
    benchmark::DoNotOptimize(c.data());
  }
  onyx::runtime::set_num_threads(threads);
  set_flops(state, 2.0 * t.M * t.N * t.K);
}

// The fused onyx.Attention / onyx.AttentionGrad node (float32, no mask) on (B, T, H·D) inputs.
// bf16: as mixed precision runs it — Q, K, V stored bf16, the output bf16 (output_dtype), dO
// float32, the tiles in bf16 (RunOptions::bf16_gemm).
void bm_attention_node(benchmark::State& state, int64_t B, int64_t T, int64_t H, int64_t D,
                       bool grad, bool bf16 = false) {
  onyx::kernels::set_gemm_backend(GemmBackend::OneDNN);
  const int64_t C = H * D;
  auto t = [&](uint32_t seed) {
    return onyx::Tensor::from_vector(onyx::DType::Float32, {B, T, C}, random_vec(B * T * C, seed));
  };
  auto qkv = [&](uint32_t seed) {
    if (!bf16) return t(seed);
    const std::vector<float> v = random_vec(B * T * C, seed);
    std::vector<uint16_t> h(v.size());
    onyx::kernels::f32_to_bf16(v.data(), h.data(), (int64_t)v.size());
    return onyx::Tensor::from_vector(onyx::DType::BFloat16, {B, T, C}, h);
  };
  onyx::runtime::RunOptions opts;
  opts.bf16_gemm = bf16;
  onyx::ir::Node fwd;
  fwd.op_type = "Attention";
  fwd.domain = "onyx";
  fwd.inputs = {"q", "k", "v"};
  fwd.outputs = {"o", "lse"};
  fwd.attrs["num_heads"] = onyx::ir::Attribute::of_int(H);
  fwd.attrs["scale"] = onyx::ir::Attribute::of_float(1.0f / std::sqrt((float)D));
  fwd.attrs["causal"] = onyx::ir::Attribute::of_int(0);
  if (bf16) fwd.attrs["output_dtype"] = onyx::ir::Attribute::of_int(16);
  const onyx::Tensor q = qkv(1), k = qkv(2), v = qkv(3), dO = t(4);
  const auto out = onyx::runtime::run_node(fwd, 1, {q, k, v}, opts);
  onyx::ir::Node bwd = fwd;
  bwd.op_type = "AttentionGrad";
  bwd.inputs = {"do", "q", "k", "v", "", "lse"};
  bwd.outputs = {"dq", "dk", "dv"};
  bwd.attrs.erase("output_dtype");
  for (auto _ : state) {
    auto r = grad ? onyx::runtime::run_node(bwd, 1, {dO, q, k, v, onyx::Tensor(), out[1]}, opts)
                  : onyx::runtime::run_node(fwd, 1, {q, k, v}, opts);
    benchmark::DoNotOptimize(r[0].raw());
  }
  set_flops(state, (grad ? 10.0 : 4.0) * B * H * T * T * D);  // the backward recomputes S
}

// Multi-threaded runs are timed by the wall clock. Single-threaded runs (OMP_NUM_THREADS=1) use the
// thread's CPU time, which stays meaningful on a loaded shared machine.
void time_mode(benchmark::internal::Benchmark* b) {
  if (onyx::runtime::num_threads() > 1) b->UseRealTime();
}

// Registers fn(state, a, b, c, variant) as "<name>/AxBxC" (variant false) and
// "<name>/AxBxC/<variant>" (true) for each shape, in milliseconds.
void register_shapes(const char* name, std::initializer_list<std::array<int64_t, 3>> shapes,
                     const char* variant,
                     void (*fn)(benchmark::State&, int64_t, int64_t, int64_t, bool)) {
  for (const auto& sh : shapes)
    for (bool v : {false, true})
      benchmark::RegisterBenchmark(
          (std::string(name) + "/" + std::to_string(sh[0]) + "x" + std::to_string(sh[1]) + "x" +
           std::to_string(sh[2]) + (v ? std::string("/") + variant : ""))
              .c_str(),
          fn, sh[0], sh[1], sh[2], v)
          ->Unit(benchmark::kMillisecond)
          ->Apply(time_mode);
}

void register_all() {
  struct Shape {
    int64_t M, N, K;
  };
  // (the last three: vit-tiny's linear layers, 3200 rows of 192 / 768)
  const Shape shapes[] = {{2048, 768, 768},  {2048, 3072, 768}, {2048, 256, 256},
                          {2048, 256, 1024}, {2048, 1024, 256}, {2048, 50257, 256},
                          {3200, 192, 192},  {3200, 768, 192},  {3200, 192, 768}};
  for (auto sh : shapes) {
    for (bool transB : {false, true}) {
      if (transB && sh.N != 768 && sh.N != 50257 && sh.M != 3200) continue;  // transB: 5 shapes
      for (auto be : kBackends) {
        std::string name = std::string("sgemm/") + onyx::kernels::gemm_backend_name(be) + "/" +
                           std::to_string(sh.M) + "x" + std::to_string(sh.N) + "x" +
                           std::to_string(sh.K) + (transB ? "/transB" : "");
        auto* b =
            benchmark::RegisterBenchmark(name.c_str(), bm_sgemm, be, sh.M, sh.N, sh.K, transB);
        b->Unit(benchmark::kMillisecond)->Apply(time_mode);
        if (sh.N > 10000) b->Iterations(3);
      }
    }
  }
  for (bool transB : {true, false}) {
    for (auto be : kBackends) {
      // 64 x (128x128x64): scores = Q·K^T (transB); 64 x (128x64x128) context = P·V.
      int64_t M = 128, N = transB ? 128 : 64, K = transB ? 64 : 128;
      std::string shape = "64x(" + std::to_string(M) + "x" + std::to_string(N) + "x" +
                          std::to_string(K) + ")" + (transB ? "/transB" : "");
      std::string be_name = onyx::kernels::gemm_backend_name(be);
      benchmark::RegisterBenchmark(("sgemm_batched/" + be_name + "/" + shape).c_str(),
                                   bm_sgemm_batched, be, 64, M, N, K, transB)
          ->Unit(benchmark::kMicrosecond)
          ->Apply(time_mode);
      benchmark::RegisterBenchmark(("sgemm_batched_parallel_for/" + be_name + "/" + shape).c_str(),
                                   bm_sgemm_batched_parallel_for, be, 64, M, N, K, transB)
          ->Unit(benchmark::kMicrosecond)
          ->Apply(time_mode);
    }
  }
  for (auto be : kBackends) {
    for (auto sh : {Shape{2048, 256, 256}, Shape{2048, 768, 768}}) {
      std::string name = std::string("sgemm_then_elementwise/") +
                         onyx::kernels::gemm_backend_name(be) + "/" + std::to_string(sh.M) + "x" +
                         std::to_string(sh.N) + "x" + std::to_string(sh.K);
      benchmark::RegisterBenchmark(name.c_str(), bm_sgemm_then_elementwise, be, sh.M, sh.N, sh.K)
          ->Unit(benchmark::kMillisecond)
          ->Apply(time_mode);
    }
  }
  for (int v = 0; v < 3; v++)
    benchmark::RegisterBenchmark(v == 0   ? "gemm_ceiling/f32"
                                 : v == 1 ? "gemm_ceiling/bf16"
                                          : "gemm_ceiling/bf16_prepacked",
                                 bm_gemm_ceiling, v > 0, v == 2)
        ->Unit(benchmark::kMillisecond)
        ->Apply(time_mode);
  for (int which = 0; which < 4; which++)
    for (int64_t r : {166, 664})
      for (bool bf16 : {false, true})
        benchmark::RegisterBenchmark(("lce_chunk/" +
                                      std::string(which == 0   ? "logits"
                                                  : which == 1 ? "dH"
                                                  : which == 2 ? "dW"
                                                               : "dWt") +
                                      "/r" + std::to_string(r) + (bf16 ? "/bf16" : "/f32"))
                                         .c_str(),
                                     bm_lce_chunk, which, r, bf16)
            ->Unit(benchmark::kMillisecond)
            ->Apply(time_mode);
  for (int which = 0; which < 3; which++)
    for (int mode = 0; mode < 3; mode++)
      benchmark::RegisterBenchmark(("attention_tile/" +
                                    std::string(which == 0   ? "QKt"
                                                : which == 1 ? "PV"
                                                             : "PtdO") +
                                    (mode == 1   ? "/bf16"
                                     : mode == 2 ? "/f32_primitive"
                                                 : "/f32"))
                                       .c_str(),
                                   bm_attention_tile, which, mode == 1, mode == 2)
          ->Apply(time_mode);
  register_shapes("grad_b_f32",
                  {{6000, 512, 2048},
                   {6000, 2048, 512},
                   {6000, 512, 512},
                   {1024, 512, 512},
                   {512, 512, 512},
                   {128, 512, 512},
                   {1024, 768, 768},
                   {3200, 192, 192},
                   {8192, 128, 128}},
                  "transposed_copy", bm_grad_b_f32);
  register_shapes("grad_b_bf16",
                  {{3200, 192, 192},
                   {3200, 192, 768},
                   {1024, 768, 768},
                   {1024, 768, 3072},
                   {512, 2048, 768},
                   {512, 768, 2048}},
                  "transposed_copy", bm_grad_b_bf16);
  register_shapes("linear_bf16",
                  {{1024, 3072, 768}, {1024, 768, 768}, {3200, 768, 192}, {3200, 192, 192}},
                  "separate", bm_linear_bf16);
  struct Tile {
    int64_t M, N, K;
    bool ta, tb;
    const char* what;
    int64_t heads = 1;
  };
  // vit-tiny's tiles (T 50, head 64) and bert's (64 query rows, T 128, head 64); bert-mini's
  // scores with Q and K read from its 4 heads (what oneDNN 2.6 ran by gemm:jit on an AMX Xeon)
  for (Tile t :
       {Tile{50, 50, 64, false, true, "vit/QKt"}, Tile{50, 64, 50, false, false, "vit/PV"},
        Tile{50, 64, 50, true, false, "vit/PtdO"}, Tile{64, 128, 64, false, true, "bert/QKt"},
        Tile{64, 64, 128, false, false, "bert/PV"}, Tile{128, 64, 64, true, false, "bert/PtdO"},
        Tile{64, 128, 64, false, true, "bert/QKt_in_heads", 4}})
    for (auto [path, name] : {std::pair{TilePath::OneDnn, "/onednn"},
                              {TilePath::Small, "/small_gemm"},
                              {TilePath::SmallVdpbf16ps, "/small_gemm_vdpbf16ps"}})
      benchmark::RegisterBenchmark((std::string("tile_bf16/") + t.what + name).c_str(),
                                   bm_tile_bf16, t.M, t.N, t.K, t.ta, t.tb, path, t.heads);
  // Whisper-base's encoder attention (T 1500, 8 heads of 64; 64 query rows per tile): the fused
  // node, and its float32 tile GEMMs one by one
  for (bool grad : {false, true})
    benchmark::RegisterBenchmark(grad ? "attention_node/whisper_B4_T1500/backward"
                                      : "attention_node/whisper_B4_T1500/forward",
                                 bm_attention_node, 4, 1500, 8, 64, grad, false)
        ->Unit(benchmark::kMillisecond)
        ->Apply(time_mode);
  // the Fashion-MNIST diffusion example's UNet at 14x14 (B64, T 196, 2 heads of 64), float32
  for (bool grad : {false, true})
    benchmark::RegisterBenchmark(
        grad ? "attention_node/unet_B64_T196/backward" : "attention_node/unet_B64_T196/forward",
        bm_attention_node, 64, 196, 2, 64, grad, false)
        ->Unit(benchmark::kMillisecond)
        ->Apply(time_mode);
  // bench_models' bert-mini (B16 T128, 4 heads of 64) and vit-tiny (B64 T50, 3 heads of 64) in
  // bf16, as their mixed-precision steps run them
  for (auto [name, B, T, H] :
       {std::tuple{"bert_mini_B16_T128", 16, 128, 4}, std::tuple{"vit_tiny_B64_T50", 64, 50, 3}})
    for (bool grad : {false, true})
      benchmark::RegisterBenchmark(
          (std::string("attention_node/") + name + (grad ? "/backward" : "/forward") + "/bf16")
              .c_str(),
          bm_attention_node, B, T, H, 64, grad, true)
          ->Unit(benchmark::kMillisecond)
          ->Apply(time_mode);
  for (F32Tile t : {F32Tile{64, 1500, 64, false, true, 512, 512, 1500, false, "QKt"},
                    F32Tile{64, 64, 1500, false, false, 1500, 512, 512, false, "PV"},
                    F32Tile{1500, 64, 64, true, false, 1500, 512, 512, true, "PtdO"},
                    F32Tile{64, 64, 1500, false, false, 1500, 512, 512, false, "dSK"},
                    F32Tile{1500, 64, 1500, true, false, 1500, 512, 512, true, "PtdO_all_rows"},
                    F32Tile{64, 1500, 64, true, false, 512, 1500, 1500, true, "dOtP"},
                    F32Tile{512, 2048, 768, false, false, 768, 2048, 2048, false, "ceiling"}})
    benchmark::RegisterBenchmark((std::string("tile_f32/whisper/") + t.what).c_str(), bm_tile_f32,
                                 t);
  benchmark::RegisterBenchmark("matmul_node/(16x128x768)x(768x3072)", bm_matmul_node, 16, 128, 768,
                               3072)
      ->Unit(benchmark::kMillisecond)
      ->Apply(time_mode);
  for (auto [N, K] : {std::pair<int64_t, int64_t>{8192, 2048}, {2048, 8192}})
    for (bool transB : {true, false})
      for (bool base : {false, true})
        benchmark::RegisterBenchmark(
            ("matmul_4bit/" + std::string(base ? "bf16_base/" : "nf4/") + std::to_string(N) + "x" +
             std::to_string(K) + (transB ? "/forward" : "/dX"))
                .c_str(),
            bm_matmul_4bit, N, K, transB, base)
            ->Unit(benchmark::kMillisecond)
            ->Apply(time_mode);
  benchmark::RegisterBenchmark("conv_node/patch16_1x3x224_to_768", bm_conv_node, 1, 3, 224, 768, 16,
                               16, 0, false)
      ->Unit(benchmark::kMillisecond)
      ->Apply(time_mode);
  benchmark::RegisterBenchmark("conv_node/3x3_8x64x56_to_64", bm_conv_node, 8, 64, 56, 64, 3, 1, 1,
                               false)
      ->Unit(benchmark::kMillisecond)
      ->Apply(time_mode);
  // the Fashion UNet's (bench/diffusion_bench.py) convolutions, float32 and bf16: 3x3 ones, its
  // image-channel input and a 1x1 shortcut (these two stay on plain layouts)
  for (auto [C, H, M, k] : {std::array<int64_t, 4>{32, 28, 32, 3},
                            {64, 14, 64, 3},
                            {64, 7, 64, 3},
                            {1, 28, 32, 3},
                            {96, 28, 32, 1}})
    for (bool bf16 : {false, true})
      benchmark::RegisterBenchmark(
          ("conv_node/unet_" + std::to_string(k) + "x" + std::to_string(k) + "_64x" +
           std::to_string(C) + "x" + std::to_string(H) + "_to_" + std::to_string(M) +
           (bf16 ? "/bf16" : "/f32"))
              .c_str(),
          bm_conv_node, 64, C, H, M, k, 1, k / 2, bf16)
          ->Unit(benchmark::kMillisecond)
          ->Apply(time_mode);
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
