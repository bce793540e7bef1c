#include "shm/write_fault.h"

#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <mutex>

#include "common/error.h"

namespace batchcast {
namespace {

// A slot's state, shared between the handler and discard_writes.
constexpr uint8_t kShared = 0;   // the server's pages, read-only
constexpr uint8_t kMapping = 1;  // being re-mapped (either way) by one thread
constexpr uint8_t kPrivate = 2;  // copy-on-write: this process's writes are in it
static_assert(std::atomic<uint8_t>::is_always_lock_free &&
                  std::atomic<uintptr_t>::is_always_lock_free,
              "the SIGSEGV handler must not take locks");

struct Watched {
  std::atomic<uintptr_t> begin{0};  // 0: free; kClaimed: being filled in
  std::atomic<uintptr_t> end{0};
  // Written before `begin` is published, read by the handler.
  uint64_t slot_bytes = 0;
  int fd = -1;
  uint64_t file_offset = 0;
  std::atomic<uint8_t>* state = nullptr;
  OnWrite on_write = OnWrite::kFail;
  char message[400] = {};
  size_t length = 0;
};

constexpr uintptr_t kClaimed = 1;
Watched g_watched[kMaxWatchedMappings];
struct sigaction g_previous {};
std::once_flag g_installed;

void write_all(const char* text, size_t length) noexcept {
  while (length > 0) {
    ssize_t n = ::write(STDERR_FILENO, text, length);
    if (n <= 0) return;
    text += n;
    length -= static_cast<size_t>(n);
  }
}

// Re-maps the slot holding `address` copy-on-write. True when the faulting write can be retried:
// this thread re-mapped the slot, or another thread is doing so or has done so (its write
// faulted before the re-map: re-mapping again would drop what was written since).
bool copy_slot(const Watched& w, uintptr_t begin, uintptr_t address) noexcept {
  const uint64_t slot = (address - begin) / w.slot_bytes;
  std::atomic<uint8_t>& state = w.state[slot];
  uint8_t expected = kShared;
  if (!state.compare_exchange_strong(expected, kMapping, std::memory_order_acq_rel)) return true;
  // The raw system call: mmap is not async-signal-safe by POSIX's list, and a sanitizer's
  // interceptor of it may take locks. Every argument a long, as syscall(2) reads them.
  const auto at = static_cast<long>(begin + slot * w.slot_bytes);
  const long mapped = ::syscall(SYS_mmap, at, static_cast<long>(w.slot_bytes),
                                static_cast<long>(PROT_READ | PROT_WRITE),
                                static_cast<long>(MAP_PRIVATE | MAP_FIXED), static_cast<long>(w.fd),
                                static_cast<long>(w.file_offset + slot * w.slot_bytes));
  const bool ok = mapped == at;
  state.store(ok ? kPrivate : kShared, std::memory_order_release);
  return ok;
}

void on_segv(int sig, siginfo_t* info, void* context) {
  const int saved_errno = errno;
  const auto address = reinterpret_cast<uintptr_t>(info ? info->si_addr : nullptr);
  for (auto& w : g_watched) {
    const uintptr_t begin = w.begin.load(std::memory_order_acquire);
    if (begin <= kClaimed || address < begin || address >= w.end.load(std::memory_order_relaxed))
      continue;
    // SEGV_ACCERR: a write into a present, read-only page (reads of the mapping never fault).
    if (w.on_write == OnWrite::kCopy && info->si_code == SEGV_ACCERR &&
        copy_slot(w, begin, address)) {
      errno = saved_errno;
      return;  // the faulting write runs again, now into a copy-on-write page
    }
    write_all(w.message, w.length);
    break;
  }
  errno = saved_errno;
  // Chain: what would have happened without us.
  if (g_previous.sa_flags & SA_SIGINFO) {
    if (g_previous.sa_sigaction) return g_previous.sa_sigaction(sig, info, context);
  } else if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN) {
    return g_previous.sa_handler(sig);
  }
  // Default action: returning re-executes the faulting write, which now kills the process.
  ::signal(sig, SIG_DFL);
}

void install() {
  struct sigaction sa {};
  sa.sa_sigaction = on_segv;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  ::sigaction(SIGSEGV, &sa, &g_previous);
}

}  // namespace

