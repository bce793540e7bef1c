// Format sniffing (by content, never by file name) and header-only dimension parsing for the
// non-JPEG formats (PNG, BMP, PPM/PGM/PBM, TIFF, WebP; decoded by image_decode.h), so the
// decompression-bomb guard runs before any decoder allocates from the header's claim.
//
// Contract: pure functions over caller-owned bytes; thread-safe; never read past `size`.
#pragma once

#include <cstddef>
#include <cstdint>

namespace batchcast {

enum class ImageFormat { kJpeg, kPng, kBmp, kPnm, kTiff, kWebp, kUnknown };

// From the file signature (magic bytes), not the file name.
ImageFormat sniff_image_format(const uint8_t* data, size_t size);
const char* image_format_name(ImageFormat format);

// Width and height claimed by the header of a PNG/BMP/PNM/TIFF/WebP file. Returns false if the
// header is malformed or truncated.
bool read_image_dimensions(ImageFormat format, const uint8_t* data, size_t size, int64_t* width,
                           int64_t* height);

}  // namespace batchcast
