// RgbView: decoded RGB8 pixels someone else owns (a decoder's thread_local buffer), the one type
// every decoder of decoders/ returns. Plain value; it does not own or keep its pixels alive: the
// function that returned it says how long they stay valid.
#pragma once

#include <cstddef>
#include <cstdint>

namespace batchcast {

// `height` rows of `width` RGB8 pixels, `stride` bytes apart.
struct RgbView {
  const uint8_t* pixels = nullptr;
  int width = 0;
  int height = 0;
  size_t stride = 0;
};

}  // namespace batchcast
