// data/image_file.cc — PNG (libpng) and JPEG (libjpeg-turbo) decoding into Image8 (see
// image_file.h). Both libraries report errors by longjmp from a callback; the decode functions
// below that call setjmp hold only trivially destructible locals (the C libraries' structs, plain
// pointers), so a jump skips no destructor, and the C++ around them turns their message into an
// Error naming the file.
#include "data/image_file.h"

#include <jerror.h>
#include <jpeglib.h>
#include <png.h>

#include <csetjmp>
#include <cstdio>  // before jpeglib.h, which uses FILE
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>

#include "data/image_transforms.h"
#include "onyx/error.h"

namespace onyx::data {
namespace {

constexpr size_t kMessage = 256;

// What the decoders fill in: the pixels (malloc'ed: freed by the caller, also after an error),
// gray (1 sample) or RGB (3), 8 or 16 bits, the EXIF orientation, and the message of an error.
struct Decoded {
  uint32_t width = 0, height = 0;
  int samples = 0, bits = 8;
  uint8_t* pixels = nullptr;
  png_bytep* rows = nullptr;
  int orientation = 0;
  char message[kMessage] = {};
};

bool too_many_pixels(uint64_t w, uint64_t h, char* message) {
  if (w * h <= (uint64_t)kMaxImagePixels) return false;
  std::snprintf(message, kMessage,
                "%llux%llu is %llu pixels, more than the %lld an image may have (PIL's "
                "decompression-bomb limit)",
                (unsigned long long)w, (unsigned long long)h, (unsigned long long)(w * h),
                (long long)kMaxImagePixels);
  return true;
}

// ---- PNG ----------------------------------------------------------------------------------------
struct PngSource {
  const uint8_t* data;
  size_t size, pos;
  Decoded* out;
  std::jmp_buf jump;
};

void png_on_error(png_structp png, png_const_charp message) {
  auto* s = static_cast<PngSource*>(png_get_error_ptr(png));
  if (message != s->out->message) std::snprintf(s->out->message, kMessage, "%s", message);
  std::longjmp(s->jump, 1);
}
void png_on_warning(png_structp, png_const_charp) {}

void png_read_bytes(png_structp png, png_bytep out, size_t n) {
  auto* s = static_cast<PngSource*>(png_get_io_ptr(png));
  if (s->size - s->pos < n) png_error(png, "the file ends before its image data does");
  std::memcpy(out, s->data + s->pos, n);
  s->pos += n;
}

// The transforms that make libpng give PIL's samples: palettes expanded (tRNS not turned into
// alpha), low-bit gray scaled to 8 bits, 16-bit color cut to its high byte (16-bit gray stays:
// PIL clamps it), alpha stripped.
void png_set_pil_transforms(png_structp png, int color_type, int bit_depth) {
  if (color_type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  const bool gray = color_type == PNG_COLOR_TYPE_GRAY || color_type == PNG_COLOR_TYPE_GRAY_ALPHA;
  if (gray && bit_depth < 8) png_set_expand_gray_1_2_4_to_8(png);
  if (bit_depth == 16 && !gray) png_set_strip_16(png);
  if (color_type & PNG_COLOR_MASK_ALPHA) png_set_strip_alpha(png);
  png_set_interlace_handling(png);
}

bool decode_png(PngSource& s) {
  Decoded& d = *s.out;
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &s, png_on_error, png_on_warning);
  if (!png) {
    std::snprintf(d.message, kMessage, "libpng could not start");
    return false;
  }
  png_infop info = png_create_info_struct(png);
  if (setjmp(s.jump)) {
    png_destroy_read_struct(&png, &info, nullptr);
    return false;
  }
  if (!info) png_error(png, "libpng could not start");
  png_set_read_fn(png, &s, png_read_bytes);
  png_read_info(png, info);
  const int color_type = png_get_color_type(png, info), bit_depth = png_get_bit_depth(png, info);
  d.width = png_get_image_width(png, info);
  d.height = png_get_image_height(png, info);
  if (too_many_pixels(d.width, d.height, d.message)) png_error(png, d.message);
  png_bytep exif = nullptr;
  png_uint_32 exif_size = 0;
  if (png_get_eXIf_1(png, info, &exif_size, &exif) && exif)
    d.orientation = exif_orientation(exif, exif_size);
  png_set_pil_transforms(png, color_type, bit_depth);
  png_read_update_info(png, info);
  d.samples = png_get_channels(png, info);
  d.bits = png_get_bit_depth(png, info);
  const size_t row_bytes = png_get_rowbytes(png, info);
  d.pixels = static_cast<uint8_t*>(std::malloc(row_bytes * d.height));
  d.rows = static_cast<png_bytep*>(std::malloc(sizeof(png_bytep) * d.height));
  if (!d.pixels || !d.rows) png_error(png, "out of memory for the pixels");
  for (uint32_t y = 0; y < d.height; ++y) d.rows[y] = d.pixels + y * row_bytes;
  png_read_image(png, d.rows);
  png_destroy_read_struct(&png, &info, nullptr);
  return true;
}

// ---- JPEG ---------------------------------------------------------------------------------------
struct JpegSource {
  jpeg_error_mgr errors;  // first: libjpeg's callbacks get a pointer to it
  const uint8_t* data;
  size_t size;
  Decoded* out;
  std::jmp_buf jump;
};

void jpeg_on_error(j_common_ptr c) {
  auto* s = reinterpret_cast<JpegSource*>(c->err);
  char text[JMSG_LENGTH_MAX];
  (*c->err->format_message)(c, text);
  std::snprintf(s->out->message, kMessage, "%s", text);
  std::longjmp(s->jump, 1);
}
// Warnings pass, except the data ending early: PIL refuses a truncated JPEG ("image file is
// truncated") where libjpeg would fill the rest with gray.
void jpeg_on_message(j_common_ptr c, int level) {
  if (level < 0 && c->err->msg_code == JWRN_JPEG_EOF) c->err->error_exit(c);
}

int jpeg_exif_orientation(j_decompress_ptr c) {
  for (jpeg_saved_marker_ptr m = c->marker_list; m; m = m->next)
    if (m->marker == JPEG_APP0 + 1 && m->data_length > 6 && !std::memcmp(m->data, "Exif\0\0", 6))
      return exif_orientation(m->data + 6, m->data_length - 6);
  return 0;
}

bool decode_jpeg(JpegSource& s) {
  Decoded& d = *s.out;
  jpeg_decompress_struct c;
  c.err = jpeg_std_error(&s.errors);
  s.errors.error_exit = jpeg_on_error;
  s.errors.emit_message = jpeg_on_message;
  jpeg_create_decompress(&c);
  if (setjmp(s.jump)) {
    jpeg_destroy_decompress(&c);
    return false;
  }
  jpeg_mem_src(&c, s.data, (unsigned long)s.size);
  jpeg_save_markers(&c, JPEG_APP0 + 1, 0xFFFF);
  jpeg_read_header(&c, TRUE);
  if (c.jpeg_color_space == JCS_CMYK || c.jpeg_color_space == JCS_YCCK) {
    std::snprintf(d.message, kMessage, "a CMYK JPEG (only RGB and grayscale ones are read)");
    longjmp(s.jump, 1);
  }
  if (too_many_pixels(c.image_width, c.image_height, d.message)) longjmp(s.jump, 1);
  d.orientation = jpeg_exif_orientation(&c);
  c.out_color_space = c.jpeg_color_space == JCS_GRAYSCALE ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_start_decompress(&c);
  d.width = c.output_width;
  d.height = c.output_height;
  d.samples = c.output_components;
  const size_t row_bytes = (size_t)d.width * d.samples;
  d.pixels = static_cast<uint8_t*>(std::malloc(row_bytes * d.height));
  if (!d.pixels) {
    std::snprintf(d.message, kMessage, "out of memory for the pixels");
    longjmp(s.jump, 1);
  }
  while (c.output_scanline < c.output_height) {
    JSAMPROW row = d.pixels + (size_t)c.output_scanline * row_bytes;
    jpeg_read_scanlines(&c, &row, 1);
  }
  jpeg_finish_decompress(&c);
  jpeg_destroy_decompress(&c);
  return true;
}

// ---- conversions --------------------------------------------------------------------------------
uint8_t sample8(const Decoded& d, size_t i) {
  if (d.bits == 8) return d.pixels[i];
  const unsigned v = (unsigned)d.pixels[2 * i] << 8 | d.pixels[2 * i + 1];  // big-endian
  return (uint8_t)(v > 255 ? 255 : v);  // PIL's "I;16" to RGB / L clamps
}

// PIL's L24: ITU-R 601 luma in 16-bit fixed point, rounded.
uint8_t luma(uint8_t r, uint8_t g, uint8_t b) {
  return (uint8_t)((r * 19595u + g * 38470u + b * 7471u + 0x8000u) >> 16);
}

Image8 convert(const Decoded& d, int channels) {
  Image8 im;
  im.width = d.width;
  im.height = d.height;
  im.channels = channels;
  const size_t n = (size_t)d.width * d.height;
  im.pixels.resize(n * channels);
  for (size_t p = 0; p < n; ++p) {
    uint8_t* o = im.pixels.data() + p * channels;
    if (d.samples == 1) {
      const uint8_t v = sample8(d, p);
      for (int c = 0; c < channels; ++c) o[c] = v;
    } else {
      const uint8_t* rgb = d.pixels + p * 3;
      if (channels == 3)
        std::memcpy(o, rgb, 3);
      else
        o[0] = luma(rgb[0], rgb[1], rgb[2]);
    }
  }
  return im;
}

}  // namespace

Image8 decode_image(const std::string& bytes, const std::string& what, int channels) {
  ONYX_CHECK(channels == 1 || channels == 3,
             "an image is read with 1 (L) or 3 (RGB) channels, not ", channels);
  const auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
  const bool png = bytes.size() >= 8 && !std::memcmp(data, "\x89PNG\r\n\x1a\n", 8);
  const bool jpeg = bytes.size() >= 3 && !std::memcmp(data, "\xff\xd8\xff", 3);
  ONYX_CHECK(png || jpeg, what, " is neither a PNG nor a JPEG file (by its first bytes)");
  Decoded d;
  std::unique_ptr<void, void (*)(void*)> pixels(nullptr, std::free), rows(nullptr, std::free);
  bool ok;
  if (png) {
    PngSource s{data, bytes.size(), 0, &d, {}};
    ok = decode_png(s);
  } else {
    JpegSource s{};
    s.data = data;
    s.size = bytes.size();
    s.out = &d;
    ok = decode_jpeg(s);
  }
  pixels.reset(d.pixels);
  rows.reset(d.rows);
  ONYX_CHECK(ok, what, ": ", png ? "PNG" : "JPEG", ": ", d.message);
  return apply_orientation(convert(d, channels), d.orientation);
}

Image8 read_image(const std::string& path, int channels) {
  std::ifstream f(path, std::ios::binary);
  ONYX_CHECK(f, "cannot open image file '", path, "'");
  std::ostringstream ss;
  ss << f.rdbuf();
  return decode_image(ss.str(), cat("image file '", path, "'"), channels);
}

}  // namespace onyx::data
