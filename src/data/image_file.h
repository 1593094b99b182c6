// data/image_file.h — PNG and JPEG files as 8-bit pixels, decoded as Hugging Face datasets' Image
// feature decodes them (PIL.Image.open, then ImageOps.exif_transpose when the file has an EXIF
// orientation) and converted as PIL's Image.convert("RGB") / convert("L") converts them, for image
// datasets (data/image_folder.h). The decoders are Debian's libpng and libjpeg-turbo (the library
// Pillow's JPEG decoder is built on, so the same DCT and upsampling give the same pixels).
//
// PIL's conversions, which the result follows:
// - alpha (RGBA, gray + alpha, tRNS) is dropped, not composited; palettes are expanded;
// - 1-, 2- and 4-bit gray scale to 0..255; 16-bit RGB keeps each sample's high byte; 16-bit gray
//   is PIL's "I;16", whose conversion to RGB or L clamps at 255 (the value, not its high byte);
// - RGB to L is ITU-R 601 luma in PIL's fixed point: (R·19595 + G·38470 + B·7471 + 2^15) >> 16;
// - gamma (gAMA, sRGB, iCCP) is ignored, as PIL ignores it.
// CMYK / YCCK JPEGs and images over PIL's decompression-bomb limit (2 · 89,478,485 pixels) are
// refused; every error names the file and what is wrong.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace onyx::data {

struct Image8 {
  int64_t width = 0, height = 0;
  int channels = 0;             // 3 (RGB) or 1 (L)
  std::vector<uint8_t> pixels;  // row-major, channels interleaved (HWC)
  uint8_t at(int64_t y, int64_t x, int c) const {
    return pixels[(size_t)((y * width + x) * channels + c)];
  }
};

// The largest image read, in pixels (PIL's DecompressionBombError threshold).
constexpr int64_t kMaxImagePixels = 2 * 89478485;

// Reads a .png / .jpg / .jpeg file (by its content's signature) as `channels` 3 (RGB) or 1 (L).
Image8 read_image(const std::string& path, int channels = 3);
// The same from a file's bytes (errors name `what`): the fuzz target's way in.
Image8 decode_image(const std::string& bytes, const std::string& what, int channels = 3);

}  // namespace onyx::data
