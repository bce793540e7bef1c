#include <algorithm>
#include <cstring>
#include <string>

#include "common/error.h"
#include "decoders/gpu_convert.h"

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

// One RGB pixel of the DCT-scaled image the CPU would have decoded: the mean of the source pixels
// that scaled pixel (x, y) covers.
__device__ void scaled_pixel(const uint8_t* image, const ResizeJob& j, int x, int y, float* rgb) {
  if (j.factor_num == j.factor_denom) {
    const uint8_t* p = image + (static_cast<uint64_t>(y) * j.source_width + x) * 3;
    rgb[0] = p[0];
    rgb[1] = p[1];
    rgb[2] = p[2];
    return;
  }
  int x0 = static_cast<int>(static_cast<int64_t>(x) * j.factor_denom / j.factor_num);
  int y0 = static_cast<int>(static_cast<int64_t>(y) * j.factor_denom / j.factor_num);
  int x1 = static_cast<int>((static_cast<int64_t>(x + 1) * j.factor_denom + j.factor_num - 1) /
                            j.factor_num);
  int y1 = static_cast<int>((static_cast<int64_t>(y + 1) * j.factor_denom + j.factor_num - 1) /
                            j.factor_num);
  x1 = max(min(x1, j.source_width), x0 + 1);
  y1 = max(min(y1, j.source_height), y0 + 1);
  float sum[3] = {0, 0, 0};
  for (int yy = y0; yy < y1; ++yy) {
    const uint8_t* row = image + static_cast<uint64_t>(yy) * j.source_width * 3;
    for (int xx = x0; xx < x1; ++xx) {
      sum[0] += row[xx * 3];
      sum[1] += row[xx * 3 + 1];
      sum[2] += row[xx * 3 + 2];
    }
  }
  float count = static_cast<float>((x1 - x0) * (y1 - y0));
  for (int c = 0; c < 3; ++c) rgb[c] = sum[c] / count;
}

// OpenCV INTER_LINEAR's source coordinate of destination index d: (d + 0.5) * scale - 0.5,
// clamped to the border (the weight of a tap outside the image goes to the edge pixel).
__device__ void linear_taps(int d, int src, int dst, int* i0, int* i1, float* frac) {
  float s = (d + 0.5f) * static_cast<float>(src) / static_cast<float>(dst) - 0.5f;
  int i = static_cast<int>(floorf(s));
  float f = s - i;
  if (i < 0) {
    i = 0;
    f = 0;
  }
  if (i >= src - 1) {
    i = src - 1;
    f = 0;
  }
  *i0 = i;
  *i1 = min(i + 1, src - 1);
  *frac = f;
}

// grid.y: one image per job; grid.x * blockDim.x threads cover its size x size output pixels.
template <typename T>
__global__ void crop_resize(const uint8_t* __restrict__ decoded, const ResizeJob* __restrict__ jobs,
                            int size, const T* __restrict__ table, T* __restrict__ out) {
  __shared__ T lut[3 * 256];
  if (table)
    for (int i = threadIdx.x; i < 3 * 256; i += blockDim.x) lut[i] = table[i];
  __syncthreads();
  const ResizeJob j = jobs[blockIdx.y];
  const uint8_t* image = decoded + j.source_offset;
  const uint64_t plane = static_cast<uint64_t>(size) * size;
  for (uint64_t p = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; p < plane;
       p += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    int y = static_cast<int>(p / size);
    int x = static_cast<int>(p - static_cast<uint64_t>(y) * size);
    int rx = (j.flip ? size - 1 - x : x) + j.final_left;
    int ry = y + j.final_top;
    int x0, x1, y0, y1;
    float fx, fy;
    linear_taps(rx, j.rect_w, j.resize_w, &x0, &x1, &fx);
    linear_taps(ry, j.rect_h, j.resize_h, &y0, &y1, &fy);
    float a[3], b[3], c[3], d[3];
    scaled_pixel(image, j, j.rect_x + x0, j.rect_y + y0, a);
    scaled_pixel(image, j, j.rect_x + x1, j.rect_y + y0, b);
    scaled_pixel(image, j, j.rect_x + x0, j.rect_y + y1, c);
    scaled_pixel(image, j, j.rect_x + x1, j.rect_y + y1, d);
    const uint64_t base = static_cast<uint64_t>(j.output_index) * plane * 3;
    for (int ch = 0; ch < 3; ++ch) {
      float top = a[ch] + (b[ch] - a[ch]) * fx;
      float bottom = c[ch] + (d[ch] - c[ch]) * fx;
      int v = static_cast<int>(top + (bottom - top) * fy + 0.5f);
      v = min(max(v, 0), 255);
      if (table)
        out[base + ch * plane + p] = lut[ch * 256 + v];
      else
        out[base + p * 3 + ch] = static_cast<T>(v);
    }
  }
}

