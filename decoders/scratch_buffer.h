// A reusable, uninitialised byte buffer for per-thread scratch space (decoded pixels, resized
// crops, file contents).
//
// Contract: owns its bytes (unique_ptr). Not thread-safe; callers keep one per thread
// (thread_local). Growing never zero-fills (the bytes are always overwritten by the caller), and a
// buffer that once grew above kKeepBytes is released again at the next smaller request, so one huge
// image does not pin hundreds of MB per thread for the life of the process.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace batchcast {

class ScratchBuffer {
 public:
  static constexpr size_t kKeepBytes = size_t{64} << 20;

  // Returns at least `bytes` writable bytes; previous contents are not kept.
  uint8_t* get(size_t bytes) {
    bool too_small = bytes > capacity_;
    bool oversized = capacity_ > kKeepBytes && bytes <= capacity_ / 2;
    if (too_small || oversized) {
      data_.reset();  // free first: peak memory is one buffer, not two
      capacity_ = 0;
      data_.reset(new uint8_t[bytes == 0 ? 1 : bytes]);
      capacity_ = bytes;
    }
    return data_.get();
  }
  uint8_t* data() { return data_.get(); }

 private:
  std::unique_ptr<uint8_t[]> data_;
  size_t capacity_ = 0;
};

}  // namespace batchcast
