// kernels/conv/conv_common.h — im2col / col2im, shared by Conv's gradients (conv.cc) and
// ConvTranspose (conv_transpose.cc).
//
// An image (channels, img...) and its column matrix (channels·k_sz, col_sz): column position o of
// kernel offset kk covers image position o·st − pb + kk·dl per spatial dim (no element where that
// falls outside the image). Spatial dims are left-padded to three (size 1, stride 1, no pad) so one
// loop nest serves 1-D, 2-D and 3-D. Conv's gradients take the conv input as the image and dY's
// positions as the columns; ConvTranspose the other way round (its output is the image).
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/kernel_api.h"

namespace onyx::kernels::conv_detail {

struct ColGeom {
  int64_t img[3] = {1, 1, 1}, col[3] = {1, 1, 1}, k[3] = {1, 1, 1}, st[3] = {1, 1, 1},
          dl[3] = {1, 1, 1}, pb[3] = {0, 0, 0};
  int64_t img_sz = 1, col_sz = 1, k_sz = 1;  // elements per channel / per column row / per kernel
};

// The geometry of image `img` (img_sz elements) seen through columns `col` (col_sz): Conv's
// gradients use X as the image and dY's positions as the columns, ConvTranspose the reverse.
inline ColGeom col_geom(const int64_t* img, int64_t img_sz, const int64_t* col, int64_t col_sz,
                        const int64_t* k, int64_t k_sz, const int64_t* st, const int64_t* dl,
                        const int64_t* pb) {
  ColGeom c;
  for (int i = 0; i < 3; i++) {
    c.img[i] = img[i];
    c.col[i] = col[i];
    c.k[i] = k[i];
    c.st[i] = st[i];
    c.dl[i] = dl[i];
    c.pb[i] = pb[i];
  }
  c.img_sz = img_sz;
  c.col_sz = col_sz;
  c.k_sz = k_sz;
  return c;
}

// Column positions [lo, hi) along one dim whose image position o·st − pb + kk·dl is in [0, img).
inline void valid_range(int64_t img, int64_t col, int64_t st, int64_t pb, int64_t kk, int64_t dl,
                        int64_t& lo, int64_t& hi) {
  int64_t base = kk * dl - pb;  // image coordinate of o = 0
  lo = base >= 0 ? 0 : (-base + st - 1) / st;
  hi = img - base <= 0 ? 0 : (img - base + st - 1) / st;
  lo = std::min(lo, col);
  hi = std::clamp(hi, lo, col);
}

// col (channels·k_sz, col_sz) from x (channels, img...): col[(c,kk), o] = x[c, o·st − pb + kk·dl]
// or 0; rows in parallel.
template <class T>
void im2col(const ColGeom& g, int64_t channels, const T* x, T* col) {
  parallel_for(channels * g.k_sz, std::max<int64_t>(1, 4096 / std::max<int64_t>(1, g.col_sz)),
               [&](int64_t r0, int64_t r1) {
                 for (int64_t r = r0; r < r1; r++) {
                   int64_t c = r / g.k_sz, kk = r % g.k_sz;
                   int64_t k0 = kk / (g.k[1] * g.k[2]), k1 = (kk / g.k[2]) % g.k[1],
                           k2 = kk % g.k[2];
                   const T* xc = x + c * g.img_sz;
                   T* row = col + r * g.col_sz;
                   int64_t lo0, hi0, lo1, hi1, lo2, hi2;
                   valid_range(g.img[0], g.col[0], g.st[0], g.pb[0], k0, g.dl[0], lo0, hi0);
                   valid_range(g.img[1], g.col[1], g.st[1], g.pb[1], k1, g.dl[1], lo1, hi1);
                   valid_range(g.img[2], g.col[2], g.st[2], g.pb[2], k2, g.dl[2], lo2, hi2);
                   for (int64_t o0 = 0; o0 < g.col[0]; o0++) {
                     T* r0p = row + o0 * g.col[1] * g.col[2];
                     if (o0 < lo0 || o0 >= hi0) {
                       std::fill(r0p, r0p + g.col[1] * g.col[2], T(0));
                       continue;
                     }
                     int64_t i0 = o0 * g.st[0] - g.pb[0] + k0 * g.dl[0];
                     for (int64_t o1 = 0; o1 < g.col[1]; o1++) {
                       T* dst = r0p + o1 * g.col[2];
                       if (o1 < lo1 || o1 >= hi1) {
                         std::fill(dst, dst + g.col[2], T(0));
                         continue;
                       }
                       int64_t i1 = o1 * g.st[1] - g.pb[1] + k1 * g.dl[1];
                       const T* src = xc + (i0 * g.img[1] + i1) * g.img[2] + k2 * g.dl[2] - g.pb[2];
                       std::fill(dst, dst + lo2, T(0));
                       if (g.st[2] == 1) {
                         std::memcpy(dst + lo2, src + lo2, (hi2 - lo2) * sizeof(T));
                       } else {
                         const int64_t s2 = g.st[2];
                         for (int64_t o2 = lo2; o2 < hi2; o2++) dst[o2] = src[o2 * s2];
                       }
                       std::fill(dst + hi2, dst + g.col[2], T(0));
                     }
                   }
                 }
               });
}

// img (channels, img...) += col2im(col (channels·k_sz, col_sz)) for channels [c0, c1): each column
// element is added into the image position it covers (positions outside the image are dropped).
// Single-threaded; callers split channels across threads, so no two write the same element.
template <class T>
void col2im_add(const ColGeom& g, const T* col, T* img, int64_t c0, int64_t c1) {
  for (int64_t c = c0; c < c1; c++) {
    T* xc = img + c * g.img_sz;
    for (int64_t kk = 0; kk < g.k_sz; kk++) {
      int64_t k0 = kk / (g.k[1] * g.k[2]), k1 = (kk / g.k[2]) % g.k[1], k2 = kk % g.k[2];
      const T* row = col + (c * g.k_sz + kk) * g.col_sz;
      int64_t lo0, hi0, lo1, hi1, lo2, hi2;
      valid_range(g.img[0], g.col[0], g.st[0], g.pb[0], k0, g.dl[0], lo0, hi0);
      valid_range(g.img[1], g.col[1], g.st[1], g.pb[1], k1, g.dl[1], lo1, hi1);
      valid_range(g.img[2], g.col[2], g.st[2], g.pb[2], k2, g.dl[2], lo2, hi2);
      for (int64_t o0 = lo0; o0 < hi0; o0++) {
        int64_t i0 = o0 * g.st[0] - g.pb[0] + k0 * g.dl[0];
        for (int64_t o1 = lo1; o1 < hi1; o1++) {
          int64_t i1 = o1 * g.st[1] - g.pb[1] + k1 * g.dl[1];
          T* dst = xc + (i0 * g.img[1] + i1) * g.img[2] + k2 * g.dl[2] - g.pb[2];
          const T* src = row + (o0 * g.col[1] + o1) * g.col[2];
          const int64_t s2 = g.st[2];
          if (s2 == 1) {
#pragma omp simd
            for (int64_t o2 = lo2; o2 < hi2; o2++) dst[o2] += src[o2];
          } else {
            for (int64_t o2 = lo2; o2 < hi2; o2++) dst[o2 * s2] += src[o2];
          }
        }
      }
    }
  }
}

}  // namespace onyx::kernels::conv_detail
