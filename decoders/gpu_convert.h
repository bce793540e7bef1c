// GPU conversion of decoded batches: uint8 HWC images (decoded on the CPU, copied into device
// memory) -> normalised float32/float16/bfloat16 CHW planes, bit-identical to the CPU pipeline
// (decoders/image_pipeline.h): both read the same per-channel table of ((v / 255) - mean) / std
// computed in float32 on the host and rounded to the output type once.
//
// Contract: make_convert_table() is a pure function. launch_hwc_to_chw() only enqueues work on
// `stream` and returns; the caller owns every buffer and keeps them alive until that work is done.
// Thread-safe (no state). Compiled only when BATCHCAST_HAVE_CUDA.
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <vector>

#include "decoders/image_pipeline.h"

namespace batchcast {

// The per-channel lookup table for `output` (not kUInt8): 3 x 256 entries in the output type's
// bit pattern (4 bytes for float32, 2 for float16/bfloat16), channel-major.
struct ConvertTable {
  int element_bytes = 4;
  std::vector<uint8_t> bytes;  // 3 * 256 * element_bytes
};
ConvertTable make_convert_table(OutputType output, const std::array<float, 3>& mean,
                                const std::array<float, 3>& std);

// in: n images of height x width x 3 uint8 (device memory, packed). out: n x 3 x height x width
// elements of `element_bytes` (device memory, packed). table: a ConvertTable's bytes copied to
// device memory. Throws Error if the launch fails.
void launch_hwc_to_chw(const uint8_t* in, void* out, uint32_t n, uint32_t height, uint32_t width,
                       const void* table, int element_bytes, cudaStream_t stream);

}  // namespace batchcast
