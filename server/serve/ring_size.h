// The host memory budgets of a server: the ring's and the decoded cache's.
//
// How many slots a host pool gets when `--ring` is not given: as many as a memory budget holds,
// so that readers of different speeds drift apart inside the ring (a slow or paused trainer
// costs the others nothing until the window is used up) instead of being decoupled at once.
//
// The budget by default is what the host can spare without a second thought: at most 1 GiB, a
// sixteenth of the memory available and a quarter of the free space of /dev/shm (the pool is
// reserved there in full when it is created). One budget covers a stream and its views: a slot
// index holds a chunk in every view's pool, so the budget buys slots of all the views' slot bytes
// together, and a view added later shrinks the ring to keep within it (StreamHostOptions::
// ring_budget). The slot count stays within [kMinRingSlots, kMaxRingSlots], and never above an
// epoch's chunks plus the producer's lead (a window of a whole epoch: more holds chunks of an
// epoch a reader has already finished or will be sent again): the floor is a GPU pool's ring;
// the cap bounds the server's per-chunk bookkeeping. A GPU pool keeps kMinRingSlots: device memory belongs to the trainers, and a
// budget read from the GPU's free memory at start cannot see what trainers starting afterwards
// will allocate (a wrong guess is a trainer out of memory, not a slower server); and the nvJPEG
// stage keeps host memory per slot position (each file's bytes, pinned CPU squares under
// --decoder mixed), which a ring of small slots sized by a device budget would multiply.
//
// Pure functions over a HostMemory reading, so the rule is tested without the host's state;
// read_host_memory() is the one place that reads it. Thread-safe.
#pragma once

#include <cstdint>

namespace batchcast {

constexpr uint32_t kMinRingSlots = 8;
constexpr uint32_t kMaxRingSlots = 1024;
// How far the producer runs ahead of every reader in a memory-sized ring (StreamRules::
// lead_chunks): a GPU pool's ring depth, enough to keep the workers busy.
constexpr uint32_t kRingLeadChunks = 8;
constexpr uint64_t kMaxRingMemory = uint64_t{1} << 30;

struct HostMemory {
  uint64_t available = 0;  // MemAvailable of /proc/meminfo, bytes
  uint64_t shm_free = 0;   // free bytes of the filesystem at /dev/shm
};

// The host's reading; a field it cannot read is 0 (and then does not limit the budget).
HostMemory read_host_memory();

// min(kMaxRingMemory, available / 16, shm_free / 4), ignoring fields that are 0.
uint64_t default_ring_memory(const HostMemory& host);

// The decoded cache's budget when `--cache-memory` is not given (server/produce/decoded_cache.h):
// half of what is available and of the free space of /dev/shm (its pages are reserved there as
// it fills, after the ring took its own), ignoring fields that are 0; 1 GiB if neither is known.
uint64_t default_cache_memory(const HostMemory& host);

// budget / bytes_per_slot (a slot index's bytes over every view), clamped to [kMinRingSlots,
// kMaxRingSlots], then to at most epoch_chunks + kRingLeadChunks (epoch_chunks 0: no bound).
uint32_t ring_slots_for(uint64_t budget, uint64_t bytes_per_slot, uint64_t epoch_chunks = 0);

}  // namespace batchcast
