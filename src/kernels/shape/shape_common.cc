// kernels/shape/shape_common.cc — the byte-moving engines behind the shape kernels: threaded
// memcpy, element fill, and strided_copy (the one routine Transpose, Slice, Expand, Tile,
// DepthToSpace and Pad reduce to). Hand-written because these are memory-bound loops where merging
// dims, row memcpy and cache tiling are what matter.
#include "kernels/shape/shape_common.h"

#include <algorithm>

#include "kernels/cpu/simd/simd.h"

namespace onyx::kernels::shape_detail {

void parallel_memcpy(void* dst, const void* src, size_t bytes) {
  if (dst == src || bytes == 0) return;
  constexpr int64_t kChunk =
      1 << 20;  // 1 MiB per task: below that threads cost more than they save
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

// One 8x8 block: d[p * ld + q] = s[p + q * ls] for p < pn, q < qn (4-byte elements go through
// simd::transpose_strip32, whose AVX2 / AVX-512 paths shuffle whole 8x8 blocks in registers).
template <class U>
inline void transpose_block(U* d, int64_t ld, const U* s, int64_t ls, int64_t pn, int64_t qn) {
  for (int64_t q = 0; q < qn; q++)
    for (int64_t p = 0; p < pn; p++) d[p * ld + q] = s[p + q * ls];
}

// dst (contiguous, shape sz) from src where output dim j has source stride 1: for every index of
// the other dims, copies the (sz[j], sz[last]) plane in 8x8 blocks, q-blocks outermost so each
// block reads 8 contiguous source runs.
template <class U>
void transpose_planes(U* dst, const U* src, const std::vector<int64_t>& sz,
                      const std::vector<int64_t>& st, int j) {
  int k = (int)sz.size();
  std::vector<int64_t> dstr = contiguous_strides(sz);
  std::vector<int64_t> bsz, bst, bdst;  // batch dims: all but j and the last
  for (int d = 0; d < k - 1; d++)
    if (d != j) {
      bsz.push_back(sz[d]);
      bst.push_back(st[d]);
      bdst.push_back(dstr[d]);
    }
  int nb = (int)bsz.size();
  int64_t P = sz[j], Q = sz[k - 1], sq = st[k - 1], ld = dstr[j];
  constexpr int64_t B = 8;
  int64_t qblocks = (Q + B - 1) / B, batches = prod(bsz, 0, nb);
  parallel_for(batches * qblocks, std::max<int64_t>(1, 16384 / (B * P)), [&](int64_t b, int64_t e) {
    for (int64_t u = b; u < e; u++) {
      int64_t bi = u / qblocks, q0 = (u % qblocks) * B, qn = std::min(B, Q - q0);
      int64_t so = 0, dof = 0;
      for (int d = nb - 1; d >= 0; d--) {
        int64_t i = bi % bsz[d];
        bi /= bsz[d];
        so += i * bst[d];
        dof += i * bdst[d];
      }
      const U* s = src + so + q0 * sq;
      U* d = dst + dof + q0;
      if constexpr (sizeof(U) == 4)
        simd::transpose_strip32((uint32_t*)d, ld, (const uint32_t*)s, sq, P, qn);
      else
        for (int64_t p0 = 0; p0 < P; p0 += B)
          transpose_block(d + p0 * ld, ld, s + p0, sq, std::min(B, P - p0), qn);
    }
  });
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
  if (in_stride != 1) {
    // A transpose: some other output dim j reads the source contiguously. Copy 8x8 blocks of the
    // (j, last) plane so reads and writes both use whole cache lines.
    int j = -1;
    for (int d = k - 2; d >= 0 && j < 0; d--)
      if (st[d] == 1) j = d;
    if (j >= 0 && sz[j] >= 4) {
      transpose_planes(dst, src, sz, st, j);
      return;
    }
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

std::vector<int64_t> read_indices(const ir::Node& node, const Tensor& ind, int64_t dim,
                                  const Shape& data_shape, int64_t axis) {
  DType t = ind.dtype();
  ONYX_CHECK(t == DType::Int64 || t == DType::Int32, node.describe(), ": indices must be int32 or ",
             "int64, got ", dtype_name(t));
  int64_t n = ind.numel();
  std::vector<int64_t> out(n);
  const int64_t* p64 = t == DType::Int64 ? ind.data<int64_t>() : nullptr;
  const int32_t* p32 = t == DType::Int32 ? ind.data<int32_t>() : nullptr;
  for (int64_t i = 0; i < n; i++) {
    int64_t v = p64 ? p64[i] : p32[i];
    int64_t w = v < 0 ? v + dim : v;
    if (w < 0 || w >= dim)
      throw Error(cat(node.describe(), ": index ", v, " (at flat position ", i, " of indices ",
                      shape_str(ind.shape()), ") is out of range for axis ", axis, " of size ", dim,
                      " in data ", shape_str(data_shape)));
    out[i] = w;
  }
  return out;
}

}  // namespace onyx::kernels::shape_detail
