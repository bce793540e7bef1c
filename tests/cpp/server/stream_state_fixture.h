// The test double of the stream rules' unit tests (stream_state_*_test.cpp): a StreamState whose
// time, process liveness and consumers' sockets are the test's own (an injected clock, a set of
// dead pids, an outbox per consumer), so each rule (docs/stream.md) is checked exactly, in
// microseconds, with no process or sleep; the consumer's side of the protocol as one-line calls.
//
// Contract: test-only; not thread-safe (one test's main thread drives a Stream). A Stream owns its
// StreamState and everything the state's callbacks reach.
#pragma once

#include <gtest/gtest.h>

#include <deque>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "server/stream/stream_state.h"

namespace batchcast::testing {

using protocol::ChunkDescriptor;
using protocol::Message;
using protocol::Seek;
using protocol::SeekReply;

constexpr uint32_t kChunk = 4;  // samples per chunk
constexpr const char* kBoot = "this-host";

inline StreamRules rules(uint32_t slots, uint32_t min_consumers = 1);

// Rules of a producer that regenerates, with epochs of `per_epoch` chunks.
inline StreamRules regenerating(uint32_t slots, uint64_t per_epoch) {
  StreamRules r = rules(slots);
  r.regenerates = true;
  r.welcome.chunk_size = kChunk;
  r.epoch_samples = per_epoch * kChunk;
  return r;
}

inline StreamRules rules(uint32_t slots, uint32_t min_consumers) {
  StreamRules r;
  r.slot_count = slots;
  r.slot_bytes = 4096;
  r.min_consumers = min_consumers;
  r.stall_timeout_s = 10;
  r.heartbeat_interval_s = 0.25;
  r.heartbeat_timeout_s = 2;
  r.epochs = 2;
  r.welcome.boot_id = kBoot;
  return r;
}

// A StreamState with a hand-driven clock, liveness and outbox, and the consumer's side of the
// protocol as one-line calls. Consumers are named by their identity; their pid is 1000 + n.
class Stream {
 public:
  explicit Stream(StreamRules r)
      : state(
            std::move(r),
            [this](const std::string& id, const Message& m) {
              if (refusing.count(id)) return false;
              inbox[id].push_back(m);
              return true;
            },
            [this](pid_t pid) { return dead.count(pid) == 0; },
            [this](const std::string& view) { return resolve_view(view); }) {}

  void hello(const std::string& id, protocol::LateJoin late_join = protocol::LateJoin::kReplay,
             bool local = true, const std::string& view = "") {
    protocol::Hello h;
    h.view = view;
    h.pid = pid_of(id);
    h.boot_id = local ? kBoot : "another-host";
    h.late_join = late_join;
    send(id, h);
  }
  void credit(const std::string& id, uint32_t n) { send(id, protocol::Credit{n}); }
  // A local consumer that attaches and asks for `credits` chunks.
  void join(const std::string& id, uint32_t credits) {
    hello(id);
    credit(id, credits);
  }
  void release(const std::string& id, const ChunkDescriptor& d) {
    send(id, protocol::Release{d.seq, d.slot});
  }
  void send(const std::string& id, const Message& m) {
    auto bytes = protocol::encode(m);
    state.receive(id, bytes.data(), bytes.size(), now);
  }
  pid_t pid_of(const std::string& id) {
    auto [it, added] = pids.emplace(id, 1000 + static_cast<pid_t>(pids.size()));
    return it->second;
  }

  // Acquires and publishes the next chunk: chunk `index` of `epoch`, `per_epoch` chunks an epoch.
  std::optional<StreamState::Fill> fill() { return state.try_acquire(now); }
  void publish(const StreamState::Fill& f, uint64_t per_epoch) {
    publish_at(f, f.seq / per_epoch, f.seq % per_epoch, per_epoch);
  }
  // Fills every private chunk asked for, as a regenerating producer does; returns how many.
  int regenerate(uint64_t per_epoch) {
    int n = 0;
    for (auto f = state.try_acquire_private(now); f; f = state.try_acquire_private(now), ++n)
      publish_at(*f, f->regenerate->epoch, f->regenerate->index, per_epoch);
    return n;
  }
  void publish_at(const StreamState::Fill& f, uint64_t epoch, uint64_t index, uint64_t per_epoch) {
    protocol::ChunkPosition p;
    p.epoch = epoch;
    p.index_in_epoch = index;
    p.sample_start = p.index_in_epoch * kChunk;
    p.sample_count = kChunk;
    p.epoch_samples = per_epoch * kChunk;
    p.epoch_end = p.index_in_epoch + 1 == per_epoch;
    state.publish(f.seq, f.slot, p, {{"#", DType::kUInt8, {kChunk}, {1}, 0}});
  }
  // Produces `n` chunks; fails the test if the ring refuses one.
  void produce(int n, uint64_t per_epoch = 100) {
    for (int i = 0; i < n; ++i) {
      auto f = fill();
      ASSERT_TRUE(f) << "the ring refused a chunk it should take";
      publish(*f, per_epoch);
    }
  }
  // Counts how many chunks the ring takes before refusing (publishing each).
  int produce_until_refused(uint64_t per_epoch = 100) {
    int n = 0;
    for (auto f = fill(); f; f = fill(), ++n) publish(*f, per_epoch);
    return n;
  }
  void tick() { state.tick(now); }
  // `id` attaches (100 credits) and reads the first `chunks` chunks as they are produced, one by
  // one: a stream `chunks` chunks along, with `id` at its head.
  void lead(const std::string& id, int chunks, uint64_t per_epoch) {
    join(id, 100);
    for (int i = 0; i < chunks; ++i) {
      produce(1, per_epoch);
      tick();
      consume(id);
    }
  }

