// StreamRules and StreamStats: what a StreamState is configured with (ring geometry, start,
// stall policy, liveness, epochs, regeneration, order, the Welcome it answers with) and what it
// counts (chunks, samples decoded and taken, consumers, each consumer's position and holds).
// Plain values; no thread-safety needed. StreamState (stream_state.h) owns one of each.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "protocol/messages.h"
#include "server/stream/relaxed_readers.h"
#include "server/stream/stall_policy.h"

namespace batchcast {

struct StreamRules {
  uint32_t slot_count = 8;
  // Chunks the producer may have filling or published without sending them to anyone: how far
  // it runs ahead of the most advanced reader. 0: the ring alone bounds it. A ring sized by
  // memory (a window for readers of different speeds) sets it, so that the window fills only
  // with chunks someone read and others still need, never with a burst of decoding ahead.
  uint32_t lead_chunks = 0;
  uint64_t slot_bytes = 0;  // descriptors are validated against it
  uint32_t min_consumers = 1;
  StallPolicy stall_policy = StallPolicy::kDecouple;
  // Seconds a consumer may hold the stream back (decouple) or ask for nothing (skip) before it
  // stops pinning, unless its Hello names its own; also when a stalled stream is logged.
  double stall_timeout_s = kDefaultStallTimeoutS;
  double heartbeat_interval_s = 0.25;
  double heartbeat_timeout_s = 2.0;  // remote consumers silent this long are dropped
  uint64_t epochs = 0;               // announced in End
  uint64_t epoch_samples = 0;        // for chunks whose producer did not say
  // The producer can fill any chunk (epoch, index) again, byte for byte (try_acquire_private);
  // chunks then hold welcome.chunk_size samples, an epoch's last one fewer.
  bool regenerates = false;
  // The order of consumers whose Hello leaves it to the server (protocol::Order::kServer).
  protocol::Order default_order = protocol::Order::kExact;
  // Relaxed order (RelaxedReaders): the dataset's size, the samples each epoch visits here, and a
  // seed for the readers' own orders. Without epoch_shard every consumer reads exact.
  uint64_t dataset_size = 0;
  RelaxedReaders::Shard epoch_shard;
  uint64_t seed = 0;
  // Sent (with consumer_id and epoch_samples filled in) in answer to every Hello; its boot_id
  // tells which consumers are local.
  protocol::Welcome welcome;
};

struct StreamStats {
  uint64_t chunks_published = 0;
  uint64_t chunks_regenerated = 0;  // private chunks filled for consumers catching up
  uint64_t chunks_skipped = 0;      // not filled: no attached consumer wanted them
  uint64_t chunks_relaxed = 0;      // decoded for relaxed readers (RelaxedReaders::choose)
  uint64_t samples_relaxed = 0;     // in those chunks
  uint64_t samples_taken_relaxed = 0;  // rows sent to relaxed readers, from any chunk
  uint64_t decouplings = 0;         // consumers decoupled for holding the stream back
  uint64_t samples_published = 0;
  uint64_t samples_regenerated = 0;  // in private chunks
  // Every sample decoded: the stream's, the private chunks' and the relaxed readers' chunks'.
  uint64_t samples_decoded() const {
    return samples_published + samples_regenerated + samples_relaxed;
  }
  uint64_t descriptors_sent = 0;
  uint64_t samples_sent = 0;      // rows sent to consumers, in every order (prefetched included)
  uint64_t messages_dropped = 0;  // malformed, unknown sender, forged release
  uint64_t consumers_now = 0;
  uint64_t consumers_ever = 0;
  uint64_t consumers_died = 0;
  uint32_t ring_occupied = 0;
  uint32_t ring_slots = 0;
  double producer_blocked_s = 0;
  struct Consumer {
    uint64_t id;
    pid_t pid;
    std::string name;
    uint64_t samples;
    double wait_s;
    bool attached;           // false: it left or died (kept so metrics can still count its CPU)
    uint64_t behind = 0;     // samples between its next one and the stream's newest
    uint32_t held = 0;       // chunks it was sent and has not released
    bool decoupled = false;  // reads private chunks after holding the stream back
    double holding_s = 0;    // how long it has held the stream back, now
    bool relaxed = false;    // reads in relaxed order
  };
  std::vector<Consumer> consumers;  // every consumer of this server, the last 1000 departed ones
};

}  // namespace batchcast
