// kernels/cuda/block_reduce.cuh — sums and maxima across a thread block (warp shuffles, then one
// value per warp through shared memory), for the row kernels (softmax, norms). Every thread of the
// block must call; all receive the result. The order is fixed by the block size: the same bits on
// every run.
#pragma once
#include <cuda_runtime.h>

namespace onyx::cuda {

template <bool kMax>
__device__ __forceinline__ float warp_reduce(float v) {
  for (int o = 16; o > 0; o >>= 1) {
    float w = __shfl_xor_sync(0xffffffffu, v, o);
    v = kMax ? fmaxf(v, w) : v + w;
  }
  return v;
}

template <bool kMax>
__device__ __forceinline__ float block_reduce(float v) {
  __shared__ float partial[32];
  __shared__ float result;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_reduce<kMax>(v);
  __syncthreads();  // partial/result may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    const int warps = (blockDim.x + 31) >> 5;
    float w = lane < warps ? partial[lane] : (kMax ? -INFINITY : 0.f);
    w = warp_reduce<kMax>(w);
    if (lane == 0) result = w;
  }
  __syncthreads();
  return result;
}

__device__ __forceinline__ float block_sum(float v) { return block_reduce<false>(v); }
__device__ __forceinline__ float block_max(float v) { return block_reduce<true>(v); }

}  // namespace onyx::cuda