  // Messages of type T sent to `id` since the last take, removed from its inbox.
  template <typename T>
  std::vector<T> take(const std::string& id) {
    std::vector<T> out;
    auto& box = inbox[id];
    for (auto it = box.begin(); it != box.end();) {
      if (auto* m = std::get_if<T>(&*it)) {
        out.push_back(*m);
        it = box.erase(it);
      } else {
        ++it;
      }
    }
    return out;
  }
  std::vector<uint64_t> seqs(const std::string& id) {
    std::vector<uint64_t> s;
    for (const auto& d : take<ChunkDescriptor>(id)) s.push_back(d.seq);
    return s;
  }
  // Takes every descriptor sent to `id` and releases it.
  std::vector<uint64_t> consume(const std::string& id) {
    std::vector<uint64_t> s;
    for (const auto& d : take<ChunkDescriptor>(id)) {
      s.push_back(d.seq);
      release(id, d);
    }
    return s;
  }

  // `id` as the consumer library treats what it is sent (client/chunk_copy.h): a private chunk
  // is copied and its slot released as it arrives, read or not; a stream chunk stays in its slot
  // until read, then while its user keeps the batch (here the last two: the oldest goes once a
  // third is read). `read`: the user reads what arrived, each read giving its credit back; else
  // it is busy elsewhere (another loader of the same thread). Returns the chunks read, in order.
  std::vector<ChunkDescriptor> client_reads(const std::string& id, bool read) {
    auto& c = clients[id];
    for (auto& d : take<ChunkDescriptor>(id)) {
      if (protocol::is_private_seq(d.seq)) release(id, d);
      c.unread.push_back(d);
    }
    if (!read) return {};
    std::vector<ChunkDescriptor> out;
    for (auto& d : c.unread) {
      credit(id, 1);
      out.push_back(d);
      if (protocol::is_private_seq(d.seq)) continue;
      c.kept.push_back(d);
      if (c.kept.size() > 2) {
        release(id, c.kept.front());
        c.kept.erase(c.kept.begin());
      }
    }
    c.unread.clear();
    return out;
  }

  // Views: "" is view 0; a view named "size=N" is added on first use (N uint8 bytes a sample,
  // its pool "pool.vK"); any other name is refused.
  StreamState::ViewChoice resolve_view(const std::string& view) {
    if (view.empty()) return {};
    if (view.rfind("size=", 0) != 0) return {0, "view '" + view + "': not a view"};
    if (!views.count(view)) {
      protocol::Welcome w;
      w.segment_name = "pool.v" + std::to_string(state.view_count());
      const int64_t bytes = std::stoll(view.substr(5));
      views[view] = state.add_view(w, [bytes](uint32_t n) {
        const int64_t samples = n;
        return std::vector<protocol::TensorSpec>{
            {"#0", DType::kUInt8, {samples, bytes}, {bytes, 1}, 0},
            {"#1", DType::kInt64, {samples}, {1}, 256}};
      });
    }
    return {views[view], ""};
  }

  double now = 1000;
  std::map<std::string, uint32_t> views;
  std::set<pid_t> dead;
  std::set<std::string> refusing;
  std::map<std::string, std::vector<Message>> inbox;
  std::map<std::string, pid_t> pids;
  struct Client {
    std::vector<ChunkDescriptor> unread, kept;
  };
  std::map<std::string, Client> clients;  // client_reads()
  StreamState state;
};

using Seqs = std::vector<uint64_t>;

// A chunk's position as one number (epoch * 1000 + index in epoch), in the order received.
inline std::vector<uint64_t> indexes(const std::vector<ChunkDescriptor>& ds) {
  std::vector<uint64_t> out;
  for (const auto& d : ds) out.push_back(d.position.epoch * 1000 + d.position.index_in_epoch);
  return out;
}

}  // namespace batchcast::testing
