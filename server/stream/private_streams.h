// PrivateStreams: the private chunks of consumers that asked for positions the shared ring
// no longer holds (docs/stream.md, "Seek and catch-up"). Chunk content is a function of (seed,
// epoch, chunk index) on producers that can regenerate, so a consumer behind the ring (a late
// joiner, a resumed trainer) gets the chunks it missed produced again for it alone, in its
// order, until it reaches the shared chunk where it merges back into the stream (or for good,
// when it is more than an epoch away).
//
// It keeps, per consumer, the next chunk to ask the producer for and the next to send, the
// chunks filled and waiting for their turn, and one queue of requests for the producer; private
// chunks live in ring slots under sequence numbers from protocol::kPrivateSeqBase up, never
// confused with the stream's. StreamState decides when a private stream starts and stops and
// sends the chunks; this class only books them.
// Thread-safety: none; its owner (StreamState) serialises every call. Ownership: a plain value.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <tuple>
#include <vector>

#include "protocol/messages.h"

namespace batchcast {

// Chunk `index` of epoch `epoch`: where a chunk sits, whatever its sequence number.
struct ChunkAddress {
  uint64_t epoch = 0;
  uint64_t index = 0;
  bool operator<(const ChunkAddress& o) const {
    return std::tie(epoch, index) < std::tie(o.epoch, o.index);
  }
  bool operator==(const ChunkAddress& o) const { return epoch == o.epoch && index == o.index; }
};

class PrivateStreams {
 public:
  struct Stream {
    uint64_t generation = 0;  // a new start() abandons what an earlier one asked for
    ChunkAddress next_request;
    ChunkAddress next_send;
    std::optional<ChunkAddress> until;  // merges into the shared stream there; nullopt: never
    // Decoupled (it held the stream back): no merge chunk and nothing pinned; it merges where
    // the stream still holds its next chunk, once it has caught up.
    bool rejoin = false;
    uint64_t decoupled_at = 0;     // the stream's next chunk number when it was decoupled
    // It took nothing (no credit, no release) for half its bound before it was decoupled: it had
    // stopped (warming up, validating), not slowed down, and may read faster than the stream
    // once back (StreamState::watch_catch_up).
    bool paused = false;
    bool caught_up_first = false;  // the stream waited for it once since
    uint64_t stream_position = 0;  // reported in its next descriptor
    uint32_t requested = 0;        // asked of the producer, not yet filled
    std::map<ChunkAddress, protocol::ChunkDescriptor> ready;  // filled, waiting for their turn
  };
  struct Request {
    uint64_t consumer = 0;
    uint64_t generation = 0;
    ChunkAddress chunk;
  };

  // Starts (or restarts) `consumer`'s private stream at `from`. Slots of chunks filled for an
  // earlier start are returned: nobody will be sent them.
  std::vector<uint32_t> start(uint64_t consumer, ChunkAddress from,
                              std::optional<ChunkAddress> until, uint64_t stream_position,
                              bool rejoin = false);
  // Ends `consumer`'s private stream (it merged, sought elsewhere or left); returns the slots of
  // its chunks that will never be sent.
  std::vector<uint32_t> stop(uint64_t consumer);
  Stream* find(uint64_t consumer);
  const Stream* find(uint64_t consumer) const;
  bool empty() const { return streams_.empty(); }
  // Some consumer catches up to merge into the shared stream (it pins its merge chunk).
  bool catching_up() const;

  // Asks the producer for `consumer`'s next chunks, up to `window` asked or waiting; chunks of
  // `chunks_per_epoch` per epoch, none from `end_epoch` on (0: no end).
  void top_up(uint64_t consumer, uint32_t window, uint64_t chunks_per_epoch, uint64_t end_epoch);
  // The oldest request still wanted, taken off the queue once `take`; nullopt if none.
  std::optional<Request> next_request() const;
  void take_request(uint64_t seq);  // the front request is being filled as chunk `seq`
  // Chunk `seq` was filled; false if nobody wants it any more (its slot may be reused at once).
  bool filled(uint64_t seq, protocol::ChunkDescriptor descriptor);
  // The consumer a private chunk in the ring was made for; nullopt once nobody wants it.
  std::optional<uint64_t> owner(uint64_t seq) const;
  void forget(uint64_t seq) { owners_.erase(seq); }  // its slot was reused
  uint64_t next_seq() const { return next_seq_; }

 private:
  std::map<uint64_t, Stream> streams_;  // by consumer id
  std::deque<Request> requests_;
  std::map<uint64_t, Request> owners_;  // private chunks being filled or in the ring, by seq
  uint64_t next_seq_ = protocol::kPrivateSeqBase;
  uint64_t generations_ = 0;
};

// The chunk after `a` in a stream of `chunks_per_epoch` chunks an epoch.
inline ChunkAddress next_chunk(ChunkAddress a, uint64_t chunks_per_epoch) {
  return a.index + 1 < chunks_per_epoch ? ChunkAddress{a.epoch, a.index + 1}
                                        : ChunkAddress{a.epoch + 1, 0};
}

}  // namespace batchcast
