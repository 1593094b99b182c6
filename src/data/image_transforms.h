// data/image_transforms.h — the torchvision transforms diffusers' training scripts apply to PIL
// images (train_text_to_image.py, train_unconditional.py): Resize(resolution, BILINEAR) of the
// shorter side, CenterCrop / RandomCrop, RandomHorizontalFlip, ToTensor and Normalize(0.5, 0.5),
// pixel for pixel. torchvision hands PIL images to Pillow's Image.resize, whose bilinear filter
// runs in 8-bit fixed point with a rounding after each pass; resize_bilinear is that algorithm
// (hand-written: no library reproduces Pillow's integer resampling, and a float resize differs by
// up to one level in many pixels).
#pragma once
#include <cstddef>
#include <cstdint>

#include "data/image_file.h"

namespace onyx::data {

// Pillow's Image.resize((width, height), Image.BILINEAR) of the whole image: the filter's support
// widened by the scale when shrinking (antialiasing), coefficients normalized per output pixel and
// rounded to 22-bit fixed point, the horizontal pass first (onto the rows the vertical one reads),
// each pass rounded and clipped to 0..255.
Image8 resize_bilinear(const Image8& im, int64_t width, int64_t height);

// torchvision's Resize(size) for an int size: the shorter side becomes `size`, the longer one
// int(size * long / short) (Python's truncation); returns (width, height).
void resized_shorter_side(int64_t width, int64_t height, int64_t size, int64_t& out_w,
                          int64_t& out_h);

// The width x height window at (left, top) (inside the image); CenterCrop's offsets are
// round((W - width) / 2) and round((H - height) / 2) with Python's round half to even.
Image8 crop(const Image8& im, int64_t left, int64_t top, int64_t width, int64_t height);
int64_t center_crop_offset(int64_t size, int64_t crop_size);
Image8 flip_left_right(const Image8& im);

// The EXIF orientation (1..8) in an EXIF block (a TIFF header and IFD0, without JPEG's "Exif\0\0"
// prefix), or 0 when it has none or is malformed (PIL ignores a malformed one too).
int exif_orientation(const uint8_t* data, size_t size);
// PIL's ImageOps.exif_transpose for orientation 2..8 (1 and 0: unchanged).
Image8 apply_orientation(const Image8& im, int orientation);

// ToTensor then Normalize([0.5], [0.5]): out[c][y][x] = (v / 255 - 0.5) / 0.5 in float32, CHW.
void to_normalized_chw(const Image8& im, float* out);

}  // namespace onyx::data
