// The checks a sample's bytes pass before any pixel is decoded, in one order for every decoder:
// the CPU pipeline (image_pipeline.cpp) and the GPU decode path (server/produce/nvjpeg_stage.cpp),
// so a bad file is refused with the same SampleError whichever decodes it (on_error=skip then
// replaces it the usual way). The sequence: not empty; file signature; header parse;
// decompression-bomb guard on the header's claimed size; for JPEG, the end-of-image marker (rows
// below a crop are never decoded, and nvJPEG does not report truncation, so this is where
// truncation is caught). The sample's geometry (ImagePipeline::geometry) comes after, from the
// returned size.
//
// Contract: free functions over caller-owned bytes, which they only read; thread-safe (header
// parsing uses jpeg_decode.h's thread_local TurboJPEG handle). Bad samples throw
// SampleError(name, reason).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "decoders/image_header.h"
#include "decoders/jpeg_decode.h"

namespace batchcast {

// What the header of a sample that passed check_sample() declares.
struct SampleHeader {
  ImageFormat format = ImageFormat::kUnknown;
  int64_t width = 0;  // as the header claims them (a decoder may still find the data shorter)
  int64_t height = 0;
  JpegHeader jpeg;  // format == kJpeg only
};

// Runs the check sequence above for every format image_header.h knows.
SampleHeader check_sample(const uint8_t* data, size_t size, const std::string& name,
                          int64_t max_image_pixels);

// The decompression-bomb guard: throws SampleError(name, ...) unless 0 < width * height <= limit.
void check_pixel_count(int64_t width, int64_t height, int64_t limit, const std::string& name);

}  // namespace batchcast
