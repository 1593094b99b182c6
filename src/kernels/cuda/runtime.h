// kernels/cuda/runtime.h — the CUDA device as the rest of onyx sees it, with no CUDA header:
// device memory as Tensors (Device::Cuda), copies between host and device, the one stream every
// CUDA kernel of a process runs on, and the cuBLASLt handle the GEMMs share. Built with
// -DONYX_CUDA=ON (scripts/build.sh turns it on where nvcc and the nvidia-cublas wheel are present);
// in a build without it every call but built_with_cuda / device_count / unavailable_reason throws
// an Error that says so.
//
// Ordering: every kernel, allocation (cudaMallocAsync, a stream-ordered pool: plain device memory,
// never managed memory) and copy is issued on stream(); nothing synchronizes except to_host (and
// synchronize), so a graph's kernels queue back to back and the host reads a value only when it
// asks for one.
#pragma once
#include <cstddef>
#include <string>

#include "onyx/tensor.h"

namespace onyx::cuda {

bool built_with_cuda();
// CUDA devices this process can use: 0 in a build without CUDA, without a driver or without a
// device (never throws).
int device_count();
inline bool available() { return device_count() > 0; }
// Why available() is false ("onyx was built without CUDA", "no CUDA device: <driver's error>").
std::string unavailable_reason();
// "NVIDIA H100 80GB HBM3 (sm_90, 132 SMs, 79.2 GiB), driver 13.0, runtime 13.0, cuBLASLt 130002".
std::string describe();

// cuBLASLt's version (cublasLtGetVersion: 130002 for 13.0.2), loading the library if it is not yet
// (kernels/cuda/cublaslt.h); needs no device. Throws when it cannot be loaded.
size_t cublaslt_version();

// Uninitialized device memory for a tensor (64-byte aligned or better); freed on the stream when
// the last Tensor sharing it goes.
Tensor empty(DType dtype, Shape shape);
// Zero-filled, on the stream.
Tensor zeros(DType dtype, Shape shape);
Tensor to_device(const Tensor& host);
// Waits for the stream, then copies (the value every kernel queued before it has written).
Tensor to_host(const Tensor& device_tensor);
void synchronize();

// For the .cu files (cuda_util.cuh casts them): cudaStream_t, cublasLtHandle_t, and the GEMMs'
// workspace (device memory of workspace_bytes()).
void* stream_handle();
void* cublaslt_handle();
void* gemm_workspace();
size_t gemm_workspace_bytes();

// Throws an Error naming `what` (a call, a kernel), where, and CUDA's message when `status` (a
// cudaError_t) is not success.
void check(int status, const char* what, const char* file, int line);

}  // namespace onyx::cuda
