// RgbView: decoded RGB8 pixels someone else owns (a decoder's thread_local buffer), the one type
// every decoder of decoders/ returns. Plain value; it does not own or keep its pixels alive: the
// function that returned it says how long they stay valid. copy_packed() keeps pixels beyond
// that, in memory of the caller's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace batchcast {

// `height` rows of `width` RGB8 pixels, `stride` bytes apart.
struct RgbView {
  const uint8_t* pixels = nullptr;
  int width = 0;
  int height = 0;
  size_t stride = 0;
};

// Copies `image` into `out` (width * 3 * height bytes), its rows packed; returns the copy.
inline RgbView copy_packed(const RgbView& image, uint8_t* out) {
  const size_t row = static_cast<size_t>(image.width) * 3;
  for (int y = 0; y < image.height; ++y)
    std::memcpy(out + y * row, image.pixels + y * image.stride, row);
  return RgbView{out, image.width, image.height, row};
}

}  // namespace batchcast
