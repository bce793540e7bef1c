// SlotPool: the batch pool, a fixed array of K equal slots in one shared segment.
//
// Layout: a PoolHeader (magic, version, owner pid, geometry) followed by one sequence word per
// slot, then the slots, each starting and ending on a page boundary (4 KiB, or the machine's
// page size if larger: a consumer re-maps single slots, shm/write_fault.h). A device pool
// (--device cuda:K) keeps only the header and the sequence words here: its slots live in the GPU
// arena (shm/cuda_pool.h), and slot_bytes still gives their size. The server writes a chunk into a
// slot, then stores the chunk's stream sequence number into the slot's word (release order);
// consumers compare that word with the descriptor they were sent, a cheap guard that a slot
// they read holds the chunk they expect.
//
// Ownership: the server create()s the pool and owns the segment (see SharedSegment); consumers
// attach() it shared and read-only, and own the SlotWrites that decides what a write into a slot
// does (shm/write_fault.h): by default (OnWrite::kCopy) the slot becomes the consumer's own
// copy-on-write copy, until discard_writes(slot); a pool page-locked for DMA uses OnWrite::kFail
// (a write kills the process, after a message naming the fix). Naming:
// segment_name_for(endpoint) is unique per user and endpoint, so a restarted server finds (and
// removes) its dead predecessor's segment.
// Thread-safety: slot memory is written by one producer thread at a time per slot (the server's
// SlotRing hands each slot to one filler); the sequence words are atomics; discard_writes as
// SlotWrites::discard_writes (any thread, never while a pointer into that slot is in use).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <string>

#include "shm/shared_segment.h"
#include "shm/write_fault.h"

namespace batchcast {

struct PoolHeader {
  static constexpr uint64_t kMagic = 0x4c4f4f5054534342ull;  // "BCSTPOOL"
  static constexpr uint32_t kVersion = 1;
  static constexpr uint32_t kDeviceSlots = 1;
  uint64_t magic;
  uint32_t version;
  uint32_t owner_pid;
  uint32_t slot_count;
  uint32_t flags;  // kDeviceSlots: the slots are in GPU memory, not in this segment
  uint64_t slot_bytes;
  uint64_t slots_offset;
};

class SlotPool {
 public:
  static constexpr uint64_t kNoChunk = ~0ull;

  // Creates the pool's segment (0600) and writes its header; throws Error naming the segment.
  // host_slots=false: a device pool's segment (header and sequence words only).
  static SlotPool create(const std::string& segment_name, uint32_t slot_count, uint64_t slot_bytes,
                         bool host_slots = true);
  // Maps an existing pool shared and read-only, checks its header against the geometry the
  // server announced (throws Error naming the segment and the mismatch), and watches its host
  // slots for writes (see OnWrite).
  static SlotPool attach(const std::string& segment_name, uint32_t slot_count, uint64_t slot_bytes,
                         uint64_t slots_offset, OnWrite on_write = OnWrite::kCopy);

  SlotPool(SlotPool&&) noexcept = default;
  // Member-wise the old mapping would be unmapped while its slots were still watched.
  SlotPool& operator=(SlotPool&& o) noexcept {
    writes_ = std::move(o.writes_);
    segment_ = std::move(o.segment_);
    return *this;
  }

  uint32_t slot_count() const { return header()->slot_count; }
  uint64_t slot_bytes() const { return header()->slot_bytes; }
  uint64_t slots_offset() const { return header()->slots_offset; }
  const std::string& segment_name() const { return segment_.name(); }
  size_t segment_bytes() const { return segment_.size(); }
  bool host_slots() const { return !(header()->flags & PoolHeader::kDeviceSlots); }

  // A host slot's memory; nullptr in a device pool.
  uint8_t* slot_data(uint32_t slot) const {
    if (!host_slots()) return nullptr;
    return segment_.data() + header()->slots_offset + slot * header()->slot_bytes;
  }
  // A consumer: forgets what it wrote into a host slot's chunk (the slot is mapped shared again),
  // so that the slot's next chunk reads as the server wrote it; costs nothing if it wrote
  // nothing. No-op in the server and for device pools.
  void discard_writes(uint32_t slot) const { writes_.discard_writes(slot); }
  // Server: gives a host slot's memory back to the system (the pages of /dev/shm wholly inside
  // the slot are freed; a later write would allocate them again). For a slot that will hold no chunk any more. No-op
  // for device pools. Throws Error naming the segment if the system refuses.
  void release_slot_memory(uint32_t slot);
  // The stream sequence number of the chunk a slot holds (kNoChunk while being filled).
  uint64_t slot_seq(uint32_t slot) const { return seq_word(slot)->load(std::memory_order_acquire); }
  void set_slot_seq(uint32_t slot, uint64_t seq) {
    seq_word(slot)->store(seq, std::memory_order_release);
  }

  static size_t layout_bytes(uint32_t slot_count, uint64_t slot_bytes, uint64_t* slots_offset,
                             bool host_slots = true);

 private:
  explicit SlotPool(SharedSegment segment) : segment_(std::move(segment)) {}
  const PoolHeader* header() const { return reinterpret_cast<const PoolHeader*>(segment_.data()); }
  std::atomic<uint64_t>* seq_word(uint32_t slot) const {
    return reinterpret_cast<std::atomic<uint64_t>*>(segment_.data() + sizeof(PoolHeader)) + slot;
  }

  SharedSegment segment_;
  SlotWrites writes_;  // consumers' host slots; declared after segment_: destroyed before it
};

// The pool segment name for a server endpoint: "batchcast.<uid>.<hash of endpoint>".
std::string segment_name_for(const std::string& endpoint);

// Removes this user's batchcast segments whose owner process is dead. Returns how many.
int remove_stale_segments();

}  // namespace batchcast
