// shape_common.cc — the byte-moving engines behind the shape kernels: threaded memcpy, element
// fill, and strided_copy (the one routine Transpose, Slice, Expand, Tile, DepthToSpace and Pad
// reduce to). Hand-written because these are memory-bound loops where merging dims, row memcpy and
// cache tiling are what matter.
#include "kernels/cpu/shape_common.h"

#include <algorithm>

namespace onyx::runtime::shape_detail {

void parallel_memcpy(void* dst, const void* src, size_t bytes) {
  if (dst == src || bytes == 0) return;
  constexpr int64_t kChunk = 1 << 20;  // 1 MiB per task: below that, threads cost more than they save
  int64_t chunks = (int64_t)((bytes + kChunk - 1) / kChunk);
  parallel_for(chunks, 2, [&](int64_t b, int64_t e) {
    size_t lo = (size_t)b * kChunk, hi = std::min(bytes, (size_t)e * kChunk);
    std::memcpy((char*)dst + lo, (const char*)src + lo, hi - lo);
  });
}

void fill_elements(void* dst, int64_t n, const void* value, size_t es) {
  if (n <= 0) return;
  bool all_zero = true;
  for (size_t i = 0; i < es; i++) all_zero &= ((const uint8_t*)value)[i] == 0;
  if (all_zero) {
    std::memset(dst, 0, (size_t)n * es);
    return;
  }
  by_elem_size(es, [&]<class U>() {
    U v;
    std::memcpy(&v, value, sizeof(U));
    U* d = (U*)dst;
    parallel_for(n, 1 << 16, [&](int64_t b, int64_t e) { std::fill(d + b, d + e, v); });
  });
}

namespace {

// Increments a multi-index over sizes[0..k), updating the linear source offset.
inline void advance(int64_t* idx, const int64_t* sizes, const int64_t* strides, int k,
                    int64_t& off) {
  for (int d = k - 1; d >= 0; d--) {
    off += strides[d];
    if (++idx[d] < sizes[d]) return;
    off -= strides[d] * sizes[d];
    idx[d] = 0;
  }
}

// Multi-index and source offset of linear position r over sizes[0..k).
inline int64_t seek(int64_t r, int64_t* idx, const int64_t* sizes, const int64_t* strides, int k) {
  int64_t off = 0;
  for (int d = k - 1; d >= 0; d--) {
    idx[d] = r % sizes[d];
    r /= sizes[d];
    off += idx[d] * strides[d];
  }
  return off;
}

template <class U>
void strided_copy_t(U* dst, const U* src, const std::vector<int64_t>& sz,
                    const std::vector<int64_t>& st) {
  int k = (int)sz.size();
  if (k == 0) {
    dst[0] = src[0];
    return;
  }
  int64_t inner = sz[k - 1], in_stride = st[k - 1];
  if (in_stride != 1 && k >= 2 && st[k - 2] == 1) {
    // Batched 2-D transpose: dst[b][p][q] = src[off_b + p + q*sq]. Tile so both sides stay in L1.
    constexpr int64_t T = 32;
    int64_t P = sz[k - 2], Q = inner, sq = in_stride;
    int kb = k - 2;
    int64_t batch = prod(sz, 0, kb), ptiles = (P + T - 1) / T;
    parallel_for(batch * ptiles, std::max<int64_t>(1, 16384 / (T * Q)), [&](int64_t b, int64_t e) {
      std::vector<int64_t> idx(std::max(kb, 1));
      for (int64_t u = b; u < e; u++) {
        int64_t bi = u / ptiles, p0 = (u % ptiles) * T, p1 = std::min(P, p0 + T);
        int64_t off = seek(bi, idx.data(), sz.data(), st.data(), kb);
        const U* s = src + off;
        U* d = dst + bi * P * Q;
        for (int64_t q0 = 0; q0 < Q; q0 += T) {
          int64_t q1 = std::min(Q, q0 + T);
          for (int64_t p = p0; p < p1; p++)
            for (int64_t q = q0; q < q1; q++) d[p * Q + q] = s[p + q * sq];
        }
      }
    });
    return;
  }
  int ko = k - 1;  // outer dims
  int64_t rows = prod(sz, 0, ko);
  int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(inner, 1));
  parallel_for(rows, grain, [&](int64_t b, int64_t e) {
    std::vector<int64_t> idx(std::max(ko, 1));
    int64_t off = seek(b, idx.data(), sz.data(), st.data(), ko);
    for (int64_t r = b; r < e; r++) {
      U* d = dst + r * inner;
      const U* s = src + off;
      if (in_stride == 1) {
        std::memcpy(d, s, inner * sizeof(U));
      } else if (in_stride == 0) {
        std::fill(d, d + inner, s[0]);
      } else {
        for (int64_t i = 0; i < inner; i++) d[i] = s[i * in_stride];
      }
      advance(idx.data(), sz.data(), st.data(), ko, off);
    }
  });
}

}  // namespace

void strided_copy(void* dst, const void* src, const Shape& shape,
                  const std::vector<int64_t>& src_strides, size_t es) {
  // Drop size-1 dims, then merge neighbours that are contiguous in the source as well.
  std::vector<int64_t> sz, st;
  for (size_t i = 0; i < shape.size(); i++) {
    if (shape[i] == 0) return;
    if (shape[i] == 1) continue;
    if (!sz.empty() && st.back() == src_strides[i] * shape[i]) {
      sz.back() *= shape[i];
      st.back() = src_strides[i];
    } else {
      sz.push_back(shape[i]);
      st.push_back(src_strides[i]);
    }
  }
  if (sz.size() == 1 && st[0] == 1) {
    parallel_memcpy(dst, src, (size_t)sz[0] * es);
    return;
  }
  by_elem_size(es, [&]<class U>() { strided_copy_t<U>((U*)dst, (const U*)src, sz, st); });
}

void store_double(DType t, void* dst, int64_t i, double v, const ir::Node& node) {
  dispatch_dtype(t, node, [&]<class S>() {
    using C = typename Arith<S>::C;
    ((S*)dst)[i] = Arith<S>::store((C)v);
  });
}

}  // namespace onyx::runtime::shape_detail
