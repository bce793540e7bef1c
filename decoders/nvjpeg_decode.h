// NvjpegDecoder: JPEG decoding on the GPU with nvJPEG, to interleaved RGB (HWC uint8) in device
// memory. Baseline JPEGs go to the hardware JPEG engines (NVJPEG_BACKEND_HARDWARE, A100/H100 class
// GPUs) where present, everything else (progressive files; all files on GPUs without the engine)
// to nvJPEG's default hybrid CPU+GPU backend; a group the hardware backend refuses (an unusual
// subsampling) is decoded again with the hybrid one.
// Compiled only where CMake finds nvjpeg.h (BATCHCAST_HAVE_NVJPEG); output agrees with the CPU
// decoder (decode_jpeg_full_turbo) within a few levels (different IDCT and chroma upsampling).
//
// The hardware backend does not honour stream order: nvjpegDecodeBatched starts writing its
// outputs (and reallocating its own buffers) while work queued earlier on the stream it is given
// has not run. Called while the previous chunk's kernels still read the output buffer, it
// overwrites their input; called while its own previous batch is still in flight, it can block for
// ever in a cuMemFree inside the library (the server's uploader then hangs there, its chunks'
// events never complete, and every consumer waits on them). So decode_batch() drains `stream` on
// the host before each hardware call: the engine's work then never overlaps the stream's, at the
// cost of the host waiting for the previous chunk's GPU work, which the engine would have waited
// for anyway.
//
// Ownership: owns its nvJPEG handles and states (RAII, move-only, destroyed in the destructor).
// Thread-safety: one thread at a time per decoder; use one decoder per thread.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace batchcast {

struct JpegBytes {
  const uint8_t* data = nullptr;
  size_t size = 0;
  std::string name;  // reported in errors
};

class NvjpegDecoder {
 public:
  explicit NvjpegDecoder(int device);
  ~NvjpegDecoder();
  NvjpegDecoder(NvjpegDecoder&&) noexcept;
  NvjpegDecoder& operator=(NvjpegDecoder&&) noexcept;

  // "hardware" or "hybrid".
  const char* backend() const;
  // Width and height from the header; throws SampleError naming the file when it is not a JPEG.
  void dimensions(const JpegBytes& jpeg, int* width, int* height) const;
  // Decodes every image into outs[i] (device memory, width*height*3 bytes, see dimensions()).
  // Work is enqueued on `stream`; the call returns once it has been submitted. With images for
  // the hardware engine, it first waits (on the host) until `stream` is idle (above).
  void decode_batch(const std::vector<JpegBytes>& jpegs, const std::vector<uint8_t*>& outs,
                    cudaStream_t stream);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace batchcast
