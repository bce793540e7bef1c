// Assembler: turns the pieces the Rebatcher cuts (rows of received chunks) into a Batch.
//
// A batch that is one piece of one chunk can be a zero-copy view of the slot (view()); any
// other (spanning chunks, or beyond max_held) is a private copy (copy()). A private chunk's rows
// are already a copy (ChunkRef::copy, made on arrival: client/chunk_copy.h), so a batch of one
// piece of it is a view of that copy, which pins no slot. Which memory the chunks are in decides
// the implementation, chosen once per session by create():
// - HostAssembler (client/host_assembler.h): host pools, copies with memcpy;
// - CudaAssembler (client/cuda_assembler.h, CUDA builds only): GPU pools, device-to-device
//   copies, stream-ordered readiness and releases (BatchDeviceState);
// - PinnedHostAssembler (the same file): host pools page-locked for copies to a GPU
//   (ConsumerOptions::pin_memory), whose views release their slot after the copy on the device.
// Ownership: the Consumer owns its assembler; batches own what it put in them (views keep their
// chunk, copies their buffers) and outlive it. Thread-safety: the Consumer's thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "client/consumer.h"
#include "client/session.h"

namespace batchcast {

// Rows [start, start + count) of a received chunk.
struct Piece {
  std::shared_ptr<ChunkRef> chunk;
  uint32_t start = 0;
  uint32_t count = 0;
};

// What a batch of a GPU pool needs beyond its views: readiness on the user's stream, and a
// release that waits for the device work reading it (client/cuda_assembler.cpp).
class BatchDeviceState {
 public:
  virtual ~BatchDeviceState() = default;
  virtual void use_on_stream(uintptr_t stream) = 0;
  // The batch is being destroyed: fence `chunks` (those it views) behind the user's work.
  virtual void on_destroy(const std::vector<std::shared_ptr<ChunkRef>>& chunks) noexcept = 0;
};

class Assembler {
 public:
  // The assembler for the session's slot memory; batch_size bounds a batch's rows; cuda_device:
  // where a pinned host pool's batches are copied to (ConsumerOptions::cuda_device).
  static std::unique_ptr<Assembler> create(const std::shared_ptr<Session>& session,
                                           uint32_t batch_size, int cuda_device);
  virtual ~Assembler() = default;

  // What view() of the rows added since the last view/copy/discard would be.
  enum class View {
    kNone,  // they are not one piece of one chunk still in place: copy() them
    kSlot,  // one piece of a chunk in its slot: a zero-copy view that pins the slot
    kCopy,  // one piece of a private chunk's copy: a view of memory only this consumer reads
  };

  // The batch's next rows.
  virtual void add(Piece piece) = 0;
  virtual View viewable() const = 0;
  // Fills `batch` (its size set) with views of that piece; only when viewable() is not kNone.
  virtual void view(Batch& batch) = 0;
  // Fills `batch` (its size set) with a private contiguous copy of the rows added.
  virtual void copy(Batch& batch) = 0;
  // Forgets the rows added (a short last batch dropped by drop_last).
  virtual void discard() = 0;

 protected:
  // What a view of `piece` alone is: of its slot, or of its chunk's private copy.
  static View view_of(const Piece& piece) { return piece.chunk->copy ? View::kCopy : View::kSlot; }
};

// Strided views of the piece's rows where they lie (host memory; a GPU assembler retags them).
std::vector<TensorView> views_in_place(const Piece& piece);
// A C-contiguous view of `rows` samples shaped like `t`, data to be filled in.
TensorView contiguous_view(const protocol::TensorSpec& t, uint32_t rows);
// Throws Error naming both chunks unless the rows of `other` can be stacked under those of
// `first`: the same tensors, dtypes and sample shapes (contiguous: also C-contiguous layouts).
void check_stackable(const protocol::ChunkDescriptor& first, const protocol::ChunkDescriptor& other,
                     bool contiguous);

}  // namespace batchcast
