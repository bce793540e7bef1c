// ChunkCopy: a private chunk (regenerated for this consumer alone, protocol::is_private_seq)
// copied out of its slot by the session's I/O thread as soon as its descriptor arrives, so the
// slot goes back to the server at once instead of when the user has read the chunk.
//
// Why (docs/stream.md, "Catch-up"): private chunks are not shared, so slots held by consumers
// catching up add up. Were each to keep its chunks in their slots while its user holds its
// batches or does not read (several loaders read in lockstep by one thread), a few of them could
// take every slot the server reserves for catching up and leave none a next one: the stream would
// stall. Copied on arrival, a private chunk occupies a slot only while it is filled and in
// transit, whatever the users do. The price is one copy of each private chunk, the batches cut
// from it being views of that copy (Batch::copied).
//
// The copy holds the slot's bytes [0, end of its last tensor), so the descriptor's offsets and
// strides apply to data() unchanged. Host pools copy with memcpy; GPU pools (CUDA builds,
// CudaChunkCopier in client/cuda_assembler.h) device to device, the slot released once that
// copy has completed on the device.
// Ownership: a copy is shared by the ChunkRef of its chunk (and the session's queue before
// that); it frees its memory when the last owner lets it go, which for GPU memory the session
// delays until the readers' fences have passed (Session::free_copy). The copier belongs to the
// session. Thread-safety: copy() from the session's I/O thread only; a copy may be destroyed on
// any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "client/session.h"
#include "protocol/messages.h"
#include "shm/slot_memory.h"

namespace batchcast {

class ChunkCopy {
 public:
  virtual ~ChunkCopy() = default;
  // The copied bytes: host memory, or a device pointer on the pool's GPU.
  const uint8_t* data() const { return data_; }

 protected:
  const uint8_t* data_ = nullptr;
};

class ChunkCopier {
 public:
  // The copier for the memory the pool's slots are in.
  static std::unique_ptr<ChunkCopier> create(const SlotMemory& memory);
  virtual ~ChunkCopier() = default;

  struct Copied {
    std::shared_ptr<ChunkCopy> copy;
    // The slot may be released once these have passed (none: at once).
    std::vector<std::shared_ptr<ReleaseFence>> release_after;
  };
  // Copies the tensors of a validated descriptor out of its slot. Throws Error when it cannot
  // (out of memory); the chunk then stays in its slot.
  virtual Copied copy(const protocol::ChunkDescriptor& d) = 0;
};

// Bytes of a slot that hold a validated descriptor's tensors: up to the end of the last one.
uint64_t chunk_bytes(const protocol::ChunkDescriptor& d);

}  // namespace batchcast
