// The per-format halves of decode_image() (image_decode.h): one function per file format, each in
// its own file (png_decode.cpp, bmp_decode.cpp, pnm_decode.cpp, tiff_decode.cpp,
// webp_decode.cpp). Internal to decoders/; image_decode.h is the interface.
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

}  // namespace batchcast
