// The decoded cache's image of a sample (docs/views.md, "Decoded cache"): the whole image, decoded
// and shrunk so that its shorter side is at most `side` pixels, never enlarged. Every view of a
// cached sample is then made from this image (process_views_decoded, image_pipeline.h) as from a
// decoded non-JPEG file: its crop drawn on this image's size.
//
// How: a JPEG is decoded whole at the largest DCT scaling that keeps both sides at or above the
// target size (choose_scaling), other formats whole (image_decode.h); then cv::resize
// INTER_LINEAR to the target size, the pipeline's own resize: after the DCT scaling a JPEG is
// shrunk by less than 2x, where bilinear barely aliases, and INTER_AREA at such fractional
// ratios cost more than the decode itself (1.2 ms against 0.8 on 450-px photos). The target
// size is torchvision's Resize(side) size: the shorter side `side`, the longer
// int(side * long / short).
//
// Contract: free functions; the pixels live in a thread_local buffer of this module, valid until
// the same thread calls decode_shrunk() again; any number of threads may call at once. The bytes
// are the caller's and only read. Runs check_sample() first (so bad files throw SampleError(name,
// reason) as the CPU pipeline's would).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "decoders/rgb_view.h"

namespace batchcast {

struct ShrunkSize {
  int width = 0;
  int height = 0;
};

// The size a width x height image is kept at: unchanged when its shorter side is <= side.
ShrunkSize shrunk_size(int width, int height, int side);

// The image in `data` decoded whole, at shrunk_size(width, height, side).
RgbView decode_shrunk(const uint8_t* data, size_t size, const std::string& name,
                      int64_t max_image_pixels, int side);

}  // namespace batchcast
