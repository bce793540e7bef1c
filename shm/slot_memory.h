// SlotMemory: where a pool's slots live, host shared memory or a GPU arena, behind one type.
//
// A host pool's slots are in its SlotPool segment. A GPU pool (--device cuda:K, CUDA builds)
// keeps only the header and sequence words in the segment; its slots are in the server's
// ArenaSet, one arena per GPU it serves (shm/arena_set.h), and a consumer opens the arena of its
// own GPU as an ArenaMapping. Everything that reads or writes a slot asks slot_data(slot) here
// (the server: the primary arena's) and never needs to know which kind of pool it has.
//
// Factories: the server create()s (segment + arena) and describe()s it into the Welcome; a
// consumer attach()es from that Welcome. A CPU-only build refuses GPU pools with an Error.
// A consumer maps a host pool shared and read-only, and an in-place write into a batch makes the
// slot its own copy-on-write copy (shm/write_fault.h): the write changes only its own pages, and
// discard_writes(slot) maps the slot shared again once the batch is gone (nothing to do, and no
// cost, for slots it never wrote). A consumer that copies host batches to a GPU may ask attach()
// to page-lock the mapping in place (pin_host), once for the whole pool: copies from it are then
// asynchronous DMA that overlaps compute; writes into its batches are fatal (OnWrite::kFail,
// after a message naming .clone()): a slot cannot be re-mapped under the driver's registration.
// Failing to pin is an expected outcome (no GPU, a platform without read-only registration, the
// locked-memory limit): host_pinned() is false and pin_failure() says why; the pool is then
// attached again with copy-on-write writes and the consumer stages through pinned buffers.
// Ownership and lifetime: move-constructible only; owns the segment mapping and the arenas
// (server) or arena mapping (consumer), all freed on destruction. Pointers from slot_data() live as long as this.
// Thread-safety: const members may be called from any thread; slot contents are synchronised by
// the slot protocol (sequence words on the host, slot events on the GPU), not by this class.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "protocol/messages.h"
#include "shm/slot_pool.h"
#ifdef BATCHCAST_HAVE_CUDA
#include "shm/arena_set.h"
#include "shm/cuda_pool.h"
#endif

namespace batchcast {

class SlotMemory {
 public:
  // Server: creates the pool's segment and, unless `cuda_devices` is empty (a host pool), its
  // arenas on those GPUs (this process's indices; the first is the primary).
  static SlotMemory create(const std::string& segment_name, uint32_t slot_count,
                           uint64_t slot_bytes, const std::vector<int>& cuda_devices);
  // Consumer: maps the pool a Welcome announces: the segment and, for a GPU pool, the
  // arena on `cuda_device` (this process's index; -1: the current device if the pool has an arena
  // there, else the first of the pool's GPUs this process sees); an Error names the pool's GPUs
  // and the fix when none fits. pin_host: page-lock a host pool's slots (see above) for copies to
  // cuda_device (-1: the current device).
  static SlotMemory attach(const protocol::Welcome& welcome, bool pin_host = false,
                           int cuda_device = -1);

  SlotMemory(SlotMemory&&) noexcept;
  // No assignment: member-wise it would unmap the old pool before unregistering its pinning.
  SlotMemory& operator=(SlotMemory&&) = delete;
  ~SlotMemory();

  // Server: writes the pool's geometry and GPU handles into the Welcome that attach() reads.
  void describe(protocol::Welcome& welcome) const;

  SlotPool& pool() { return pool_; }
  const SlotPool& pool() const { return pool_; }
  // A slot's first byte: host memory, or a device pointer on cuda_device() for GPU pools (the
  // server: its primary GPU).
  uint8_t* slot_data(uint32_t slot) const;
  // Consumer, host pool: forgets what this process wrote into the slot, so that the slot's next
  // chunk reads as the server wrote it. Call it when no batch views the slot any more (before
  // releasing it); any thread. No-op (no system call) for a slot never written and GPU pools.
  void discard_writes(uint32_t slot) const { pool_.discard_writes(slot); }
  protocol::DeviceKind device() const {
    return cuda_device_ < 0 ? protocol::DeviceKind::kCpu : protocol::DeviceKind::kCuda;
  }
  // The GPU holding the slots this process reads or writes (its index); -1 for host pools.
  int cuda_device() const { return cuda_device_; }
  // Host pools attached with pin_host: whether the slots are page-locked, and if not, why.
  bool host_pinned() const { return pinned_; }
  const std::string& pin_failure() const { return pin_failure_; }

#ifdef BATCHCAST_HAVE_CUDA
  // GPU pools: the event recorded after the slot's chunk was written; nullptr for host pools.
  cudaEvent_t slot_event(uint32_t slot) const;
  // The server's arenas (staging code writes the primary, records its events and replicates);
  // nullptr in consumers and host pools.
  const ArenaSet* arenas() const { return arenas_.get(); }
#endif

 private:
  explicit SlotMemory(SlotPool pool);
  void pin_slots(int device);  // attach(pin_host): sets pinned_ or pin_failure_

  SlotPool pool_;
  int cuda_device_ = -1;
  bool pinned_ = false;
  std::string pin_failure_;
#ifdef BATCHCAST_HAVE_CUDA
  std::unique_ptr<ArenaSet> arenas_;       // server
  std::unique_ptr<ArenaMapping> mapping_;  // consumer
  // Declared after pool_, so destroyed first: unregistered before the segment is unmapped.
  std::optional<HostRegistration> registration_;
#endif
};

}  // namespace batchcast
