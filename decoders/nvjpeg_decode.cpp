#include "decoders/nvjpeg_decode.h"

#include <nvjpeg.h>

#include "common/error.h"

namespace batchcast {
namespace {

void nvjpeg_check(nvjpegStatus_t status, const std::string& what) {
  if (status != NVJPEG_STATUS_SUCCESS)
    throw Error(what + " failed: nvJPEG status " + std::to_string(static_cast<int>(status)));
}

// One nvJPEG handle with its decoding state and the batch size it was initialised for.
struct Backend {
  nvjpegHandle_t handle = nullptr;
  nvjpegJpegState_t state = nullptr;
  int batch = 0;
  bool create(nvjpegBackend_t backend) {
    if (nvjpegCreateEx(backend, nullptr, nullptr, 0, &handle) != NVJPEG_STATUS_SUCCESS) {
      handle = nullptr;
      return false;
    }
    nvjpeg_check(nvjpegJpegStateCreate(handle, &state), "nvjpegJpegStateCreate");
    return true;
  }
  void destroy() noexcept {
    if (state) nvjpegJpegStateDestroy(state);
    if (handle) nvjpegDestroy(handle);
    state = nullptr;
    handle = nullptr;
  }
  nvjpegStatus_t decode(const std::vector<JpegBytes>& jpegs, const std::vector<uint8_t*>& outs,
                        const std::vector<std::pair<int, int>>& sizes, cudaStream_t stream) {
    int n = static_cast<int>(jpegs.size());
    if (batch != n) {
      nvjpegStatus_t s = nvjpegDecodeBatchedInitialize(handle, state, n, 1, NVJPEG_OUTPUT_RGBI);
      if (s != NVJPEG_STATUS_SUCCESS) return s;
      batch = n;
    }
    std::vector<const unsigned char*> data(n);
    std::vector<size_t> lengths(n);
    std::vector<nvjpegImage_t> images(n);
    for (int i = 0; i < n; ++i) {
      data[i] = jpegs[i].data;
      lengths[i] = jpegs[i].size;
      images[i] = nvjpegImage_t{};
      images[i].channel[0] = outs[i];
      images[i].pitch[0] = static_cast<unsigned>(sizes[i].first * 3);
    }
    return nvjpegDecodeBatched(handle, state, data.data(), lengths.data(), images.data(), stream);
  }
};

// True for a baseline (SOF0) JPEG, the kind the hardware engine decodes; progressive and other
// frame types go to the hybrid backend. Walks the marker segments up to the frame header.
bool is_baseline(const uint8_t* data, size_t size) {
  size_t i = 2;  // after SOI
  while (i + 4 <= size) {
    if (data[i] != 0xFF) return false;
    uint8_t marker = data[i + 1];
    if (marker == 0xFF) {  // fill byte
      ++i;
      continue;
    }
    if (marker >= 0xC0 && marker <= 0xCF && marker != 0xC4 && marker != 0xC8 && marker != 0xCC)
      return marker == 0xC0;
    if (marker == 0x01 || (marker >= 0xD0 && marker <= 0xD7)) {  // no length field
      i += 2;
      continue;
    }
    i += 2 + ((size_t{data[i + 2]} << 8) | data[i + 3]);
  }
  return false;
}

}  // namespace

struct NvjpegDecoder::Impl {
  int device = 0;
  Backend hardware;
  Backend hybrid;
  ~Impl() {
    hardware.destroy();
    hybrid.destroy();
  }
};

NvjpegDecoder::NvjpegDecoder(int device) : impl_(std::make_unique<Impl>()) {
  impl_->device = device;
  if (cudaSetDevice(device) != cudaSuccess)
    throw Error("nvJPEG decoder: cuda:" + std::to_string(device) + " is not usable");
  impl_->hardware.create(NVJPEG_BACKEND_HARDWARE);  // absent on most GPUs: a value, not an error
  if (!impl_->hybrid.create(NVJPEG_BACKEND_DEFAULT))
    throw Error(
        "nvJPEG decoder: nvjpegCreateEx failed (is libnvjpeg from the CUDA toolkit "
        "installed and the driver new enough?)");
}

NvjpegDecoder::~NvjpegDecoder() = default;
NvjpegDecoder::NvjpegDecoder(NvjpegDecoder&&) noexcept = default;
NvjpegDecoder& NvjpegDecoder::operator=(NvjpegDecoder&&) noexcept = default;

const char* NvjpegDecoder::backend() const {
  return impl_->hardware.handle ? "hardware" : "hybrid";
}

void NvjpegDecoder::dimensions(const JpegBytes& jpeg, int* width, int* height) const {
  int components = 0;
  nvjpegChromaSubsampling_t subsampling;
  int widths[NVJPEG_MAX_COMPONENT];
  int heights[NVJPEG_MAX_COMPONENT];
  if (nvjpegGetImageInfo(impl_->hybrid.handle, jpeg.data, jpeg.size, &components, &subsampling,
                         widths, heights) != NVJPEG_STATUS_SUCCESS)
    throw SampleError(jpeg.name, "nvJPEG cannot read the JPEG header");
  *width = widths[0];
  *height = heights[0];
}

void NvjpegDecoder::decode_batch(const std::vector<JpegBytes>& jpegs,
                                 const std::vector<uint8_t*>& outs, cudaStream_t stream) {
  if (jpegs.empty()) return;
  // Baseline images go to the hardware engine (where there is one), the others to the hybrid
  // backend, so one progressive file does not send its whole batch down the slower path.
  std::vector<JpegBytes> hw_jpegs, sw_jpegs;
  std::vector<uint8_t*> hw_outs, sw_outs;
  for (size_t i = 0; i < jpegs.size(); ++i) {
    bool hw = impl_->hardware.handle && is_baseline(jpegs[i].data, jpegs[i].size);
    (hw ? hw_jpegs : sw_jpegs).push_back(jpegs[i]);
    (hw ? hw_outs : sw_outs).push_back(outs[i]);
  }
  auto sizes_of = [this](const std::vector<JpegBytes>& batch) {
    std::vector<std::pair<int, int>> sizes(batch.size());
    for (size_t i = 0; i < batch.size(); ++i)
      dimensions(batch[i], &sizes[i].first, &sizes[i].second);
    return sizes;
  };
  if (!hw_jpegs.empty()) {
    // The hardware engine ignores stream order (nvjpeg_decode.h): nothing may still be queued.
    cudaError_t st = cudaStreamSynchronize(stream);
    if (st != cudaSuccess)
      throw Error(std::string("waiting for the GPU's earlier work before a hardware JPEG decode: ") +
                  cudaGetErrorString(st));
  }
  if (!hw_jpegs.empty() && impl_->hardware.decode(hw_jpegs, hw_outs, sizes_of(hw_jpegs), stream) !=
                               NVJPEG_STATUS_SUCCESS) {
    // Refused (an unsupported subsampling, say): the hybrid backend takes them too.
    sw_jpegs.insert(sw_jpegs.end(), hw_jpegs.begin(), hw_jpegs.end());
    sw_outs.insert(sw_outs.end(), hw_outs.begin(), hw_outs.end());
  }
  if (sw_jpegs.empty()) return;
  nvjpegStatus_t s = impl_->hybrid.decode(sw_jpegs, sw_outs, sizes_of(sw_jpegs), stream);
  if (s != NVJPEG_STATUS_SUCCESS)
    throw SampleError(
        sw_jpegs.size() == 1 ? sw_jpegs[0].name : sw_jpegs[0].name + " (or another of its batch)",
        "nvJPEG decode failed (status " + std::to_string(static_cast<int>(s)) + ")");
}

}  // namespace batchcast
