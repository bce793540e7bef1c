// Rebatcher: cuts the server's stream of chunks into batches of the consumer's batch size.
//
// Pure bookkeeping: it sees only where each chunk sits in the stream (protocol::ChunkPosition) and
// answers which rows form the next batch; it never touches memory, sockets or time, so every stream
// shape is unit-tested alone (tests/cpp/client/rebatcher_test.cpp).
//
// Semantics (docs/stream.md): a batch is batch_size consecutive samples of one epoch, never
// spanning two epochs; it may span chunks. An epoch ends at a chunk flagged epoch_end, or when a
// chunk of another epoch arrives (that chunk is kept for the next epoch), or when the stream
// ends. The last batch of an epoch is short unless drop_last, which drops it. Samples the
// consumer never sees (a late join into a partial epoch, chunks left behind by the server's
// skip policy) are counted in skipped() when the chunk after them arrives.
//
// Driving it: call step() and act on what it returns until it returns a batch or an epoch end:
//   kNeedChunk  push() the stream's next chunk, or end_of_stream() when the stream ended;
//   kPiece      rows [start, start+count) of the chunk pushed last are the batch's next rows;
//   kBatch      the pieces since the previous kBatch/kEpochEnd form one batch (`batch`);
//   kEpochEnd   the epoch is over; pieces not yet in a batch are dropped (drop_last).
// seek(epoch, sample) forgets the chunk being cut and the batch being built: the next chunk
// pushed is the one holding that sample, its rows before it are dropped (asked away, not
// counted as skipped) and the epoch then yielded is the rest of that epoch.
// After the stream ended, every step() is kEpochEnd. holds_chunk() says whether the chunk
// pushed last may still yield pieces: once it is false the caller can let that chunk go.
// Thread-safety: none (one consumer thread). Ownership: a plain value.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>

#include "protocol/messages.h"

namespace batchcast {

// One batch, once its pieces are known.
struct BatchSpan {
  uint64_t epoch = 0;
  uint64_t sample_start = 0;  // position of its first sample inside the epoch
  uint32_t size = 0;
};

class Rebatcher {
 public:
  struct Step {
    enum Kind { kNeedChunk, kPiece, kBatch, kEpochEnd } kind = kNeedChunk;
    uint32_t start = 0;  // kPiece: first row inside the chunk pushed last
    uint32_t count = 0;  // kPiece: rows
    BatchSpan batch;     // kBatch
  };

  // announced_epoch_samples: the epoch length known at the handshake (0: unknown yet).
  Rebatcher(uint32_t batch_size, bool drop_last, uint64_t first_epoch,
            uint64_t announced_epoch_samples);

  Step step();
  void push(const protocol::ChunkPosition& chunk);  // answers kNeedChunk
  void end_of_stream();                             // answers kNeedChunk: no chunk follows
  void seek(uint64_t epoch, uint64_t sample);

  bool holds_chunk() const { return current_.has_value() || stash_.has_value(); }
  // The stream ended and every chunk was cut: step() only ever returns kEpochEnd now.
  bool finished() const { return stream_ended_ && !holds_chunk(); }
  // The epoch of the batches being cut (the last one started).
  uint64_t epoch() const { return epoch_; }
  // (epoch, sample in epoch) of the next sample a batch will hold: after a batch, the sample
  // after it; after an epoch's end, the next epoch's first; after seek(), the position sought;
  // before any batch, the first chunk's first sample (the announced first epoch's start until a
  // chunk came).
  std::pair<uint64_t, uint64_t> position() const { return next_; }
  uint32_t batch_size() const { return batch_size_; }
  // Batches per whole epoch; nullopt while the epoch's length is unknown.
  std::optional<uint64_t> batches_per_epoch() const;
  uint64_t skipped() const { return skipped_; }

 private:
  Step close_epoch();
  Step epoch_end();
  Step take_batch();

  uint32_t batch_size_;
  bool drop_last_;
  uint64_t epoch_;
  uint64_t epoch_samples_;
  std::optional<protocol::ChunkPosition> current_;  // the chunk being cut
  uint32_t pos_ = 0;                                // rows of current_ already cut
  std::optional<protocol::ChunkPosition>
      stash_;  // first chunk of a new epoch, pushed while closing the last
  bool epoch_open_ = false;
  bool pending_epoch_end_ = false;  // a short last batch went out; the epoch end follows
  bool stream_ended_ = false;
  BatchSpan batch_;                            // the batch being cut (size: rows so far)
  std::optional<uint64_t> expected_position_;  // stream position the next chunk should have
  uint64_t skipped_ = 0;
  std::pair<uint64_t, uint64_t> next_;                   // position()
  std::optional<std::pair<uint64_t, uint64_t>> sought_;  // seek() target, until its chunk came
};

}  // namespace batchcast
