// The per-format halves of decode_image() (image_decode.h): one function per file format, each in
// its own file (png_decode.cpp, bmp_decode.cpp, pnm_decode.cpp, tiff_decode.cpp,
// webp_decode.cpp), plus the conversions of PIL's convert("RGB") they share. Internal to
// decoders/; image_decode.h is the interface.
//
// Contract: as image_decode.h's. A decoder writes its RGB8 pixels, packed (stride = width * 3),
// into the buffer DecodeTarget::allocate() returns, which guards the size first; it throws
// SampleError(target.name, reason) for bad data.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "decoders/rgb_view.h"
#include "decoders/scratch_buffer.h"

namespace batchcast {

// Where a decoder writes, and the limits it decodes under.
struct DecodeTarget {
  const std::string& name;   // the file, for errors
  int64_t max_image_pixels;  // the decompression-bomb guard
  ScratchBuffer& pixels;     // the calling thread's output buffer
  // The width x height x 3 output buffer, after check_pixel_count (throws SampleError) on the size.
  uint8_t* allocate(int64_t width, int64_t height) const;
  RgbView view(int width, int height) const;  // of what allocate() returned
};

RgbView decode_png(const uint8_t* data, size_t size, const DecodeTarget& target);
RgbView decode_bmp(const uint8_t* data, size_t size, const DecodeTarget& target);
RgbView decode_pnm(const uint8_t* data, size_t size, const DecodeTarget& target);
RgbView decode_tiff(const uint8_t* data, size_t size, const DecodeTarget& target);
RgbView decode_webp(const uint8_t* data, size_t size, const DecodeTarget& target);

// PIL's conversions to 8 bits per channel.
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
