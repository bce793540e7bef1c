#include "decoders/image_decode.h"

#include "common/error.h"
#include "decoders/format_decoders.h"
#include "decoders/sample_check.h"

namespace batchcast {

uint8_t* DecodeTarget::allocate(int64_t width, int64_t height) const {
  check_pixel_count(width, height, max_image_pixels, name);
  return pixels.get(static_cast<size_t>(width) * static_cast<size_t>(height) * 3);
}

RgbView DecodeTarget::view(int width, int height) const {
  return RgbView{pixels.data(), width, height, static_cast<size_t>(width) * 3};
}

RgbView decode_image(ImageFormat format, const uint8_t* data, size_t size, const std::string& name,
                     int64_t max_image_pixels) {
  thread_local ScratchBuffer pixels;
  const DecodeTarget target{name, max_image_pixels, pixels};
  switch (format) {
    case ImageFormat::kPng:
      return decode_png(data, size, target);
    case ImageFormat::kBmp:
      return decode_bmp(data, size, target);
    case ImageFormat::kPnm:
      return decode_pnm(data, size, target);
    case ImageFormat::kTiff:
      return decode_tiff(data, size, target);
    case ImageFormat::kWebp:
      return decode_webp(data, size, target);
    case ImageFormat::kJpeg:
    case ImageFormat::kUnknown:
      break;
  }
  throw SampleError(name, std::string("decode_image cannot decode ") + image_format_name(format));
}

}  // namespace batchcast
