// kernels/cuda/broadcast.h — the index arithmetic of broadcast elementwise kernels: output element
// i -> the offsets of two inputs whose shapes broadcast (numpy rules) to the output. Host code
// builds it (make_broadcast: size-1 axes dropped, axes contiguous in both inputs merged); device
// code calls offsets(). Plain C++ so the CPU tests check it in every build (tests/kernels).
#pragma once
#include <cstdint>

#include "ir/graph.h"
#include "onyx/tensor.h"

#ifdef __CUDACC__
#define ONYX_HOST_DEVICE __host__ __device__
#else
#define ONYX_HOST_DEVICE
#endif

namespace onyx::cuda {

constexpr int kMaxRank = 8;

struct Broadcast {
  int rank = 0;
  int64_t dims[kMaxRank];
  int64_t strides[2][kMaxRank];  // per input, in elements; 0 along a broadcast axis
  ONYX_HOST_DEVICE inline void offsets(int64_t i, int64_t& a, int64_t& b) const {
    a = 0;
    b = 0;
    for (int d = rank - 1; d >= 0; d--) {
      int64_t q = i / dims[d];
      int64_t r = i - q * dims[d];
      a += r * strides[0][d];
      b += r * strides[1][d];
      i = q;
    }
  }
};

// The indexer of out = f(a, b) for shapes a and b broadcast to out; throws (naming the node) when
// more than kMaxRank axes remain after merging.
Broadcast make_broadcast(const Shape& out, const Shape& a, const Shape& b, const ir::Node& node);

}  // namespace onyx::cuda
