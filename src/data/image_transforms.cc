// data/image_transforms.cc — resize, crop, flip and normalization of Image8 as torchvision does
// them on PIL images (see image_transforms.h; Pillow's resampling: libImaging/Resample.c's
// algorithm, restated here).
#include "data/image_transforms.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "onyx/error.h"

namespace onyx::data {
namespace {

constexpr int kPrecisionBits = 32 - 8 - 2;

// One axis of a resize: output pixel o reads inputs [first[o], first[o] + count[o]) with the
// fixed-point weights k[o * ksize + i].
struct Taps {
  int64_t ksize = 0;
  std::vector<int64_t> first, count;
  std::vector<int32_t> k;
};

double bilinear(double x) {
  x = std::fabs(x);
  return x < 1.0 ? 1.0 - x : 0.0;
}

Taps bilinear_taps(int64_t in_size, int64_t out_size) {
  const double scale = (double)in_size / (double)out_size;
  const double filter_scale = std::max(scale, 1.0);
  const double support = 1.0 * filter_scale;  // the bilinear filter's support is 1
  Taps t;
  t.ksize = (int64_t)std::ceil(support) * 2 + 1;
  t.first.resize(out_size);
  t.count.resize(out_size);
  t.k.assign(out_size * t.ksize, 0);
  std::vector<double> w(t.ksize);
  for (int64_t o = 0; o < out_size; ++o) {
    const double center = (o + 0.5) * scale;
    const int64_t lo = std::max<int64_t>(0, (int64_t)(int)(center - support + 0.5));
    const int64_t hi = std::min<int64_t>(in_size, (int64_t)(int)(center + support + 0.5));
    const int64_t n = hi - lo;
    double total = 0;
    for (int64_t i = 0; i < n; ++i) {
      w[i] = bilinear((i + lo - center + 0.5) * (1.0 / filter_scale));
      total += w[i];
    }
    for (int64_t i = 0; i < n; ++i) {
      const double v = total != 0.0 ? w[i] / total : w[i];
      const double f = v * (1 << kPrecisionBits);
      t.k[o * t.ksize + i] = (int32_t)(v < 0 ? -0.5 + f : 0.5 + f);
    }
    t.first[o] = lo;
    t.count[o] = n;
  }
  return t;
}

uint8_t clip8(int32_t v) {
  const int32_t s = v >> kPrecisionBits;  // arithmetic: a negative sum clips to 0
  return (uint8_t)std::clamp(s, 0, 255);
}

// Output rows [0, rows) from input rows row0 + [0, rows), resampled along x.
Image8 resample_rows(const Image8& im, const Taps& t, int64_t width, int64_t row0, int64_t rows) {
  Image8 out;
  out.width = width;
  out.height = rows;
  out.channels = im.channels;
  out.pixels.resize((size_t)(width * rows * im.channels));
  const int C = im.channels;
  for (int64_t y = 0; y < rows; ++y) {
    const uint8_t* in = im.pixels.data() + (size_t)((row0 + y) * im.width * C);
    uint8_t* o = out.pixels.data() + (size_t)(y * width * C);
    for (int64_t x = 0; x < width; ++x) {
      const int32_t* k = t.k.data() + x * t.ksize;
      for (int c = 0; c < C; ++c) {
        int32_t s = 1 << (kPrecisionBits - 1);
        for (int64_t i = 0; i < t.count[x]; ++i) s += in[(t.first[x] + i) * C + c] * k[i];
        o[x * C + c] = clip8(s);
      }
    }
  }
  return out;
}

// Output rows from input rows first[y] - row0 + [0, count[y]), resampled along y.
Image8 resample_columns(const Image8& im, const Taps& t, int64_t height, int64_t row0) {
  Image8 out;
  out.width = im.width;
  out.height = height;
  out.channels = im.channels;
  const int64_t C = im.channels, stride = im.width * C;
  out.pixels.resize((size_t)(height * stride));
  for (int64_t y = 0; y < height; ++y) {
    const int32_t* k = t.k.data() + y * t.ksize;
    const uint8_t* in = im.pixels.data() + (size_t)((t.first[y] - row0) * stride);
    uint8_t* o = out.pixels.data() + (size_t)(y * stride);
    for (int64_t j = 0; j < stride; ++j) {
      int32_t s = 1 << (kPrecisionBits - 1);
      for (int64_t i = 0; i < t.count[y]; ++i) s += in[i * stride + j] * k[i];
      o[j] = clip8(s);
    }
  }
  return out;
}

}  // namespace

Image8 resize_bilinear(const Image8& im, int64_t width, int64_t height) {
  ONYX_CHECK(width > 0 && height > 0 && im.width > 0 && im.height > 0, "cannot resize a ", im.width,
             "x", im.height, " image to ", width, "x", height);
  if (width == im.width && height == im.height) return im;
  const Taps rows = bilinear_taps(im.height, height);
  Image8 out = im;
  int64_t row0 = 0;
  if (width != im.width) {
    // only the input rows the vertical pass reads
    row0 = rows.first.front();
    const int64_t end = rows.first.back() + rows.count.back();
    out = resample_rows(im, bilinear_taps(im.width, width), width, row0, end - row0);
  }
  if (height != im.height) out = resample_columns(out, rows, height, row0);
  return out;
}

void resized_shorter_side(int64_t width, int64_t height, int64_t size, int64_t& out_w,
                          int64_t& out_h) {
  ONYX_CHECK(size > 0 && width > 0 && height > 0, "cannot resize a ", width, "x", height,
             " image to ", size);
  const bool portrait = width <= height;
  const int64_t shorter = portrait ? width : height, longer = portrait ? height : width;
  const int64_t new_long = (int64_t)((double)(size * longer) / (double)shorter);
  out_w = portrait ? size : new_long;
  out_h = portrait ? new_long : size;
}

Image8 crop(const Image8& im, int64_t left, int64_t top, int64_t width, int64_t height) {
  ONYX_CHECK(left >= 0 && top >= 0 && left + width <= im.width && top + height <= im.height, "a ",
             width, "x", height, " crop at (", left, ", ", top, ") is outside the ", im.width, "x",
             im.height, " image");
  Image8 out;
  out.width = width;
  out.height = height;
  out.channels = im.channels;
  const int64_t C = im.channels;
  out.pixels.resize((size_t)(width * height * C));
  for (int64_t y = 0; y < height; ++y)
    std::copy_n(im.pixels.data() + ((top + y) * im.width + left) * C, width * C,
                out.pixels.data() + y * width * C);
  return out;
}

int64_t center_crop_offset(int64_t size, int64_t crop_size) {
  return (int64_t)std::nearbyint((double)(size - crop_size) / 2.0);  // half to even, as round()
}

Image8 flip_left_right(const Image8& im) {
  Image8 out = im;
  const int64_t C = im.channels;
  for (int64_t y = 0; y < im.height; ++y)
    for (int64_t x = 0; x < im.width; ++x)
      for (int64_t c = 0; c < C; ++c)
        out.pixels[(size_t)((y * im.width + x) * C + c)] = im.at(y, im.width - 1 - x, (int)c);
  return out;
}

int exif_orientation(const uint8_t* p, size_t n) {
  if (n < 8) return 0;
  const bool little = !std::memcmp(p, "II*\0", 4);
  if (!little && std::memcmp(p, "MM\0*", 4)) return 0;
  auto u16 = [&](size_t at) {
    return little ? (unsigned)p[at] | (unsigned)p[at + 1] << 8
                  : (unsigned)p[at] << 8 | (unsigned)p[at + 1];
  };
  auto u32 = [&](size_t at) {
    return little ? (uint32_t)u16(at) | (uint32_t)u16(at + 2) << 16
                  : (uint32_t)u16(at) << 16 | (uint32_t)u16(at + 2);
  };
  const uint32_t ifd = u32(4);
  if (ifd > n || n - ifd < 2) return 0;
  const unsigned entries = u16(ifd);
  for (unsigned e = 0; e < entries; ++e) {
    const size_t at = ifd + 2 + (size_t)e * 12;
    if (at + 12 > n) return 0;
    if (u16(at) == 0x0112 && u16(at + 2) == 3 && u32(at + 4) >= 1) {  // Orientation, SHORT
      const unsigned v = u16(at + 8);
      return v >= 1 && v <= 8 ? (int)v : 0;
    }
  }
  return 0;
}

Image8 apply_orientation(const Image8& im, int orientation) {
  if (orientation < 2 || orientation > 8) return im;
  const int64_t W = im.width, H = im.height;
  const bool swap = orientation >= 5;  // TRANSPOSE, ROTATE_270, TRANSVERSE, ROTATE_90
  Image8 out;
  out.width = swap ? H : W;
  out.height = swap ? W : H;
  out.channels = im.channels;
  out.pixels.resize(im.pixels.size());
  for (int64_t y = 0; y < out.height; ++y)
    for (int64_t x = 0; x < out.width; ++x) {
      int64_t sx = x, sy = y;  // the source pixel of output (x, y), as PIL's Image.transpose
      switch (orientation) {
        case 2:
          sx = W - 1 - x;
          break;  // FLIP_LEFT_RIGHT
        case 3:
          sx = W - 1 - x, sy = H - 1 - y;
          break;  // ROTATE_180
        case 4:
          sy = H - 1 - y;
          break;  // FLIP_TOP_BOTTOM
        case 5:
          sx = y, sy = x;
          break;  // TRANSPOSE
        case 6:
          sx = y, sy = H - 1 - x;
          break;  // ROTATE_270 (clockwise)
        case 7:
          sx = W - 1 - y, sy = H - 1 - x;
          break;  // TRANSVERSE
        default:
          sx = W - 1 - y, sy = x;
          break;  // 8: ROTATE_90 (counter-clockwise)
      }
      for (int c = 0; c < im.channels; ++c)
        out.pixels[(size_t)((y * out.width + x) * im.channels + c)] = im.at(sy, sx, c);
    }
  return out;
}

void to_normalized_chw(const Image8& im, float* out) {
  const int64_t plane = im.width * im.height;
  for (int64_t p = 0; p < plane; ++p)
    for (int c = 0; c < im.channels; ++c) {
      const float v = (float)im.pixels[(size_t)(p * im.channels + c)] / 255.0f;
      out[c * plane + p] = (v - 0.5f) / 0.5f;
    }
}

}  // namespace onyx::data
