// fuzz_image.cc — libFuzzer target: a PNG or JPEG file's bytes (an image folder's files); an image
// that decodes is resized, cropped and normalized as an image folder's batch does.
#include <cstdint>
#include <string>
#include <vector>

#include "data/image_file.h"
#include "data/image_transforms.h"
#include "onyx/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string input(reinterpret_cast<const char*>(data + 1), size - 1);
  try {
    const int channels = data[0] & 1 ? 1 : 3;
    onyx::data::Image8 im = onyx::data::decode_image(input, "fuzz image", channels);
    if ((int64_t)im.width * im.height > (1 << 22)) return 0;  // the decode was the test
    const int64_t R = 1 + data[0] % 16;
    int64_t w = 0, h = 0;
    onyx::data::resized_shorter_side(im.width, im.height, R, w, h);
    im = onyx::data::resize_bilinear(im, w, h);
    im = onyx::data::crop(im, onyx::data::center_crop_offset(w, R),
                          onyx::data::center_crop_offset(h, R), R, R);
    std::vector<float> out((size_t)(channels * R * R));
    onyx::data::to_normalized_chw(onyx::data::flip_left_right(im), out.data());
  } catch (const onyx::Error&) {
  }
  return 0;
}