SlotWrites::SlotWrites(uint8_t* slots, uint64_t slot_bytes, uint32_t slot_count, int fd,
                       uint64_t file_offset, const std::string& segment_name, OnWrite on_write)
    : state_(std::make_unique<std::atomic<uint8_t>[]>(slot_count)),
      slots_(slots),
      slot_bytes_(slot_bytes),
      slot_count_(slot_count),
      fd_(fd),
      file_offset_(file_offset) {
  if (slots == nullptr || slot_bytes == 0 || slot_count == 0) return;
  std::call_once(g_installed, install);
  for (int i = 0; i < kMaxWatchedMappings; ++i) {
    Watched& w = g_watched[i];
    uintptr_t expected = 0;
    // Claim a free entry with a placeholder so that no other thread takes it.
    if (!w.begin.compare_exchange_strong(expected, kClaimed, std::memory_order_acq_rel)) continue;
    w.slot_bytes = slot_bytes;
    w.fd = fd;
    w.file_offset = file_offset;
    w.state = state_.get();
    w.on_write = on_write;
    const char* name = segment_name.c_str();
    int n = on_write == OnWrite::kFail
                ? std::snprintf(w.message, sizeof(w.message),
                                "\nbatchcast: write into read-only shared memory /dev/shm/%s (a "
                                "zero-copy batch). Batches are read-only views of the server's "
                                "pool, shared with the other consumers: .clone() a tensor before "
                                "modifying it in place.\n",
                                name)
                : std::snprintf(w.message, sizeof(w.message),
                                "\nbatchcast: cannot give this process its own copy of a slot of "
                                "/dev/shm/%s for an in-place write into a zero-copy batch (mmap "
                                "failed: out of memory, or of memory mappings: vm.max_map_count). "
                                ".clone() a tensor before modifying it in place.\n",
                                name);
    w.length = n < 0 ? 0 : std::min(static_cast<size_t>(n), sizeof(w.message) - 1);
    w.end.store(reinterpret_cast<uintptr_t>(slots) + slot_bytes * slot_count,
                std::memory_order_relaxed);
    w.begin.store(reinterpret_cast<uintptr_t>(slots), std::memory_order_release);
    entry_ = i;
    return;
  }
  throw Error("cannot watch the pool /dev/shm/" + segment_name +
              " for in-place writes: this process has " + std::to_string(kMaxWatchedMappings) +
              " batchcast pools mapped already; close the Loaders it no longer uses");
}

SlotWrites::SlotWrites(SlotWrites&& o) noexcept
    : entry_(o.entry_),
      state_(std::move(o.state_)),
      slots_(o.slots_),
      slot_bytes_(o.slot_bytes_),
      slot_count_(o.slot_count_),
      fd_(o.fd_),
      file_offset_(o.file_offset_) {
  o.entry_ = -1;
}

SlotWrites& SlotWrites::operator=(SlotWrites&& o) noexcept {
  if (this != &o) {
    reset();
    entry_ = o.entry_;
    state_ = std::move(o.state_);
    slots_ = o.slots_;
    slot_bytes_ = o.slot_bytes_;
    slot_count_ = o.slot_count_;
    fd_ = o.fd_;
    file_offset_ = o.file_offset_;
    o.entry_ = -1;
  }
  return *this;
}

SlotWrites::~SlotWrites() { reset(); }

void SlotWrites::reset() noexcept {
  if (entry_ >= 0) g_watched[entry_].begin.store(0, std::memory_order_release);
  entry_ = -1;
}

void SlotWrites::discard_writes(uint32_t slot) const noexcept {
  if (entry_ < 0 || slot >= slot_count_) return;
  std::atomic<uint8_t>& state = state_[slot];
  uint8_t expected = kPrivate;
  if (!state.compare_exchange_strong(expected, kMapping, std::memory_order_acq_rel)) return;
  uint8_t* at = slots_ + slot * slot_bytes_;
  const auto offset = static_cast<off_t>(file_offset_ + slot * slot_bytes_);
  if (::mmap(at, slot_bytes_, PROT_READ, MAP_SHARED | MAP_FIXED, fd_, offset) != MAP_FAILED) {
    state.store(kShared, std::memory_order_release);
    return;
  }
  // Out of memory mappings: the slot stays copy-on-write, but without this process's copies, so
  // that its next chunk still reads as the server wrote it (pages never written follow the
  // server's; the next discard tries the re-map again).
  (void)::madvise(at, slot_bytes_, MADV_DONTNEED);
  state.store(kPrivate, std::memory_order_release);
}

}  // namespace batchcast
