// bench_cuda.cc — the CUDA kernels on the device (a build with -DONYX_CUDA=ON), through the kernel
// registry as the executor calls them, beside the ceilings measured in the same run: the bf16 and
// float32 GEMMs at 8192³ / 4096³ (cuBLASLt through onyx's MatMul kernel: the matrix ceiling MFU is
// counted against) and a device-to-device copy (the memory ceiling); then the GEMM shapes of a
// GPT-2 124M step (B·T = 8·1024) and the row kernels at those sizes. Each iteration queues 10
// launches and waits once; times are wall-clock per launch. Without a device each benchmark is
// skipped with the reason (SkipWithError: Debian's Google Benchmark has no SkipWithMessage).
#include <benchmark/benchmark.h>

#include <bit>
#include <chrono>
#include <random>

#include "kernels/cuda/runtime.h"
#include "runtime/kernel.h"

using namespace onyx;

namespace {

constexpr int kLaunches = 10;

Tensor random_device(DType dt, Shape s) {
  Tensor h(DType::Float32, s);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (int64_t i = 0; i < h.numel(); i++) h.data<float>()[i] = u(rng);
  if (dt == DType::BFloat16) {
    Tensor b(DType::BFloat16, s);
    for (int64_t i = 0; i < h.numel(); i++)
      b.data<uint16_t>()[i] = (uint16_t)(std::bit_cast<uint32_t>(h.data<float>()[i]) >> 16);
    return cuda::to_device(b);
  }
  return cuda::to_device(h);
}

// Times `domain.op` on device inputs; the outputs are allocated once from the CPU shape inference.
void time_kernel(benchmark::State& st, const std::string& domain, const std::string& op,
                 std::vector<Tensor> in, std::map<std::string, ir::Attribute> attrs, double flops,
                 double bytes) {
  ir::Node n;
  n.name = op;
  n.op_type = op;
  n.domain = domain;
  n.attrs = std::move(attrs);
  std::vector<TensorMeta> metas;
  std::vector<const TensorMeta*> mp;
  std::vector<const Tensor*> ip, vp;
  metas.reserve(in.size());
  for (size_t i = 0; i < in.size(); i++) {
    n.inputs.push_back("x" + std::to_string(i));
    metas.push_back(in[i].meta());
    mp.push_back(&metas.back());
    vp.push_back(nullptr);
    ip.push_back(&in[i]);
  }
  const runtime::OpKernel* k = runtime::KernelRegistry::instance().find(domain, op, Device::Cuda);
  if (!k) return st.SkipWithError(("no CUDA kernel for " + op).c_str());
  n.outputs = {"y"};
  auto out_metas = runtime::infer_node(*k, n, 17, mp, vp);
  Tensor y = cuda::empty(out_metas[0].dtype, out_metas[0].shape);
  runtime::KernelContext ctx{n, 17, ip, {&y}};
  k->compute(ctx);  // warm-up: cuBLASLt's heuristics, the pool's first allocation
  cuda::synchronize();
  for (auto _ : st) {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kLaunches; i++) k->compute(ctx);
    cuda::synchronize();
    st.SetIterationTime(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / kLaunches);
  }
  if (flops > 0)
    st.counters["TFLOP/s"] =
        benchmark::Counter(flops / 1e12, benchmark::Counter::kIsIterationInvariantRate);
  if (bytes > 0)
    st.counters["GB/s"] =
        benchmark::Counter(bytes / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

bool need_device(benchmark::State& st) {
  if (cuda::available()) return true;
  st.SkipWithError(cuda::unavailable_reason().c_str());
  return false;
}

// Y(M,N) = A(M,K) · B(K,N) in dtype dt (MatMul: bf16 output for bf16 inputs).
void bm_cuda_matmul(benchmark::State& st, DType dt, int64_t M, int64_t K, int64_t N) {
  if (!need_device(st)) return;
  time_kernel(st, "", "MatMul", {random_device(dt, {M, K}), random_device(dt, {K, N})}, {},
              2.0 * M * N * K, 0);
}

void bm_cuda_copy(benchmark::State& st) {
  if (!need_device(st)) return;
  Tensor x = random_device(DType::Float32, {64, 1024, 1024});  // 256 MiB
  ir::Attribute to;
  to.kind = ir::Attribute::Kind::Int;
  to.i = (int64_t)DType::Float32;
  time_kernel(st, "", "Cast", {x}, {{"to", to}}, 0, 2.0 * (double)x.nbytes());
}

void bm_cuda_rows(benchmark::State& st, const char* domain, const char* op, int inputs,
                  int64_t rows, int64_t cols) {
  if (!need_device(st)) return;
  std::vector<Tensor> in = {random_device(DType::Float32, {rows, cols})};
  if (inputs > 1) in.push_back(random_device(DType::Float32, {cols}));
  if (inputs > 2) in.push_back(random_device(DType::Float32, {cols}));
  time_kernel(st, domain, op, in, {}, 0, 2.0 * rows * cols * 4);
}

}  // namespace

// The ceilings.
BENCHMARK_CAPTURE(bm_cuda_matmul, bf16_8192, DType::BFloat16, 8192, 8192, 8192)->UseManualTime();
BENCHMARK_CAPTURE(bm_cuda_matmul, f32_4096, DType::Float32, 4096, 4096, 4096)->UseManualTime();
BENCHMARK(bm_cuda_copy)->UseManualTime();
// GPT-2 124M at B·T = 8192 tokens: the QKV, attention-out, MLP and LM-head GEMMs, in bf16.
BENCHMARK_CAPTURE(bm_cuda_matmul, gpt2_qkv, DType::BFloat16, 8192, 768, 2304)->UseManualTime();
BENCHMARK_CAPTURE(bm_cuda_matmul, gpt2_proj, DType::BFloat16, 8192, 768, 768)->UseManualTime();
BENCHMARK_CAPTURE(bm_cuda_matmul, gpt2_fc, DType::BFloat16, 8192, 768, 3072)->UseManualTime();
BENCHMARK_CAPTURE(bm_cuda_matmul, gpt2_lm_head, DType::BFloat16, 8192, 768, 50257)->UseManualTime();
// Row kernels at GPT-2 sizes (float32): GB/s against bm_cuda_copy's.
BENCHMARK_CAPTURE(bm_cuda_rows, layernorm, "", "LayerNormalization", 3, 8192, 768)->UseManualTime();
BENCHMARK_CAPTURE(bm_cuda_rows, softmax_attention, "", "Softmax", 1, 8 * 12 * 1024, 1024)
    ->UseManualTime();
BENCHMARK_CAPTURE(bm_cuda_rows, gelu, "onyx", "Gelu", 1, 8192, 3072)->UseManualTime();
