// data/image_file_absent.cc — the minimal build's stand-in for data/image_file.cc (PNG and JPEG
// decoding need libpng and libjpeg, which the minimal build does without; cmake/minimal.cmake).
#include "data/image_file.h"
#include "onyx/error.h"

namespace onyx::data {

Image8 decode_image(const std::string&, const std::string& what, int) {
  throw Error(cat(what,
                  ": this minimal build (-DONYX_MINIMAL=ON) has no image decoding (libpng, "
                  "libjpeg); image folders need the full build"));
}

Image8 read_image(const std::string& path, int channels) {
  return decode_image("", cat("image file '", path, "'"), channels);
}

}  // namespace onyx::data
