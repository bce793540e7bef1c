// Netpbm images (PBM P1/P4, PGM P2/P5, PPM P3/P6): a small reader, as the format is a few lines
// of header. Values as Pillow 9.4's PpmImagePlugin reads them, then convert("RGB"): maxval 255
// as is; PPM with another maxval rescaled to 0..255 (rounded); PGM with maxval > 255 is PIL's
// mode "I" (rescaled to 0..65535), then clipped to 0..255; bitmaps 1 = black.
#include <cstring>

#include "common/error.h"
#include "decoders/format_decoders.h"
#include "decoders/pil_convert.h"
#include "decoders/sample_check.h"

namespace batchcast {
namespace {

bool is_space(uint8_t c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

// Reads the header's and the plain formats' decimal tokens, skipping whitespace and comments.
class Tokens {
 public:
  Tokens(const uint8_t* data, size_t size, const std::string& name)
      : data_(data), size_(size), name_(name) {}
  uint32_t next(const char* what) {
    skip();
    if (at_ >= size_ || data_[at_] < '0' || data_[at_] > '9')
      throw SampleError(name_, std::string("corrupt or truncated PNM (expected ") + what + ")");
    uint64_t value = 0;
    while (at_ < size_ && data_[at_] >= '0' && data_[at_] <= '9') {
      value = value * 10 + (data_[at_++] - '0');
      if (value > 0xFFFFFFFFu)
        throw SampleError(name_, std::string("corrupt PNM: ") + what + " too large");
    }
    return static_cast<uint32_t>(value);
  }
  // P1's pixels are single digits that need no separator.
  uint32_t bit() {
    skip();
    if (at_ >= size_ || (data_[at_] != '0' && data_[at_] != '1'))
      throw SampleError(name_, "corrupt or truncated PNM (expected 0 or 1)");
    return data_[at_++] - '0';
  }
  size_t at() const { return at_; }

 private:
  void skip() {
    while (at_ < size_) {
      if (data_[at_] == '#') {
        while (at_ < size_ && data_[at_] != '\n' && data_[at_] != '\r') ++at_;
      } else if (is_space(data_[at_])) {
        ++at_;
      } else {
        break;
      }
    }
  }
  const uint8_t* data_;
  size_t size_;
  const std::string& name_;
  size_t at_ = 2;
};

}  // namespace

RgbView decode_pnm(const uint8_t* data, size_t size, const DecodeTarget& target) {
  const std::string& name = target.name;
  const char kind = static_cast<char>(data[1]);
  const bool plain = kind <= '3';
  const bool bitmap = kind == '1' || kind == '4';
  const bool color = kind == '3' || kind == '6';
  Tokens tokens(data, size, name);
  const uint32_t width = tokens.next("width");
  const uint32_t height = tokens.next("height");
  check_pixel_count(width, height, target.max_image_pixels, name);
  const uint32_t maxval = bitmap ? 1 : tokens.next("maxval");
  if (maxval == 0 || maxval > 65535)
    throw SampleError(name,
                      "corrupt PNM: maxval " + std::to_string(maxval) + " is not in 1..65535");
  // One whitespace byte separates the header from binary pixels.
  const size_t start = tokens.at() + 1;
  const int channels = color ? 3 : 1;
  const bool wide = maxval > 255;
  const size_t sample_bytes = wide ? 2 : 1;
  const size_t row_bytes = bitmap ? (width + 7) / 8 : size_t{width} * channels * sample_bytes;
  if (!plain && (start > size || (size - start) / row_bytes < height))
    throw SampleError(name, "truncated PNM (pixel data ends early)");

  // A sample as convert("RGB") sees it.
  auto to_8 = [&](uint32_t v) -> uint8_t {
    if (bitmap) return v ? 0 : 255;
    if (color || maxval <= 255)
      return static_cast<uint8_t>(maxval == 255 ? v : rescale(v, maxval, 255));
    return clip_to_8(maxval == 65535 ? v : rescale(v, maxval, 65535));  // PIL's mode "I"
  };
  uint8_t* out = target.allocate(width, height);
  const uint8_t* raster = data + start;
  for (uint32_t y = 0; y < height; ++y) {
    const uint8_t* row = raster + y * row_bytes;
    uint8_t* o = out + size_t{y} * width * 3;
    for (uint32_t x = 0; x < width; ++x, o += 3) {
      uint32_t v[3];
      for (int c = 0; c < channels; ++c) {
        if (plain) {
          v[c] = bitmap ? tokens.bit() : tokens.next("a pixel value");
        } else if (bitmap) {
          v[c] = (row[x / 8] >> (7 - x % 8)) & 1;
        } else {
          const uint8_t* s = row + (size_t{x} * channels + c) * sample_bytes;
          v[c] = wide ? (uint32_t{s[0]} << 8) | s[1] : s[0];
        }
      }
      if (color) {
        for (int c = 0; c < 3; ++c) o[c] = to_8(v[c]);
      } else {
        o[0] = o[1] = o[2] = to_8(v[0]);
      }
    }
  }
  return target.view(static_cast<int>(width), static_cast<int>(height));
}

}  // namespace batchcast
