#include "decoders/sample_check.h"

#include "common/error.h"

namespace batchcast {

SampleHeader check_sample(const uint8_t* data, size_t size, const std::string& name,
                          int64_t max_image_pixels) {
  if (size == 0) throw SampleError(name, "empty file (0 bytes)");
  SampleHeader header;
  header.format = sniff_image_format(data, size);
  if (header.format == ImageFormat::kUnknown)
    throw SampleError(name, "not an image (unrecognised file signature)");
  if (header.format == ImageFormat::kJpeg) {
    header.jpeg = read_jpeg_header(data, size, name);
    header.width = header.jpeg.width;
    header.height = header.jpeg.height;
  } else if (!read_image_dimensions(header.format, data, size, &header.width, &header.height)) {
    throw SampleError(
        name, std::string("corrupt or truncated ") + image_format_name(header.format) + " header");
  }
  check_pixel_count(header.width, header.height, max_image_pixels, name);
  if (header.format == ImageFormat::kJpeg && !has_end_marker(data, size))
    throw SampleError(name, "truncated JPEG (no end-of-image marker)");
  return header;
}

void check_pixel_count(int64_t width, int64_t height, int64_t limit, const std::string& name) {
  // Division, not width * height: header fields of crafted files can overflow the product.
  if (width > 0 && height > 0 && height <= limit / width) return;
  if (width <= 0 || height <= 0) {
    throw SampleError(name, "image header declares " + std::to_string(width) + "x" +
                                std::to_string(height) + " pixels");
  }
  // Callers pass 32-bit header fields, so the product fits in 64 unsigned bits.
  const uint64_t pixels = static_cast<uint64_t>(width) * static_cast<uint64_t>(height);
  throw SampleError(name, "image is " + std::to_string(width) + "x" + std::to_string(height) +
                              " = " + std::to_string(pixels) + " pixels, above max_image_pixels=" +
                              std::to_string(limit) + " (decompression-bomb guard)");
}

}  // namespace batchcast
