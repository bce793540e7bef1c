// HostAssembler: batches of host pools (see client/assembler.h for the contract).
//
// A batch spanning chunks is copied piece by piece as its chunks arrive (staged), so it holds
// one chunk at a time. Holding every piece until the batch is complete would deadlock the ring
// once a batch spans more chunks than the pool has slots (e.g. batch 250 over chunks of 32 in 8
// slots): the producer would wait for a slot, the consumer for a chunk.
// Ownership: the staging buffers go to the copied Batch. Thread-safety: one thread.
// PinnedHostAssembler (client/cuda_assembler.h) extends its views.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "client/assembler.h"

namespace batchcast {

class HostAssembler : public Assembler {
 public:
  explicit HostAssembler(uint32_t batch_size) : capacity_(batch_size) {}

  void add(Piece piece) override;
  View viewable() const override {
    return !first_ && pieces_.size() == 1 ? view_of(pieces_.front()) : View::kNone;
  }
  void view(Batch& batch) override;
  void copy(Batch& batch) override;
  void discard() override;

 private:
  void stage();  // copies the pieces held so far and lets their chunks go

  uint32_t capacity_;                               // rows of a batch
  std::vector<Piece> pieces_;                       // not yet staged
  std::optional<protocol::ChunkDescriptor> first_;  // the first staged piece's chunk
  std::vector<std::unique_ptr<uint8_t[]>> staged_;  // one per tensor, capacity_ rows
  uint32_t staged_rows_ = 0;
};

}  // namespace batchcast
