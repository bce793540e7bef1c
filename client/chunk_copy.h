// ChunkCopy: a chunk copied out of its slot by the session's I/O thread as soon as its
// descriptor arrives, so the slot goes back to the server at once instead of when the user has
// read the chunk. Two kinds of chunk are: private chunks (regenerated for this consumer alone,
// protocol::is_private_seq), and the rows a relaxed consumer takes of a slot's chunk
// (protocol::ChunkDescriptor::take, docs/protocol.md).
//
// Why (docs/stream.md, "Catch-up"): private chunks are not shared, so slots held by consumers
// catching up add up. Were each to keep its chunks in their slots while its user holds its
// batches or does not read (several loaders read in lockstep by one thread), a few of them could
// take every slot the server reserves for catching up and leave none a next one: the stream would
// stall. Copied on arrival, a private chunk occupies a slot only while it is filled and in
// transit, whatever the users do. A relaxed consumer's rows are copied for the same reason (its
// chunks are its own order's), and because the rebatcher cuts consecutive rows: the taken rows,
// compacted, are a chunk like any other. The price is one copy of each such chunk, the batches
// cut from it being views of that copy (Batch::copied).
//
// Layout (plan_copy): a chunk without rows to take is copied whole, the slot's bytes
// [0, end of its last tensor), so the descriptor's offsets and strides apply to data()
// unchanged. With rows to take, each tensor's taken rows are gathered, in take's order, into a
// block of their own (aligned to kCopyAlignment): the copy's descriptor has shape[0] =
// take.size(), offsets into the copy, the strides of the slot's tensors and no take. A row is
// dimension 0's stride apart from the next (validate_descriptor checks that rows do not
// overlap); runs of consecutive rows are copied at once. Host pools copy with memcpy; GPU pools
// (CUDA builds, CudaChunkCopier in client/cuda_assembler.h) device to device, one copy per run,
// the slot released once those have completed on the device.
// Ownership: a copy is shared by the ChunkRef of its chunk (and the session's queue before
// that); it frees its memory when the last owner lets it go, which for GPU memory the session
// delays until the readers' fences have passed (Session::free_copy). The copier belongs to the
// session. Thread-safety: copy() from the session's I/O thread only; a copy may be destroyed on
// any thread; plan_copy() is a pure function.
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
    protocol::ChunkDescriptor desc;  // the copy's (plan_copy): what the rebatcher reads
    // The slot may be released once these have passed (none: at once).
    std::vector<std::shared_ptr<ReleaseFence>> release_after;
  };
  // Copies a validated descriptor's chunk (its rows to take, if any) out of its slot. Throws
  // Error when it cannot (out of memory); the chunk then stays in its slot.
  virtual Copied copy(const protocol::ChunkDescriptor& d) = 0;
};

// Where each tensor of a copy starts: aligned for any dtype and for vectorised reads.
constexpr uint64_t kCopyAlignment = 256;

// What to copy out of a slot, and the descriptor of the copy (the header says how).
struct CopyPlan {
  struct Run {  // `bytes` from `from` (from the slot's start) to `to` (from the copy's)
    uint64_t from = 0;
    uint64_t to = 0;
    uint64_t bytes = 0;
  };
  protocol::ChunkDescriptor desc;
  std::vector<Run> runs;
  uint64_t bytes = 0;  // of the copy
};
// For a descriptor that passed protocol::validate_descriptor.
CopyPlan plan_copy(const protocol::ChunkDescriptor& d);

}  // namespace batchcast
