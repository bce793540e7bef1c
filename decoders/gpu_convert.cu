#include "decoders/gpu_convert.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "common/error.h"

namespace batchcast {
namespace {

constexpr int kThreads = 256;

// One thread per pixel: reads its 3 bytes and writes one element into each of the 3 planes.
// Consecutive threads write consecutive elements of a plane, so the stores coalesce.
template <typename T>
__global__ void hwc_to_chw(const uint8_t* __restrict__ in, T* __restrict__ out, uint64_t pixels,
                           uint64_t plane, const T* __restrict__ table) {
  __shared__ T lut[3 * 256];
  for (int i = threadIdx.x; i < 3 * 256; i += blockDim.x) lut[i] = table[i];
  __syncthreads();
  for (uint64_t p = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; p < pixels;
       p += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    const uint8_t* px = in + p * 3;
    uint64_t image = p / plane;
    uint64_t within = p - image * plane;
    T* dst = out + image * 3 * plane + within;
    dst[0] = lut[px[0]];
    dst[plane] = lut[256 + px[1]];
    dst[2 * plane] = lut[512 + px[2]];
  }
}

}  // namespace

ConvertTable make_convert_table(OutputType output, const std::array<float, 3>& mean,
                                const std::array<float, 3>& std) {
  if (output == OutputType::kUInt8) throw Error("uint8 output needs no conversion table");
  ConvertTable t;
  t.element_bytes = output == OutputType::kFloat32 ? 4 : 2;
  t.bytes.resize(3 * 256 * t.element_bytes);
  for (int c = 0; c < 3; ++c) {
    for (int v = 0; v < 256; ++v) {
      // The CPU pipeline's arithmetic (image_pipeline.cpp), so results match bit for bit.
      float value = (static_cast<float>(v) / 255.0f - mean[c]) / std[c];
      uint8_t* dst = t.bytes.data() + (c * 256 + v) * t.element_bytes;
      if (output == OutputType::kFloat32) {
        std::memcpy(dst, &value, 4);
      } else {
        uint16_t bits = output == OutputType::kBFloat16 ? float_to_bfloat16_bits(value)
                                                        : float_to_half_bits(value);
        std::memcpy(dst, &bits, 2);
      }
    }
  }
  return t;
}

void launch_hwc_to_chw(const uint8_t* in, void* out, uint32_t n, uint32_t height, uint32_t width,
                       const void* table, int element_bytes, cudaStream_t stream) {
  uint64_t plane = static_cast<uint64_t>(height) * width;
  uint64_t pixels = plane * n;
  if (pixels == 0) return;
  uint64_t blocks = std::min<uint64_t>((pixels + kThreads - 1) / kThreads, 65535ull * 16);
  if (element_bytes == 4) {
    hwc_to_chw<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
        in, static_cast<uint32_t*>(out), pixels, plane, static_cast<const uint32_t*>(table));
  } else if (element_bytes == 2) {
    hwc_to_chw<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
        in, static_cast<uint16_t*>(out), pixels, plane, static_cast<const uint16_t*>(table));
  } else {
    throw Error("launch_hwc_to_chw: element size " + std::to_string(element_bytes) +
                " is not 2 or 4");
  }
  cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess)
    throw Error(std::string("hwc_to_chw kernel launch failed: ") + cudaGetErrorString(status) +
                " (the build targets CMAKE_CUDA_ARCHITECTURES; rebuild for this GPU if it differs)");
}

}  // namespace batchcast
