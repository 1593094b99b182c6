// kernels/cuda/cuda_util.cuh — what the .cu kernel files share: the stream and handles of
// runtime.h as CUDA types, error checks that name the node, float conversions of the element
// types and launch sizes (and broadcast.h's indexer).
#pragma once
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/broadcast.h"
#include "kernels/cuda/runtime.h"
#include "kernels/kernel_api.h"

namespace onyx::cuda {

inline cudaStream_t stream() { return (cudaStream_t)stream_handle(); }
inline cublasLtHandle_t lt() { return (cublasLtHandle_t)cublaslt_handle(); }

#define ONYX_CUDA_CHECK(call) ::onyx::cuda::check((int)(call), #call, __FILE__, __LINE__)

// After a launch: a bad configuration (or an earlier asynchronous fault) becomes an Error naming
// the node.
inline void check_launch(const ir::Node& node) {
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    throw Error(cat(node.describe(), ": CUDA kernel launch failed: ", cudaGetErrorName(e), ": ",
                    cudaGetErrorString(e)));
}

// Inputs and outputs of a CUDA kernel must be device tensors (the executor puts them there).
inline void require_device_tensors(const runtime::KernelContext& c) {
  for (int i = 0; i < c.num_inputs(); i++)
    if (c.has_input(i))
      ONYX_CHECK(c.inputs[i]->device() == Device::Cuda || c.inputs[i]->numel() == 0,
                 c.node.describe(), ": input ", i, " is on ", device_name(c.inputs[i]->device()),
                 ", not cuda");
  for (int i = 0; i < (int)c.outputs.size(); i++)
    if (c.has_output(i))
      ONYX_CHECK(c.outputs[i]->device() == Device::Cuda || c.outputs[i]->numel() == 0,
                 c.node.describe(), ": output ", i, " is on ", device_name(c.outputs[i]->device()),
                 ", not cuda");
}

// Element types through float math.
__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f(int64_t v) { return (float)v; }  // Pow's integer exponents
__device__ __forceinline__ float to_f(int32_t v) { return (float)v; }
template <class T>
__device__ __forceinline__ T from_f(float v);
template <>
__device__ __forceinline__ float from_f<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ __half from_f<__half>(float v) {
  return __float2half_rn(v);
}

// Calls f(tag) with tag::type the CUDA element type of a float dtype; Unsupported otherwise.
template <class T>
struct TypeTag {
  using type = T;
};
template <class F>
void dispatch_float(DType dt, const ir::Node& node, F&& f) {
  switch (dt) {
    case DType::Float32:
      return f(TypeTag<float>{});
    case DType::BFloat16:
      return f(TypeTag<__nv_bfloat16>{});
    case DType::Float16:
      return f(TypeTag<__half>{});
    default:
      ONYX_UNSUPPORTED(node.describe(), ": dtype ", dtype_name(dt), " on cuda");
  }
}

inline unsigned blocks_for(int64_t n, int threads) {
  int64_t b = (n + threads - 1) / threads;
  return (unsigned)(b < 65535 * 16 ? (b < 1 ? 1 : b) : 65535 * 16);  // grid-stride beyond
}

}  // namespace onyx::cuda
