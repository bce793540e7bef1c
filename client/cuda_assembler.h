// The client's CUDA code (CUDA builds only): the assemblers of client/assembler.h,
// CudaAssembler for GPU pools and PinnedHostAssembler for host pools page-locked for copies to a
// GPU, and CudaChunkCopier, which copies a GPU pool's private chunks and a relaxed consumer's
// rows (client/chunk_copy.h).
//
// CudaAssembler: batches of GPU pools.
// Views are device pointers into the server's arena, or into a private chunk's copy. Readiness
// is stream-ordered: a batch's tensors are ready once the server's slot event (or, for copies,
// our copy's event) has completed; Batch::use_on_stream makes the user's stream wait for it,
// with no host blocking.
// Copies (batches spanning chunks, or beyond max_held) are device-to-device on the assembler's
// own stream, into stream-ordered allocations. Releases wait for the device: a slot is released
// (a private chunk's copy freed) only once the events recorded after the last work reading it
// (our copy, or the user's stream when a viewing batch is destroyed) have completed (ChunkRef
// fences, honoured by the Session).
// Ownership: the copy stream is shared with every copied batch, which frees its buffers on it.
// Thread-safety: one thread assembles; batches may be destroyed on any thread.
#pragma once

#include <memory>
#include <vector>

#include "client/assembler.h"
#include "client/chunk_copy.h"
#include "client/host_assembler.h"

namespace batchcast {

class CudaAssembler : public Assembler {
 public:
  explicit CudaAssembler(const Session& session);

  void add(Piece piece) override { pieces_.push_back(std::move(piece)); }
  View viewable() const override {
    return pieces_.size() == 1 ? view_of(pieces_.front()) : View::kNone;
  }
  void view(Batch& batch) override;
  void copy(Batch& batch) override;
  void discard() override { pieces_.clear(); }

 private:
  cudaEvent_t ready_event(const ChunkRef& chunk) const;

  const SlotMemory& memory_;  // the session's, alive as long as the Consumer
  int device_;
  std::shared_ptr<CudaStream> copy_stream_;
  std::vector<Piece> pieces_;  // every chunk a batch spans is held until it is copied
};

// PinnedHostAssembler: a HostAssembler over a page-locked mapping (SlotMemory::host_pinned).
// Its views of slots are marked Batch::pinned: the user copies them to the GPU asynchronously on
// a stream given to use_on_stream, and the slot is released only once an event recorded on that
// stream when the batch is destroyed has completed (the same fence as GPU views: no host
// blocking, no device-wide sync). Copies, and views of private chunks' copies, are private
// pageable buffers, as on any host pool.
class PinnedHostAssembler : public HostAssembler {
 public:
  // device: the GPU the batches are copied to; -1: the current device.
  PinnedHostAssembler(uint32_t batch_size, int device);
  void view(Batch& batch) override;

 private:
  int device_;
};

// CudaChunkCopier: a GPU pool's private chunks, and the rows a relaxed consumer takes, copied
// device to device on arrival (one copy per run of rows: plan_copy), on a stream of its own,
// into stream-ordered allocations. The copy waits (on the device) for the server's
// slot event; the slot's release and the copy's readers wait for an event recorded after it.
// A copy is freed (cudaFreeAsync) once its readers' fences have passed (Session::free_copy).
// Thread-safety: copy() on the session's I/O thread, which it leaves on the pool's device.
class CudaChunkCopier : public ChunkCopier {
 public:
  explicit CudaChunkCopier(const SlotMemory& memory);  // the session's, which owns the copier
  Copied copy(const protocol::ChunkDescriptor& d) override;

 private:
  const SlotMemory& memory_;
  int device_;
  std::shared_ptr<CudaStream> stream_;  // shared with the copies, which are freed on it
};

}  // namespace batchcast
