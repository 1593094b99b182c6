// test_image_transforms.cc — data/image_transforms.h by hand-checked cases (the pixel-for-pixel
// comparison with PIL and torchvision is tests/parity/test_image_folder.py): EXIF orientation
// parsing and PIL's transposes, Pillow's bilinear resize on cases with one answer, torchvision's
// Resize size rule and CenterCrop's round-half-to-even offsets, flip, normalization.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "data/image_transforms.h"
#include "onyx/error.h"

namespace onyx::data {
namespace {

// A W x H one-channel image whose pixel (x, y) is 10 y + x.
Image8 grid(int64_t W, int64_t H) {
  Image8 im;
  im.width = W;
  im.height = H;
  im.channels = 1;
  for (int64_t y = 0; y < H; ++y)
    for (int64_t x = 0; x < W; ++x) im.pixels.push_back((uint8_t)(10 * y + x));
  return im;
}

// A TIFF block with IFD0 holding one SHORT entry (tag, value), little- or big-endian.
std::vector<uint8_t> tiff(bool little, uint16_t tag, uint16_t value) {
  std::vector<uint8_t> b;
  auto u16 = [&](uint16_t v) {
    little ? (b.push_back(v & 255), b.push_back(v >> 8))
           : (b.push_back(v >> 8), b.push_back(v & 255));
  };
  auto u32 = [&](uint32_t v) {
    little ? (u16(v & 0xffff), u16(v >> 16)) : (u16(v >> 16), u16(v & 0xffff));
  };
  const char* magic = little ? "II*\0" : "MM\0*";
  b.insert(b.end(), magic, magic + 4);
  u32(8);
  u16(1);  // one entry
  u16(tag);
  u16(3);  // SHORT
  u32(1);
  u16(value);
  u16(0);
  u32(0);  // no next IFD
  return b;
}

TEST(ImageTransforms, ExifOrientationIsReadInBothByteOrders) {
  for (bool little : {true, false}) {
    auto b = tiff(little, 0x0112, 6);
    EXPECT_EQ(exif_orientation(b.data(), b.size()), 6);
    b = tiff(little, 0x0100, 6);  // another tag
    EXPECT_EQ(exif_orientation(b.data(), b.size()), 0);
    b = tiff(little, 0x0112, 9);  // not an orientation
    EXPECT_EQ(exif_orientation(b.data(), b.size()), 0);
    b = tiff(little, 0x0112, 3);
    EXPECT_EQ(exif_orientation(b.data(), b.size() - 6), 0);  // the entry cut short
  }
  const uint8_t junk[] = {'I', 'I', '*', 0, 0xff, 0xff, 0xff, 0x7f, 1, 0};  // IFD past the end
  EXPECT_EQ(exif_orientation(junk, sizeof junk), 0);
}

TEST(ImageTransforms, OrientationsArePilsTransposes) {
  const Image8 im = grid(3, 2);  // rows {0 1 2} {10 11 12}
  struct Case {
    int orientation;
    int64_t w, h;
    std::vector<uint8_t> want;
  } cases[] = {
      {1, 3, 2, {0, 1, 2, 10, 11, 12}}, {2, 3, 2, {2, 1, 0, 12, 11, 10}},  // FLIP_LEFT_RIGHT
      {3, 3, 2, {12, 11, 10, 2, 1, 0}},                                    // ROTATE_180
      {4, 3, 2, {10, 11, 12, 0, 1, 2}},                                    // FLIP_TOP_BOTTOM
      {5, 2, 3, {0, 10, 1, 11, 2, 12}},                                    // TRANSPOSE
      {6, 2, 3, {10, 0, 11, 1, 12, 2}},                                    // ROTATE_270 (clockwise)
      {7, 2, 3, {12, 2, 11, 1, 10, 0}},                                    // TRANSVERSE
      {8, 2, 3, {2, 12, 1, 11, 0, 10}},  // ROTATE_90 (counter-clockwise)
  };
  for (const Case& c : cases) {
    const Image8 out = apply_orientation(im, c.orientation);
    EXPECT_EQ(out.width, c.w) << c.orientation;
    EXPECT_EQ(out.height, c.h) << c.orientation;
    EXPECT_EQ(out.pixels, c.want) << c.orientation;
  }
}

TEST(ImageTransforms, BilinearResizeKeepsConstantsAndGivesPillowsValues) {
  Image8 flat = grid(7, 5);
  std::fill(flat.pixels.begin(), flat.pixels.end(), 77);
  for (auto [w, h] : {std::pair<int64_t, int64_t>{3, 2}, {16, 9}, {1, 1}, {7, 11}}) {
    const Image8 r = resize_bilinear(flat, w, h);
    ASSERT_EQ(r.width * r.height, w * h);
    for (uint8_t v : r.pixels) EXPECT_EQ(v, 77) << w << "x" << h;
  }
  // Pillow's own results (Image.resize(..., BILINEAR) on these rows): shrinking widens the
  // triangle filter to the scale (4 -> 2: weights 3/7, 3/7, 1/7 around each center), enlarging
  // interpolates between neighbours
  Image8 row = grid(4, 1);
  row.pixels = {0, 1, 100, 201};
  EXPECT_EQ(resize_bilinear(row, 2, 1).pixels, (std::vector<uint8_t>{15, 129}));
  Image8 two = grid(2, 1);
  two.pixels = {0, 100};
  EXPECT_EQ(resize_bilinear(two, 5, 1).pixels, (std::vector<uint8_t>{0, 10, 50, 90, 100}));
  EXPECT_EQ(resize_bilinear(row, 4, 1).pixels, row.pixels);  // the same size: unchanged
  EXPECT_THROW(resize_bilinear(row, 0, 1), Error);
}

TEST(ImageTransforms, ResizeSizeAndCenterCropFollowTorchvision) {
  int64_t w = 0, h = 0;
  resized_shorter_side(53, 37, 16, w, h);  // int(16 * 53 / 37) = 22
  EXPECT_EQ(w, 22);
  EXPECT_EQ(h, 16);
  resized_shorter_side(40, 71, 16, w, h);  // int(16 * 71 / 40) = 28
  EXPECT_EQ(w, 16);
  EXPECT_EQ(h, 28);
  EXPECT_EQ(center_crop_offset(19, 16), 2);  // round(1.5) = 2
  EXPECT_EQ(center_crop_offset(17, 16), 0);  // round(0.5) = 0
  EXPECT_EQ(center_crop_offset(21, 16), 2);  // round(2.5) = 2
  const Image8 c = crop(grid(4, 3), 1, 1, 2, 2);
  EXPECT_EQ(c.pixels, (std::vector<uint8_t>{11, 12, 21, 22}));
  EXPECT_THROW(crop(grid(4, 3), 3, 0, 2, 2), Error);
  EXPECT_EQ(flip_left_right(grid(3, 1)).pixels, (std::vector<uint8_t>{2, 1, 0}));
}

TEST(ImageTransforms, NormalizationIsToTensorThenHalfHalf) {
  Image8 im = grid(2, 1);
  im.channels = 2;  // one pixel, two channels
  im.width = 1;
  im.pixels = {0, 255};
  float out[2];
  to_normalized_chw(im, out);
  EXPECT_EQ(out[0], -1.0f);
  EXPECT_EQ(out[1], 1.0f);
}

}  // namespace
}  // namespace onyx::data