void check_launch(const char* kernel) {
  cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess)
    throw Error(
        std::string(kernel) + " kernel launch failed: " + cudaGetErrorString(status) +
        " (the build targets CMAKE_CUDA_ARCHITECTURES; rebuild for this GPU if it differs)");
}

}  // namespace

ResizeJob make_resize_job(const SampleGeometry& g, int source_width, int source_height,
                          uint64_t source_offset, int output_index) {
  ResizeJob j;
  j.source_offset = source_offset;
  j.source_width = source_width;
  j.source_height = source_height;
  j.factor_num = g.factor.num;
  j.factor_denom = g.factor.denom;
  j.rect_x = g.scaled.left;
  j.rect_y = g.scaled.top;
  j.rect_w = g.scaled.width;
  j.rect_h = g.scaled.height;
  j.resize_w = g.resize_w;
  j.resize_h = g.resize_h;
  j.final_left = g.final_left;
  j.final_top = g.final_top;
  j.flip = g.flip ? 1 : 0;
  j.output_index = output_index;
  return j;
}

void launch_crop_resize(const uint8_t* decoded, const ResizeJob* jobs, uint32_t n, int size,
                        const void* table, int element_bytes, void* out, cudaStream_t stream) {
  if (n == 0) return;
  const uint64_t plane = static_cast<uint64_t>(size) * size;
  dim3 grid(static_cast<unsigned>(std::min<uint64_t>((plane + kThreads - 1) / kThreads, 1024)), n);
  if (table == nullptr) {
    crop_resize<uint8_t>
        <<<grid, kThreads, 0, stream>>>(decoded, jobs, size, nullptr, static_cast<uint8_t*>(out));
  } else if (element_bytes == 4) {
    crop_resize<uint32_t><<<grid, kThreads, 0, stream>>>(
        decoded, jobs, size, static_cast<const uint32_t*>(table), static_cast<uint32_t*>(out));
  } else if (element_bytes == 1) {  // planar uint8 through an identity table
    crop_resize<uint8_t><<<grid, kThreads, 0, stream>>>(
        decoded, jobs, size, static_cast<const uint8_t*>(table), static_cast<uint8_t*>(out));
  } else if (element_bytes == 2) {
    crop_resize<uint16_t><<<grid, kThreads, 0, stream>>>(
        decoded, jobs, size, static_cast<const uint16_t*>(table), static_cast<uint16_t*>(out));
  } else {
    throw Error("launch_crop_resize: element size " + std::to_string(element_bytes) +
                " is not 1, 2 or 4");
  }
  check_launch("crop_resize");
}

ConvertTable make_convert_table(DType output, const std::array<float, 3>& mean,
                                const std::array<float, 3>& std) {
  if (output != DType::kFloat32 && output != DType::kFloat16 && output != DType::kBFloat16)
    throw Error(std::string("no conversion table for ") + dtype_name(output) +
                ": the GPU normalises to float32, float16 or bfloat16 (uint8 is copied as it is)");
  ConvertTable t;
  t.element_bytes = output == DType::kFloat32 ? 4 : 2;
  t.bytes.resize(3 * 256 * t.element_bytes);
  for (int c = 0; c < 3; ++c) {
    for (int v = 0; v < 256; ++v) {
      // The CPU pipeline's arithmetic (image_pipeline.cpp), so results match bit for bit.
      float value = (static_cast<float>(v) / 255.0f - mean[c]) / std[c];
      uint8_t* dst = t.bytes.data() + (c * 256 + v) * t.element_bytes;
      if (output == DType::kFloat32) {
        std::memcpy(dst, &value, 4);
      } else {
        uint16_t bits =
            output == DType::kBFloat16 ? float_to_bfloat16_bits(value) : float_to_half_bits(value);
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
  check_launch("hwc_to_chw");
}

}  // namespace batchcast
