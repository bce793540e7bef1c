// ArenaSet: the server's GPU pool on one or several GPUs (`serve --device cuda:0,cuda:1`, `all`).
//
// A chunk is decoded once and written once, into the primary arena (the first GPU listed: where
// nvJPEG decodes and where CPU-decoded chunks are uploaded). replicate() then copies the slot to
// the arena of every other GPU, each copy on that GPU's own stream after the primary's write,
// and records that arena's slot event after its copy. A consumer opens the arena of its own GPU
// and waits on that arena's event, so every consumer reads zero-copy on its GPU. The slot book
// (SlotRing) is one for all GPUs: a slot is refilled only when the consumers of every GPU
// released it, and a slow GPU's consumers hold the others back exactly as the stall policy says.
//
// Copies are peer copies (cudaMemcpyPeerAsync): over NVLink or PCIe where the two GPUs can access
// each other (peer access is enabled at construction), staged through host memory by the driver
// where they cannot. *Why copies of the finished slot rather than an upload and a conversion per
// GPU:* nvJPEG's output exists only on the primary GPU, and one path serves both decoders.
//
// Thread-safety: replicate() and wait_for_slot() may be called from any thread, but calls for one
// slot are ordered by the producer (a slot is written, replicated, then waited for before it is
// written again). Ownership: owns its arenas and copy streams; created by SlotMemory (server),
// destroyed with it after the stages that borrow it. CUDA builds only.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shm/cuda_pool.h"

namespace batchcast {

class ArenaSet {
 public:
  // One arena of slot_count x slot_bytes on each of `devices` (this process's indices, distinct
  // GPUs; the first is the primary). Throws Error naming the device that failed.
  ArenaSet(const std::vector<int>& devices, uint32_t slot_count, uint64_t slot_bytes);
  ~ArenaSet();
  ArenaSet(const ArenaSet&) = delete;
  ArenaSet& operator=(const ArenaSet&) = delete;

  const DeviceArena& primary() const { return arenas_.front(); }
  const std::vector<DeviceArena>& arenas() const { return arenas_; }
  // Call right after the slot's last write was enqueued on `written_on` (a stream of the
  // primary GPU): copies its first `bytes` to every other arena, after that write, and records
  // their events. Throws Error.
  void replicate(uint32_t slot, uint64_t bytes, cudaStream_t written_on) const;
  // Blocks until the slot's last write and all its copies are done: its staging and the primary
  // slot may be written again. Throws Error.
  void wait_for_slot(uint32_t slot) const;
  // "cuda:0 -> cuda:1 peer, cuda:2 through the host": how copies travel, for the server's log.
  std::string describe_copies() const;

 private:
  std::vector<DeviceArena> arenas_;
  std::vector<CudaStream> streams_;  // [k]: copies into arenas_[k] (k >= 1), on its device
  std::vector<bool> peer_;           // [k]: arenas_[k]'s GPU reads the primary's directly
  // [slot]: recorded on the primary after the slot's write, waited on by the copies. *Why not
  // the slot's own event:* that one is interprocess, for consumers; a plain event is what
  // another device's stream is documented to wait on.
  std::vector<CudaEvent> written_;
};

}  // namespace batchcast
