// Write faults in a consumer's view of the pool's slots: private copies on demand, or a message.
//
// Consumers map a host pool read-only and shared (shm/shared_segment.h): reading costs nothing
// more than the server's own pages. A SlotWrites registers that mapping's slots with a SIGSEGV
// handler, which decides what an in-place write (x.mul_(2) on a zero-copy batch) does:
// - OnWrite::kCopy (every host consumer but a page-locked one): the handler re-maps the written
//   slot copy-on-write (MAP_PRIVATE | MAP_FIXED, read and write, same descriptor and offset),
//   marks it written, and returns: the write is retried and the kernel gives the writer a
//   private copy of each page it writes, which the server and the other consumers never see.
//   discard_writes(slot), called once no batch views the slot, maps a slot marked written
//   shared and read-only again (its private pages are dropped, so the slot's next chunk reads as
//   the server wrote it) and costs nothing for a slot never written.
// - OnWrite::kFail (a consumer's pool page-locked for DMA, cudaHostRegister: remapping memory
//   under the driver's registration is not allowed): the handler prints
//   "write into read-only shared memory /dev/shm/NAME (a zero-copy batch) ... .clone() it first"
//   and the process dies as it would have.
// A write it cannot serve (outside registered slots, a re-map that fails, kFail) goes on to the
// handler that was there before (Python's faulthandler, a sanitizer's, or the default action,
// which ends the process with its usual status and core dump), after the message where it has one.
//
// Requirements: slots start and end on page boundaries (SlotPool aligns them to the page size),
// so re-mapping a slot never touches its neighbours' pages; the descriptor stays open while the
// SlotWrites lives (the owner declares it after the segment, so it is destroyed first).
// A handler installed after the first SlotWrites that does not chain to the previous one (e.g.
// faulthandler.enable() called later) sees these faults first: in-place writes then crash.
// Ownership and lifetime: move-only RAII registration, at most kMaxWatchedMappings at once in a
// process (one more throws Error). The SIGSEGV handler is installed on first use and stays.
// Thread-safety: the handler may run on any thread, and is lock-free and async-signal-safe
// (fixed table of atomics, raw mmap syscall, errno preserved). Concurrent writes into one slot
// are safe: one thread re-maps, the others retry their writes until it has. discard_writes(slot)
// may run on any thread, concurrently with writes into other slots, never while a pointer into
// that slot is in use (its pages change under it).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace batchcast {

constexpr int kMaxWatchedMappings = 64;

enum class OnWrite { kCopy, kFail };

class SlotWrites {
 public:
  SlotWrites() = default;  // watches nothing
  // Watches `slot_count` slots of `slot_bytes` each from `slots` (page-aligned), mapped from
  // descriptor `fd` at file offset `file_offset`; `segment_name` goes into the messages.
  // Throws Error when kMaxWatchedMappings are watched already.
  SlotWrites(uint8_t* slots, uint64_t slot_bytes, uint32_t slot_count, int fd, uint64_t file_offset,
             const std::string& segment_name, OnWrite on_write);
  SlotWrites(SlotWrites&& o) noexcept;
  SlotWrites& operator=(SlotWrites&& o) noexcept;
  SlotWrites(const SlotWrites&) = delete;
  SlotWrites& operator=(const SlotWrites&) = delete;
  ~SlotWrites();

  // Maps a slot written into (kCopy) shared and read-only again, dropping this process's
  // writes; no-op (no system call) for a slot never written.
  void discard_writes(uint32_t slot) const noexcept;

 private:
  void reset() noexcept;

  int entry_ = -1;  // index into the handler's table; -1: nothing watched
  std::unique_ptr<std::atomic<uint8_t>[]> state_;  // per slot, shared with the handler
  uint8_t* slots_ = nullptr;
  uint64_t slot_bytes_ = 0;
  uint32_t slot_count_ = 0;
  int fd_ = -1;
  uint64_t file_offset_ = 0;
};

}  // namespace batchcast
