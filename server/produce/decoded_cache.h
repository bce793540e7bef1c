// DecodedCache: the decoded cache (`serve --cache decoded`; docs/views.md, "Decoded cache"). The
// first time a sample is decoded its image is kept here as RGB8, its shorter side at most `side`
// (decoders/shrink_decode.h); every later epoch makes each view from it without reading or
// decoding the file (ImageSource).
//
// A budget, never an out-of-memory: the images are packed one after another into one
// shared-memory segment of at most `capacity` bytes, whose pages are reserved (fallocate) block by
// block as it fills (64 MiB blocks, or one image's bytes where larger; an image never spans two),
// so a /dev/shm that runs out stops the cache from growing (the samples that do not fit are
// decoded each epoch) instead of raising SIGBUS. Nothing is ever evicted: the first images
// decoded stay, and once one does not fit no more are admitted.
//
// Ownership and lifetime: the server's ImageSource owns it. The segment is created mode 0600 and
// unlinked at once, so it lives exactly as long as this object's mapping, and nothing of it is
// left in /dev/shm whatever ends the process (SIGKILL included).
//
// Thread-safety: find() and insert() from any number of producer workers at once. An image is
// written by the one insert() that claimed its sample, then published (release); find() sees it
// whole or not at all. stats() from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>

#include "decoders/rgb_view.h"

namespace batchcast {

class DecodedCache {
 public:
  // What the status line, the done line and summary.json report.
  struct Stats {
    uint64_t hits = 0;      // samples made from a cached image
    uint64_t misses = 0;    // samples decoded from their file
    uint64_t images = 0;    // images cached
    uint64_t bytes = 0;     // bytes they take
    uint64_t capacity = 0;  // the budget
    bool full = false;      // an image did not fit: no more are admitted
  };

  // A cache for the images of `samples` dataset indices, kept at `side` pixels on their shorter
  // side, in at most `capacity` bytes. Throws Error naming the fix when the segment cannot be made.
  DecodedCache(uint64_t samples, int side, uint64_t capacity);
  ~DecodedCache();
  DecodedCache(const DecodedCache&) = delete;
  DecodedCache& operator=(const DecodedCache&) = delete;

  int side() const { return side_; }
  // Calls `reserved(block, bytes)` for every block of the segment reserved from now on, under
  // the cache's allocation lock (a GPU pool pins them, so that uploads from the cache are
  // asynchronous copies), and for the blocks reserved before; an empty function stops that.
  // Thread-safe.
  using Reserved = std::function<void(uint8_t* block, uint64_t bytes)>;
  void on_reserve(Reserved reserved);
  // Sample `index`'s cached image, valid as long as the cache; counts a hit, or a miss when none.
  std::optional<RgbView> find(uint64_t index);
  // Keeps a copy of `image` as sample `index`'s and returns it (valid as long as the cache);
  // nullopt when the sample is cached (or being cached by another worker) already or the image
  // does not fit (then the cache is full).
  std::optional<RgbView> insert(uint64_t index, const RgbView& image);
  // Whether decoding a miss for the cache is still worth it: false once the cache is full.
  bool admitting() const { return !full_.load(std::memory_order_relaxed); }
  Stats stats() const;

  // The bytes of a width x height image in the cache (rows packed, 8-byte aligned).
  static uint64_t image_bytes(int width, int height);

 private:
  enum State : uint8_t { kEmpty, kFilling, kFilled };
  struct Entry {
    std::atomic<uint8_t> state{kEmpty};
    int32_t width = 0;
    int32_t height = 0;
    uint64_t offset = 0;
  };
  // Reserves `bytes` at the end of the packed images; nullopt when they do not fit.
  std::optional<uint64_t> allocate(uint64_t bytes);

  const int side_;
  const uint64_t capacity_;
  int fd_ = -1;
  uint8_t* base_ = nullptr;
  std::unique_ptr<Entry[]> entries_;
  std::mutex allocate_mu_;  // used_, reserved_, reserved_hook_
  uint64_t used_ = 0;
  uint64_t reserved_ = 0;   // bytes of the segment fallocate'd so far
  Reserved reserved_hook_;
  std::atomic<uint64_t> hits_{0}, misses_{0}, images_{0}, bytes_{0};
  std::atomic<bool> full_{false};
};

}  // namespace batchcast
