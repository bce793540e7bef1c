// ConsumerRegistry: the server's record of every attached consumer: its ZeroMQ identity, pid,
// stream cursor, credits and counters.
//
// A consumer's cursor `next_seq` is the next chunk it will be sent. While it is active, every
// chunk at or after its cursor is pinned in the ring (stall_policy "wait"); a consumer that has
// asked for nothing for stall_timeout no longer pins under "skip", nor does one waiting for a
// sought chunk (`seek`), reading private chunks for good, or decoupled after holding the
// stream back under "decouple" (StreamState's PrivateStreams).
// Records are created on Hello and erased on Goodbye or death; nothing here outlives the server.
// Thread-safety: none; the owner (StreamState) serialises access.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "protocol/messages.h"

namespace batchcast {

struct ConsumerRecord {
  uint64_t id = 0;
  std::string identity;  // ZeroMQ ROUTER routing id
  pid_t pid = 0;
  bool local = false;  // same host: liveness by pid; otherwise by heartbeats
  std::string name;
  uint64_t next_seq = 0;
  bool waiting_epoch_start = false;  // late_join=next_epoch, until it reaches an epoch start
  // A Seek waiting for its chunk to be published: it pins nothing and passes what comes before.
  std::optional<protocol::Seek> seek;
  uint32_t credits = 0;
  // The most credits it has had: its prefetch (the client asks for that many, then one per chunk
  // it takes). Back at this level, it has taken every chunk it was sent.
  uint32_t credit_window = 0;
  bool end_sent = false;
  bool error_sent = false;
  bool closing = false;        // said Goodbye; kept until its last hold is released
  double last_seen = 0;        // any message
  double last_activity = 0;    // last credit or release: "has taken something"
  double stall_timeout_s = 0;  // its own stall bound (Hello); 0: the server's
  uint32_t view = 0;           // the view it reads (StreamState::add_view); 0: the first
  bool relaxed = false;        // reads in relaxed order (StreamState's RelaxedReaders)
  bool starved = false;        // relaxed: at its last delivery it had credit and nothing to take
  // Seconds it has held the stream back (the producer waited for a slot, another consumer had
  // been sent every published chunk, and this one pinned published chunks it was not sent
  // yet), less the seconds it has not since: a consumer that holds the stream back most of
  // the time (a slow one, whose ring lag is small, frees a slot now and then) adds up; one
  // that does so now and then drains back to zero.
  double held_back_s = 0;
  // Seconds in a row it has been more than the lead behind another reader of a ring sized by
  // memory (StreamRules::lead_chunks): pinning the window while the others read on.
  double lagging_s = 0;
  uint64_t samples = 0;  // reported by its heartbeats
  double wait_s = 0;
  // Its pace over the last pace window (StreamState::watch_paces), from those counters: samples
  // a second of the time it did not wait for data (what it reads when never kept waiting), and
  // the share of the window it waited; measured from `pace_mark`.
  double own_pace = 0;
  double waited_share = 0;
  struct PaceMark {
    double t = -1;  // < 0: not yet marked
    uint64_t samples = 0;
    double wait_s = 0;
  } pace_mark;
};

class ConsumerRegistry {
 public:
  ConsumerRecord& add(ConsumerRecord record);
  ConsumerRecord* find_by_identity(const std::string& identity);
  void erase(uint64_t id);
  size_t size() const { return by_id_.size(); }
  size_t reading() const;  // not closing: those that still want chunks
  uint64_t ever() const { return next_id_ - 1; }
  std::map<uint64_t, ConsumerRecord>& all() { return by_id_; }
  const std::map<uint64_t, ConsumerRecord>& all() const { return by_id_; }

 private:
  uint64_t next_id_ = 1;
  std::map<uint64_t, ConsumerRecord> by_id_;
  std::map<std::string, uint64_t> by_identity_;
};

}  // namespace batchcast
