// GPU halves of the image pipeline (decoders/image_pipeline.h):
// - launch_hwc_to_chw: uint8 HWC images (decoded and augmented on the CPU, copied into device
//   memory) -> normalised float32/float16/bfloat16 CHW planes, bit-identical to the CPU pipeline:
//   both read the same per-channel table of ((v / 255) - mean) / std computed in float32 on the
//   host and rounded to the output type once.
// - launch_crop_resize: full decoded images (nvJPEG) -> the pipeline's crop, resize, flip and
//   normalisation, one output square per image, following each image's SampleGeometry.
//
// Contract: make_convert_table() is a pure function. The launch_* functions only enqueue work on
// `stream` and return; the caller owns every buffer and keeps them alive until that work is done.
// Thread-safe (no state). Compiled only when BATCHCAST_HAVE_CUDA.
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <vector>

#include "decoders/image_pipeline.h"

namespace batchcast {

// The per-channel lookup table for `output` (kFloat32, kFloat16 or kBFloat16; others throw
// Error): 3 x 256 entries in the output type's
// bit pattern (4 bytes for float32, 2 for float16/bfloat16), channel-major.
struct ConvertTable {
  int element_bytes = 4;
  std::vector<uint8_t> bytes;  // 3 * 256 * element_bytes
};
ConvertTable make_convert_table(DType output, const std::array<float, 3>& mean,
                                const std::array<float, 3>& std);

// in: n images of height x width x 3 uint8 (device memory, packed). out: n x 3 x height x width
// elements of `element_bytes` (device memory, packed). table: a ConvertTable's bytes copied to
// device memory. Throws Error if the launch fails.
void launch_hwc_to_chw(const uint8_t* in, void* out, uint32_t n, uint32_t height, uint32_t width,
                       const void* table, int element_bytes, cudaStream_t stream);

// One image of launch_crop_resize: a SampleGeometry (image_pipeline.h) applied to a full decode.
struct ResizeJob {
  uint64_t source_offset = 0;  // bytes into `decoded`: source_height rows of source_width*3 RGB8
  int32_t source_width = 0;
  int32_t source_height = 0;
  // The CPU decodes the crop DCT-scaled by factor_num/factor_denom; here each pixel of the scaled
  // image is the mean of the full-resolution pixels it covers, which is close to it.
  int32_t factor_num = 1;
  int32_t factor_denom = 1;
  int32_t rect_x = 0, rect_y = 0, rect_w = 0, rect_h = 0;  // SampleGeometry::scaled
  int32_t resize_w = 0, resize_h = 0;
  int32_t final_left = 0, final_top = 0;
  int32_t flip = 0;
  int32_t output_index = 0;  // which square of `out` this image fills
};
ResizeJob make_resize_job(const SampleGeometry& g, int source_width, int source_height,
                          uint64_t source_offset, int output_index);

// For each of the n jobs (device memory), bilinear-resizes (OpenCV INTER_LINEAR's sampling, no
// antialias) its rectangle to resize_w x resize_h, cuts the size x size square at (final_left,
// final_top), mirrors it if flip, and writes it as output square output_index of `out`: with a
// `table` (element_bytes 2 or 4: a ConvertTable; 1: 3 x 256 identity bytes for planar uint8),
// 3 x size x size planes of table values; with table == nullptr, uint8 size x size x 3. Throws
// Error if the launch fails.
void launch_crop_resize(const uint8_t* decoded, const ResizeJob* jobs, uint32_t n, int size,
                        const void* table, int element_bytes, void* out, cudaStream_t stream);

}  // namespace batchcast
