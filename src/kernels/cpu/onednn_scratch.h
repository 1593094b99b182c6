// kernels/cpu/onednn_scratch.h — the scratchpad onyx hands oneDNN's primitives (matmul in
// gemm.cc, convolution in conv.cc). Their primitives are cached once per shape and run from any
// thread, several at once (conv's per-sample GEMMs, attention's per-head tiles), and oneDNN's
// default library-managed scratchpad does not allow that: with DNNL_ENABLE_CONCURRENT_EXEC=OFF
// (oneDNN's default build option; Debian's library behaves so) it is common to all primitives and
// a primitive must run in the thread that made it. Measured on an AVX512_BF16 CPU: the bf16 brgemm
// matmul's results were garbage (relative error 0.7-1.4) when conv's samples ran it from two
// threads. So every cached primitive is made with scratchpad_mode::user and each execution passes
// this per-thread buffer (oneDNN: "thread-safe as long as the scratchpad buffers are not used
// concurrently by two primitive executions"; a thread runs one primitive at a time, to completion).
#pragma once
#include <cstddef>
#include <cstdlib>

#include "onyx/error.h"

namespace onyx::kernels {

// At least `bytes` bytes, 64-byte aligned, owned by the calling thread (reused, grown on demand).
inline void* onednn_thread_scratch(size_t bytes) {
  struct Buffer {
    void* p = nullptr;
    size_t size = 0;
    ~Buffer() { std::free(p); }
  };
  thread_local Buffer b;
  if (bytes > b.size) {
    std::free(b.p);
    b.p = nullptr;
    b.size = 0;
    const size_t n = (bytes + 4095) / 4096 * 4096;
    b.p = std::aligned_alloc(64, n);
    ONYX_CHECK(b.p != nullptr, "oneDNN scratchpad: could not allocate ", n, " bytes");
    b.size = n;
  }
  return b.p;
}

}  // namespace onyx::kernels
