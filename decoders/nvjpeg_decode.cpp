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
    throw Error("nvJPEG decoder: nvjpegCreateEx failed (is libnvjpeg from the CUDA toolkit "
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
  std::vector<std::pair<int, int>> sizes(jpegs.size());
  for (size_t i = 0; i < jpegs.size(); ++i) dimensions(jpegs[i], &sizes[i].first, &sizes[i].second);
  if (impl_->hardware.handle &&
      impl_->hardware.decode(jpegs, outs, sizes, stream) == NVJPEG_STATUS_SUCCESS)
    return;
  nvjpegStatus_t s = impl_->hybrid.decode(jpegs, outs, sizes, stream);
  if (s != NVJPEG_STATUS_SUCCESS)
    throw SampleError(jpegs.size() == 1 ? jpegs[0].name : jpegs[0].name + " (or another of its batch)",
                      "nvJPEG decode failed (status " + std::to_string(static_cast<int>(s)) + ")");
}

}  // namespace batchcast
