// PIL's conversions of samples to 8 bits per channel (what Image.convert("RGB") computes), shared
// by the decoders so that each rule is written once: the non-JPEG formats (format_decoders.h)
// and CMYK JPEGs (jpeg_decode.cpp).
//
// Contract: pure inline functions; thread-safe.
#pragma once

#include <cstdint>

namespace batchcast {

// Mode "I" (16-bit grayscale) to "L"/"RGB": clipped, so anything above 255 is white.
inline uint8_t clip_to_8(uint32_t value) { return value > 255 ? 255 : static_cast<uint8_t>(value); }
// A sample of `maxval` levels to 0..`out_max`, rounded (PIL's PNM decoder for other maxvals).
inline uint32_t rescale(uint32_t value, uint32_t maxval, uint32_t out_max) {
  if (value >= maxval) return out_max;
  return static_cast<uint32_t>((uint64_t{value} * out_max + maxval / 2) / maxval);
}
// PIL's cmyk2rgb: R = (255 - K) - C * (255 - K) / 255, the product rounded as MULDIV255 does.
inline void cmyk_to_rgb(const uint8_t* cmyk, uint8_t* rgb) {
  const uint32_t nk = 255u - cmyk[3];
  for (int c = 0; c < 3; ++c) {
    const uint32_t t = uint32_t{cmyk[c]} * nk + 128;
    rgb[c] = static_cast<uint8_t>(nk - (((t >> 8) + t) >> 8));
  }
}

}  // namespace batchcast
