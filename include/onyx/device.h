// onyx/device.h — where a tensor's bytes live and where a kernel runs.
#pragma once

namespace onyx {

// Cpu: host memory. Cuda: memory of the current CUDA device (built with -DONYX_CUDA=ON; see
// src/kernels/cuda/runtime.h), which host code must not read through data<T>().
enum class Device { Cpu, Cuda };

inline const char* device_name(Device d) { return d == Device::Cuda ? "cuda" : "cpu"; }

}  // namespace onyx
