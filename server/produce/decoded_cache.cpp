#include "server/produce/decoded_cache.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "common/error.h"

namespace batchcast {
namespace {

// Pages are reserved in blocks this large: few fallocate calls, little reserved and unused.
constexpr uint64_t kReserveBlock = uint64_t{64} << 20;

std::string errno_text() { return std::strerror(errno); }

}  // namespace

uint64_t DecodedCache::image_bytes(int width, int height) {
  return (uint64_t{3} * width * height + 7) & ~uint64_t{7};
}

DecodedCache::DecodedCache(uint64_t samples, int side, uint64_t capacity)
    : side_(side), capacity_(capacity), entries_(new Entry[samples]) {
  static std::atomic<uint32_t> made{0};
  const std::string name = "/batchcast-cache-" + std::to_string(::getpid()) + "-" +
                           std::to_string(made.fetch_add(1));
  fd_ = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd_ < 0)
    throw Error("decoded cache: cannot create shared memory " + name + ": " + errno_text() +
                "; check /dev/shm, or serve without --cache");
  ::shm_unlink(name.c_str());  // lives as long as the mapping, whatever ends the process
  if (capacity_ == 0) return;
  if (::ftruncate(fd_, static_cast<off_t>(capacity_)) != 0 ||
      (base_ = static_cast<uint8_t*>(::mmap(nullptr, capacity_, PROT_READ | PROT_WRITE,
                                            MAP_SHARED | MAP_NORESERVE, fd_, 0))) == MAP_FAILED) {
    const std::string why = errno_text();
    base_ = nullptr;
    ::close(fd_);
    throw Error("decoded cache: cannot map " + std::to_string(capacity_) + " bytes: " + why +
                "; give a smaller --cache-memory");
  }
}

DecodedCache::~DecodedCache() {
  if (base_) ::munmap(base_, capacity_);
  if (fd_ >= 0) ::close(fd_);
}

std::optional<RgbView> DecodedCache::find(uint64_t index) {
  Entry& e = entries_[index];
  if (e.state.load(std::memory_order_acquire) != kFilled) {
    misses_.fetch_add(1, std::memory_order_relaxed);
    return std::nullopt;
  }
  hits_.fetch_add(1, std::memory_order_relaxed);
  return RgbView{base_ + e.offset, e.width, e.height, static_cast<size_t>(e.width) * 3};
}

std::optional<uint64_t> DecodedCache::allocate(uint64_t bytes) {
  std::lock_guard lk(allocate_mu_);
  if (full_.load(std::memory_order_relaxed)) return std::nullopt;
  if (used_ + bytes > reserved_) {
    // A new block, which the image starts: an image never spans two blocks (a GPU pool pins each
    // block on its own, and one copy cannot read two pinned ranges). The rest of the last block
    // stays unused.
    uint64_t block = std::min(std::max(kReserveBlock, bytes), capacity_ - reserved_);
    // tmpfs allocates the pages now: a full /dev/shm fails here, not as SIGBUS on a write.
    if (block < bytes ||
        ::posix_fallocate(fd_, static_cast<off_t>(reserved_), static_cast<off_t>(block)) != 0) {
      full_ = true;
      return std::nullopt;
    }
    if (reserved_hook_) reserved_hook_(base_ + reserved_, block);
    used_ = reserved_;
    reserved_ += block;
  }
  const uint64_t offset = used_;
  used_ += bytes;
  return offset;
}

void DecodedCache::on_reserve(Reserved reserved) {
  std::lock_guard lk(allocate_mu_);
  reserved_hook_ = std::move(reserved);
  if (reserved_hook_ && reserved_) reserved_hook_(base_, reserved_);
}

std::optional<RgbView> DecodedCache::insert(uint64_t index, const RgbView& image) {
  Entry& e = entries_[index];
  uint8_t empty = kEmpty;
  if (!e.state.compare_exchange_strong(empty, kFilling, std::memory_order_acq_rel))
    return std::nullopt;
  const uint64_t bytes = image_bytes(image.width, image.height);
  const std::optional<uint64_t> offset = allocate(bytes);
  if (!offset) {
    e.state.store(kEmpty, std::memory_order_release);
    return std::nullopt;
  }
  const RgbView kept = copy_packed(image, base_ + *offset);
  e.width = image.width;
  e.height = image.height;
  e.offset = *offset;
  e.state.store(kFilled, std::memory_order_release);
  images_.fetch_add(1, std::memory_order_relaxed);
  bytes_.fetch_add(bytes, std::memory_order_relaxed);
  return kept;
}

DecodedCache::Stats DecodedCache::stats() const {
  Stats s;
  s.hits = hits_.load();
  s.misses = misses_.load();
  s.images = images_.load();
  s.bytes = bytes_.load();
  s.capacity = capacity_;
  s.full = full_.load();
  return s;
}

}  // namespace batchcast
