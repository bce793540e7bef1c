// RAII owner of one TurboJPEG handle (tjhandle).
//
// Contract: TjHandle owns exactly one handle from tjInitDecompress/tjInitCompress and destroys it
// in its noexcept destructor. Move-only. Not thread-safe: a TurboJPEG handle holds per-call state,
// so each thread uses its own (ImagePipeline keeps one thread_local decompressor per thread).
#pragma once

#include <turbojpeg.h>

#include <string>
#include <utility>

#include "common/error.h"

namespace batchcast {

class TjHandle {
 public:
  enum class Kind { kDecompress, kCompress };

  explicit TjHandle(Kind kind)
      : handle_(kind == Kind::kDecompress ? tjInitDecompress() : tjInitCompress()) {
    if (handle_ == nullptr) {
      throw Error(std::string("TurboJPEG: cannot create a handle: ") + tjGetErrorStr2(nullptr));
    }
  }
  ~TjHandle() noexcept {
    if (handle_ != nullptr) tjDestroy(handle_);
  }
  TjHandle(TjHandle&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
  TjHandle& operator=(TjHandle&& other) noexcept {
    if (this != &other) {
      if (handle_ != nullptr) tjDestroy(handle_);
      handle_ = std::exchange(other.handle_, nullptr);
    }
    return *this;
  }
  TjHandle(const TjHandle&) = delete;
  TjHandle& operator=(const TjHandle&) = delete;

  tjhandle get() const { return handle_; }
  // The message of the last failed call on this handle.
  std::string last_error() const { return tjGetErrorStr2(handle_); }

 private:
  tjhandle handle_;
};

// Memory returned by tjCompress2 (allocated with tjAlloc); freed with tjFree.
class TjBuffer {
 public:
  TjBuffer() = default;
  ~TjBuffer() noexcept { tjFree(data_); }
  TjBuffer(const TjBuffer&) = delete;
  TjBuffer& operator=(const TjBuffer&) = delete;

  unsigned char** out_ptr() { return &data_; }
  const unsigned char* data() const { return data_; }

 private:
  unsigned char* data_ = nullptr;
};

}  // namespace batchcast
