// kernels/cuda/runtime.cc — see runtime.h. Host code only (g++ compiles it against CUDA's runtime
// API and cuBLASLt headers when ONYX_CUDA is defined); the kernels are the .cu files beside the
// CPU kernels of each family.
#include "kernels/cuda/runtime.h"

#include <cstdio>
#include <mutex>

#ifdef ONYX_CUDA
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include "kernels/cuda/cublaslt.h"
#endif

namespace onyx::cuda {

#ifndef ONYX_CUDA

namespace {
[[noreturn]] void no_cuda() {
  throw Error(
      "onyx was built without CUDA: configure with -DONYX_CUDA=ON (scripts/build.sh does where "
      "nvcc and the nvidia-cublas wheel of scripts/setup.sh are present)");
}
}  // namespace

bool built_with_cuda() { return false; }
int device_count() { return 0; }
std::string unavailable_reason() { return "no CUDA device: onyx was built without CUDA"; }
std::string describe() { return unavailable_reason(); }
Tensor empty(DType, Shape) { no_cuda(); }
Tensor zeros(DType, Shape) { no_cuda(); }
Tensor to_device(const Tensor&) { no_cuda(); }
Tensor to_host(const Tensor&) { no_cuda(); }
void synchronize() { no_cuda(); }
size_t cublaslt_version() { no_cuda(); }
void* stream_handle() { no_cuda(); }
void* cublaslt_handle() { no_cuda(); }
void* gemm_workspace() { no_cuda(); }
size_t gemm_workspace_bytes() { no_cuda(); }
void check(int status, const char* what, const char*, int) {
  if (status != 0) throw Error(cat(what, ": CUDA error ", status, " (built without CUDA)"));
}

#else

#define ONYX_CUDA_RT(call) check((int)(call), #call, __FILE__, __LINE__)

void check(int status, const char* what, const char* file, int line) {
  if (status == (int)cudaSuccess) return;
  auto err = (cudaError_t)status;
  throw Error(cat("CUDA error in ", what, " (", file, ":", line, "): ", cudaGetErrorName(err), ": ",
                  cudaGetErrorString(err)));
}

bool built_with_cuda() { return true; }

const CublasLtApi& lt_api() {
  static const CublasLtApi api = [] {
    const char* soname = "libcublasLt.so.13";
    void* lib = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
    if (!lib)
      throw Error(cat("cuBLASLt is not loadable (", dlerror(),
                      "): install the nvidia-cublas wheel for CUDA 13 (scripts/setup.sh puts it in "
                      "$BUILD/venv-cuda) and put its nvidia/cu13/lib on LD_LIBRARY_PATH"));
    CublasLtApi a;
#define ONYX_CUBLASLT_LOAD(name)                                             \
  a.name = reinterpret_cast<decltype(a.name)>(dlsym(lib, "cublasLt" #name)); \
  if (!a.name) throw Error(cat(soname, " has no cublasLt" #name " (an older cuBLAS?)"));
    ONYX_CUBLASLT_FUNCTIONS(ONYX_CUBLASLT_LOAD)
#undef ONYX_CUBLASLT_LOAD
    return a;
  }();
  return api;
}

size_t cublaslt_version() { return lt_api().GetVersion(); }

namespace {

struct Probe {
  int count = 0;
  std::string reason;
};

const Probe& probe() {
  static const Probe p = [] {
    Probe r;
    cudaError_t e = cudaGetDeviceCount(&r.count);
    if (e != cudaSuccess) {
      r.count = 0;
      r.reason = cat("no CUDA device: ", cudaGetErrorString(e));
      cudaGetLastError();  // clear the sticky-free error so later probes start clean
    } else if (r.count == 0) {
      r.reason = "no CUDA device";
    }
    return r;
  }();
  return p;
}

void require_device() {
  if (!available()) throw Error(cat("CUDA is not available: ", probe().reason));
}

struct Context {
  cudaStream_t stream = nullptr;
  cublasLtHandle_t lt = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 32u << 20;  // cuBLASLt's recommendation for Hopper
};

Context& context() {
  static Context* ctx = [] {
    require_device();
    auto* c = new Context();  // never destroyed: kernels may still run during static teardown
    ONYX_CUDA_RT(cudaSetDevice(0));
    ONYX_CUDA_RT(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    cublasStatus_t st = lt_api().Create(&c->lt);
    if (st != CUBLAS_STATUS_SUCCESS)
      throw Error(cat("cublasLtCreate failed: ", lt_api().GetStatusString(st)));
    ONYX_CUDA_RT(cudaMallocAsync(&c->workspace, c->workspace_bytes, c->stream));
    return c;
  }();
  return *ctx;
}

}  // namespace

int device_count() { return probe().count; }

std::string unavailable_reason() { return available() ? std::string() : probe().reason; }

std::string describe() {
  if (!available()) return unavailable_reason();
  cudaDeviceProp p{};
  ONYX_CUDA_RT(cudaGetDeviceProperties(&p, 0));
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  char mem[32];
  std::snprintf(mem, sizeof mem, "%.1f GiB", (double)p.totalGlobalMem / (1ull << 30));
  return cat(p.name, " (sm_", p.major, p.minor, ", ", p.multiProcessorCount, " SMs, ", mem, ", L2 ",
             p.l2CacheSize >> 20, " MiB), driver ", driver / 1000, ".", (driver % 1000) / 10,
             ", runtime ", runtime / 1000, ".", (runtime % 1000) / 10, ", cuBLASLt ",
             lt_api().GetVersion());
}

Tensor empty(DType dtype, Shape shape) {
  Context& c = context();
  size_t bytes = (size_t)shape_numel(shape) * dtype_size(dtype);
  void* p = nullptr;
  if (bytes) {
    cudaError_t e = cudaMallocAsync(&p, bytes, c.stream);
    if (e != cudaSuccess) {
      cudaGetLastError();
      throw Error(cat("out of CUDA memory allocating ", bytes, " bytes for a ", dtype_name(dtype),
                      " tensor ", shape_str(shape), ": ", cudaGetErrorString(e)));
    }
  }
  cudaStream_t s = c.stream;
  std::shared_ptr<void> owner(p, [s](void* q) {
    if (q) cudaFreeAsync(q, s);
  });
  return Tensor::wrap(dtype, std::move(shape), p, std::move(owner), Device::Cuda);
}

Tensor zeros(DType dtype, Shape shape) {
  Tensor t = empty(dtype, std::move(shape));
  if (t.nbytes()) ONYX_CUDA_RT(cudaMemsetAsync(t.raw(), 0, t.nbytes(), context().stream));
  return t;
}

Tensor to_device(const Tensor& host) {
  ONYX_CHECK(host.device() == Device::Cpu, "to_device: the tensor is already on ",
             device_name(host.device()));
  Tensor t = empty(host.dtype(), host.shape());
  if (t.nbytes()) {
    ONYX_CUDA_RT(
        cudaMemcpyAsync(t.raw(), host.raw(), t.nbytes(), cudaMemcpyHostToDevice, context().stream));
    // The host buffer may be freed right after the call: the copy from pageable memory is staged,
    // but waiting keeps the contract simple for callers that reuse it at once.
    ONYX_CUDA_RT(cudaStreamSynchronize(context().stream));
  }
  return t;
}

Tensor to_host(const Tensor& dev) {
  ONYX_CHECK(dev.device() == Device::Cuda, "to_host: the tensor is not on cuda");
  Tensor t(dev.dtype(), dev.shape());
  if (t.nbytes())
    ONYX_CUDA_RT(
        cudaMemcpyAsync(t.raw(), dev.raw(), t.nbytes(), cudaMemcpyDeviceToHost, context().stream));
  ONYX_CUDA_RT(cudaStreamSynchronize(context().stream));
  return t;
}

void synchronize() { ONYX_CUDA_RT(cudaStreamSynchronize(context().stream)); }
void* stream_handle() { return context().stream; }
void* cublaslt_handle() { return context().lt; }
void* gemm_workspace() { return context().workspace; }
size_t gemm_workspace_bytes() { return context().workspace_bytes; }

#endif

}  // namespace onyx::cuda
