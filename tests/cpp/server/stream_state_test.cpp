// Every stream rule (docs/stream.md), against StreamState alone: time, process liveness and
// the consumers' sockets are the test's own (an injected clock, a set of dead pids, an outbox
// per consumer), so each rule is checked exactly, in microseconds, with no process or sleep.
#include "server/stream/stream_state.h"

#include <gtest/gtest.h>

#include <deque>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace batchcast {
namespace {

using protocol::ChunkDescriptor;
using protocol::Message;

constexpr uint32_t kChunk = 4;  // samples per chunk
constexpr const char* kBoot = "this-host";

StreamRules rules(uint32_t slots, uint32_t min_consumers = 1);

// Rules of a producer that regenerates, with epochs of `per_epoch` chunks.
StreamRules regenerating(uint32_t slots, uint64_t per_epoch) {
  StreamRules r = rules(slots);
  r.regenerates = true;
  r.welcome.chunk_size = kChunk;
  r.epoch_samples = per_epoch * kChunk;
  return r;
}

StreamRules rules(uint32_t slots, uint32_t min_consumers) {
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

TEST(StreamState, ChunksGoOutInSeqOrderWhateverThePublishOrder) {
  Stream s(rules(4));
  s.join("a", 10);
  auto f0 = s.fill(), f1 = s.fill(), f2 = s.fill();
  ASSERT_TRUE(f0 && f1 && f2);
  s.publish(*f2, 100);
  s.tick();
  EXPECT_EQ(s.seqs("a"), Seqs{}) << "chunk 2 must wait for 0 and 1";
  s.publish(*f0, 100);
  s.tick();
  EXPECT_EQ(s.seqs("a"), Seqs{0});
  s.publish(*f1, 100);
  s.tick();
  auto ds = s.take<ChunkDescriptor>("a");
  ASSERT_EQ(ds.size(), 2u);
  EXPECT_EQ(ds[0].seq, 1u);
  EXPECT_EQ(ds[1].seq, 2u);
  EXPECT_EQ(ds[1].position.stream_position, 2 * kChunk)
      << "samples before it since the stream began";
  EXPECT_EQ(ds[1].position.index_in_epoch, 2u);
  EXPECT_EQ(s.state.stats().chunks_published, 3u);
}

TEST(StreamState, NothingIsDeliveredBeforeMinConsumersAndNothingUndeliveredIsOverwritten) {
  Stream s(rules(3, /*min_consumers=*/2));
  s.join("a", 10);
  EXPECT_EQ(s.produce_until_refused(), 3) << "the ring fills once";
  s.tick();
  EXPECT_EQ(s.seqs("a"), Seqs{}) << "one of two consumers: the stream has not started";
  s.now += 3600;
  s.tick();
  EXPECT_FALSE(s.fill()) << "a chunk nobody received was overwritten";
  s.join("b", 10);
  s.tick();
  EXPECT_EQ(s.consume("a"), (Seqs{0, 1, 2}));
  EXPECT_EQ(s.consume("b"), (Seqs{0, 1, 2})) << "both see the stream from its first chunk";
}

TEST(StreamState, ASlotIsReusedOnlyAfterEveryReceiverReleasedIt) {
  Stream s(rules(2));
  s.join("a", 10);
  s.join("b", 10);
  s.produce(2);
  s.tick();
  auto a = s.take<ChunkDescriptor>("a");
  auto b = s.take<ChunkDescriptor>("b");
  ASSERT_EQ(a.size(), 2u);
  ASSERT_EQ(b.size(), 2u);
  s.release("a", a[0]);
  EXPECT_FALSE(s.fill()) << "b still holds chunk 0";
  s.release("b", b[0]);
  auto f = s.fill();
  ASSERT_TRUE(f);
  EXPECT_EQ(f->slot, a[0].slot) << "the released slot, and only it";
  EXPECT_FALSE(s.fill()) << "chunk 1 is still held";
}

TEST(StreamState, TheProducerIsAtMostTheRingAheadOfTheSlowestConsumer) {
  Stream s(rules(4));
  s.hello("fast");
  s.hello("slow");
  s.credit("fast", 1000);
  int produced = 0;
  for (int round = 0; round < 10; ++round) {
    produced += s.produce_until_refused();
    s.tick();
    s.consume("fast");
  }
  EXPECT_EQ(produced, 4) << "no active consumer's cursor may be overtaken";
  s.credit("slow", 1);
  s.tick();
  EXPECT_EQ(s.consume("slow"), Seqs{0});
  EXPECT_EQ(s.produce_until_refused(), 1) << "one slot passed by every cursor";
}

// Publishes chunks 0..n-1 (per_epoch chunks an epoch) while consumer "a" takes and releases
// every one, so what the ring retains is decided by its size alone.
void run_ahead(Stream& s, int n, uint64_t per_epoch) {
  s.join("a", 1000);
  for (int i = 0; i < n; ++i) {
    s.produce(1, per_epoch);
    s.tick();
    s.consume("a");
  }
}

TEST(StreamState, ALateJoinerReplaysAWholeEpochFromTheRetainedEpochStart) {
  Stream s(rules(4));
  run_ahead(s, 6, /*per_epoch=*/4);  // retained: 2 3 | 4 5 (epoch 1 starts at 4)
  s.join("late", 100);
  s.tick();
  auto ds = s.take<ChunkDescriptor>("late");
  ASSERT_EQ(ds.size(), 2u);
  EXPECT_EQ(ds[0].seq, 4u);
  EXPECT_EQ(ds[0].position.epoch, 1u);
  EXPECT_EQ(ds[0].position.index_in_epoch, 0u);
}

TEST(StreamState, ALateJoinerWithNoRetainedEpochStartGetsThePartialEpochRetained) {
  Stream s(rules(4));
  run_ahead(s, 6, /*per_epoch=*/8);  // retained: 2 3 4 5 of epoch 0
  s.join("late", 100);
  s.tick();
  EXPECT_EQ(s.seqs("late"), (Seqs{2, 3, 4, 5})) << "the oldest retained chunk onwards";
}

TEST(StreamState, ALateJoinerStartsInsideTheGapFreeRetainedTail) {
  Stream s(rules(3));
  s.join("a", 100);
  s.produce(3, /*per_epoch=*/3);
  s.tick();
  auto a = s.take<ChunkDescriptor>("a");
  ASSERT_EQ(a.size(), 3u);
  s.release("a", a[1]);
  s.release("a", a[2]);  // chunk 0 (an epoch start) stays held
  s.produce(1, 3);       // chunk 3, epoch 1's start, replaces chunk 1: retained 0 _ 2 3
  s.join("late", 100);
  s.tick();
  EXPECT_EQ(s.seqs("late"), Seqs{3}) << "replaying from chunk 0 would jump across the hole";
}

TEST(StreamState, ANextEpochJoinerStartsAtTheNextEpochStart) {
  Stream s(rules(4));
  run_ahead(s, 6, /*per_epoch=*/8);
  s.hello("late", protocol::LateJoin::kNextEpoch);
  s.credit("late", 100);
  s.tick();
  EXPECT_EQ(s.seqs("late"), Seqs{});
  for (int i = 0; i < 3; ++i) {  // chunks 6, 7 and epoch 1's first
    s.produce(1, 8);
    s.tick();
    s.consume("a");
  }
  auto ds = s.take<ChunkDescriptor>("late");
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].seq, 8u);
  EXPECT_EQ(ds[0].position.epoch, 1u);
  EXPECT_EQ(ds[0].position.index_in_epoch, 0u);
}

TEST(StreamState, ALoneNextEpochJoinerPassesUnsentChunksInsteadOfWaitingForever) {
  Stream s(rules(2));
  s.join("a", 1);
  s.produce(2, /*per_epoch=*/4);
  s.tick();
  EXPECT_EQ(s.consume("a"), Seqs{0});
  s.send("a", protocol::Goodbye{});
  s.produce(1, 4);  // chunk 2 replaces chunk 0
  EXPECT_FALSE(s.fill()) << "chunk 1 was never sent to anyone";
  s.hello("late", protocol::LateJoin::kNextEpoch);
  s.credit("late", 100);
  s.tick();
  EXPECT_EQ(s.seqs("late"), Seqs{}) << "chunks 1 and 2 are passed, not sent";
  s.produce(1, 4);  // chunk 3 ends epoch 0
  s.tick();
  EXPECT_EQ(s.seqs("late"), Seqs{});
  s.produce(1, 4);
  s.tick();
  EXPECT_EQ(s.seqs("late"), Seqs{4}) << "epoch 1's first chunk";
}

TEST(StreamState, AChunkPassedByChoiceStaysReusableAfterItsPasserLeft) {
  Stream s(rules(2));
  s.join("a", 1);
  s.produce(2, /*per_epoch=*/4);
  s.tick();
  EXPECT_EQ(s.consume("a"), Seqs{0});
  s.send("a", protocol::Goodbye{});
  s.produce(1, 4);  // chunk 2 replaces chunk 0
  s.hello("late", protocol::LateJoin::kNextEpoch);
  s.credit("late", 100);
  s.tick();  // passes chunks 1 (never sent to anyone) and 2
  EXPECT_EQ(s.seqs("late"), Seqs{});
  s.send("late", protocol::Goodbye{});
  EXPECT_TRUE(s.fill()) << "chunk 1 was passed: as good as delivered";
  EXPECT_TRUE(s.fill());
}

// Two consumers on a ring of 2: "a" takes everything, "b" took chunk 0 then stopped asking.
void stall_b(Stream& s) {
  s.join("a", 1000);
  s.join("b", 1);
  s.produce(2);
  s.tick();
  s.consume("a");
  EXPECT_EQ(s.consume("b"), Seqs{0});
}

TEST(StreamState, UnderStallPolicyWaitAStalledConsumerHoldsTheProducerForever) {
  Stream s(rules(2));
  stall_b(s);
  EXPECT_TRUE(s.fill()) << "chunk 0 was passed by both";
  s.now += 1e6;
  EXPECT_FALSE(s.fill()) << "chunk 1 was never sent to b";
}

TEST(StreamState, UnderStallPolicySkipAStalledConsumerIsLeftBehindAfterTheTimeout) {
  auto r = rules(2);
  r.stall_policy = StallPolicy::kSkip;
  Stream s(r);
  stall_b(s);
  ASSERT_TRUE(s.fill());  // chunk 2 into chunk 0's slot (not published yet)
  s.now += 9.9;
  EXPECT_FALSE(s.fill()) << "b has not been idle for stall_timeout yet";
  s.now += 0.2;
  ASSERT_TRUE(s.fill()) << "b stopped pinning cursors";
  s.credit("b", 10);  // b comes back: it resumes from the oldest retained chunk
  s.tick();
  EXPECT_EQ(s.seqs("b"), Seqs{}) << "chunks 2 and 3 are being filled, 1 is gone";
}

TEST(StreamState, ASkippedConsumerResumesAtTheOldestRetainedChunkAndSeesTheGap) {
  auto r = rules(2);
  r.stall_policy = StallPolicy::kSkip;
  Stream s(r);
  stall_b(s);
  s.now += 11;
  s.produce(2);  // chunks 2 and 3 replace 0 and 1
  s.tick();
  s.consume("a");
  s.credit("b", 10);
  s.tick();
  auto ds = s.take<ChunkDescriptor>("b");
  ASSERT_EQ(ds.size(), 2u);
  EXPECT_EQ(ds[0].seq, 2u);
  EXPECT_EQ(ds[0].position.stream_position, 2 * kChunk)
      << "consumers count skips from stream positions";
}

TEST(StreamState, ALocalConsumerWhoseProcessDiedIsDroppedAndItsSlotsFreed) {
  Stream s(rules(2));
  s.join("a", 10);
  s.produce(2);
  s.tick();
  EXPECT_EQ(s.take<ChunkDescriptor>("a").size(), 2u);  // held, never released
  EXPECT_FALSE(s.fill());
  s.dead.insert(s.pid_of("a"));
  s.now += 0.2;
  s.tick();
  EXPECT_EQ(s.state.consumers_now(), 0u);
  EXPECT_EQ(s.state.stats().consumers_died, 1u);
  EXPECT_TRUE(s.fill()) << "a dead consumer's holds are released";
}

TEST(StreamState, ALocalConsumerIsJudgedByItsPidNotByItsSilence) {
  Stream s(rules(2));
  s.hello("a");
  s.tick();
  s.now += 3600;  // silent (e.g. SIGSTOPped), but its process exists
  s.tick();
  EXPECT_EQ(s.state.consumers_now(), 1u);
}

TEST(StreamState, ARemoteConsumerIsDroppedAfterTheHeartbeatTimeout) {
  Stream s(rules(2));
  s.hello("remote", protocol::LateJoin::kReplay, /*local=*/false);
  s.dead.insert(s.pid_of("remote"));  // a pid of another host means nothing here
  for (int i = 0; i < 10; ++i) {
    s.now += 1.5;
    s.send("remote", protocol::Heartbeat{});
    s.tick();
  }
  EXPECT_EQ(s.state.consumers_now(), 1u) << "heartbeats keep it";
  s.now += 1.9;
  s.tick();
  EXPECT_EQ(s.state.consumers_now(), 1u);
  s.now += 0.2;
  s.tick();
  EXPECT_EQ(s.state.consumers_now(), 0u) << "silent past heartbeat_timeout";
}

TEST(StreamState, GoodbyeKeepsTheSlotsStillHeldUntilTheyAreReleased) {
  Stream s(rules(2));
  s.join("a", 1);
  s.produce(2);
  s.tick();
  auto held = s.take<ChunkDescriptor>("a");
  ASSERT_EQ(held.size(), 1u);
  s.send("a", protocol::Goodbye{});
  s.credit("a", 10);
  s.tick();
  EXPECT_EQ(s.seqs("a"), Seqs{}) << "nothing is sent after Goodbye";
  EXPECT_EQ(s.state.consumers_now(), 1u) << "kept while it holds a slot";
  EXPECT_EQ(s.state.consumers_reading(), 0u) << "but it reads no more (a share producer may go)";
  EXPECT_FALSE(s.fill());
  s.release("a", held[0]);
  EXPECT_EQ(s.state.consumers_now(), 0u);
  EXPECT_TRUE(s.fill());
}

TEST(StreamState, GoodbyeIsAnsweredWithEndAfterEverythingSentBefore) {
  // Chunks sent just before the server reads a Goodbye are still on their way to the consumer,
  // which cannot know of them: End, after them in the same order, tells its session that
  // nothing follows, so it releases what arrives until then instead of leaving it held.
  Stream s(rules(4));
  s.join("a", 3);
  s.produce(2);
  s.tick();
  s.send("a", protocol::Goodbye{});
  std::vector<Message> box;
  for (const auto& m : s.inbox["a"])
    if (!std::holds_alternative<protocol::Heartbeat>(m)) box.push_back(m);
  ASSERT_EQ(box.size(), 4u) << "Welcome, two chunks, End";
  EXPECT_TRUE(std::holds_alternative<ChunkDescriptor>(box[1]));
  EXPECT_TRUE(std::holds_alternative<ChunkDescriptor>(box[2]));
  EXPECT_TRUE(std::holds_alternative<protocol::End>(box[3]));
  EXPECT_EQ(s.state.consumers_now(), 1u) << "kept while it holds its two chunks";
  s.inbox["a"].clear();
  s.produce(1);
  s.now += 1;
  s.tick();
  EXPECT_TRUE(s.take<ChunkDescriptor>("a").empty()) << "nothing follows End";
  EXPECT_TRUE(s.take<protocol::End>("a").empty()) << "which is sent once";
}

TEST(StreamState, ForgedAndDuplicateReleasesAreDroppedAndCounted) {
  Stream s(rules(2));
  s.hello("a");
  s.hello("evil");
  s.credit("a", 10);
  s.produce(1);
  s.tick();
  auto a = s.take<ChunkDescriptor>("a");
  ASSERT_EQ(a.size(), 1u);
  s.release("evil", a[0]);                         // never sent it
  s.send("evil", protocol::Release{a[0].seq, 7});  // no such slot
  s.release("a", a[0]);
  s.release("a", a[0]);                     // twice
  s.send("stranger", protocol::Credit{1});  // before hello
  s.hello("a");                             // second hello
  std::string garbage(32, '\xff');
  s.state.receive("a", garbage.data(), garbage.size(), s.now);
  EXPECT_EQ(s.state.stats().messages_dropped, 6u);
  s.send("evil", protocol::Goodbye{});  // its cursor no longer pins chunk 0
  EXPECT_TRUE(s.fill());
  EXPECT_TRUE(s.fill()) << "a's one genuine release freed chunk 0";
}

TEST(StreamState, AForgedReleaseCannotFreeAnotherConsumersSlot) {
  Stream s(rules(2));
  s.join("a", 10);
  s.join("evil", 10);
  s.produce(2);
  s.tick();
  auto a = s.take<ChunkDescriptor>("a");
  for (const auto& d : s.take<ChunkDescriptor>("evil")) {
    s.release("evil", d);
    s.release("evil", d);
  }
  EXPECT_FALSE(s.fill()) << "a still holds both chunks";
  EXPECT_EQ(s.state.stats().messages_dropped, 2u);
}

TEST(StreamState, EveryConsumerIsSentEndAfterFinish) {
  Stream s(rules(4));
  s.join("a", 10);
  s.join("b", 1);
  s.produce(2, /*per_epoch=*/2);
  s.state.finish();
  s.tick();
  EXPECT_EQ(s.take<protocol::End>("a").size(), 1u);
  EXPECT_EQ(s.take<protocol::End>("b").size(), 0u) << "b has not been sent chunk 1 yet";
  EXPECT_FALSE(s.state.all_ended());
  s.credit("b", 1);
  s.tick();
  EXPECT_EQ(s.seqs("b"), (Seqs{0, 1}));
  auto end = s.take<protocol::End>("b");
  ASSERT_EQ(end.size(), 1u);
  EXPECT_EQ(end[0].epochs, 2u);
  EXPECT_TRUE(s.state.all_ended());
}

TEST(StreamState, FinishWaitsForChunksStillBeingFilled) {
  Stream s(rules(4));
  s.join("a", 10);
  auto f0 = s.fill();
  ASSERT_TRUE(f0);
  s.state.finish();
  s.tick();
  EXPECT_TRUE(s.take<protocol::End>("a").empty());
  EXPECT_FALSE(s.state.all_ended());
  s.publish(*f0, 1);
  s.tick();
  EXPECT_EQ(s.seqs("a"), Seqs{0});
  EXPECT_EQ(s.take<protocol::End>("a").size(), 1u);
  EXPECT_TRUE(s.state.all_ended());
}

TEST(StreamState, FailTellsAttachedConsumersAndThoseThatAttachLater) {
  Stream s(rules(4));
  s.hello("a");
  s.produce(3);  // retained chunks a later joiner would otherwise replay
  s.state.fail("sample 7: bad JPEG");
  s.state.fail("a second failure");
  s.tick();
  auto errors = s.take<protocol::ErrorMessage>("a");
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].message, "sample 7: bad JPEG") << "the first failure wins";
  s.tick();
  EXPECT_TRUE(s.take<protocol::ErrorMessage>("a").empty()) << "sent once";
  EXPECT_EQ(s.seqs("a"), Seqs{}) << "nothing is delivered after the failure";
  s.join("later", 10);
  s.tick();
  ASSERT_EQ(s.take<protocol::ErrorMessage>("later").size(), 1u);
  EXPECT_EQ(s.seqs("later"), Seqs{}) << "a joiner of a failed stream gets the failure, no replay";
  EXPECT_FALSE(s.fill()) << "a failed stream takes no more chunks";
}

TEST(StreamState, AnInvalidChunkFailsTheStreamInsteadOfReachingConsumers) {
  Stream s(rules(2));
  s.join("a", 10);
  auto f = s.fill();
  ASSERT_TRUE(f);
  protocol::ChunkPosition p;
  p.sample_count = kChunk;
  s.state.publish(f->seq, f->slot, p, {{"#", DType::kUInt8, {kChunk}, {1}, 1 << 20}});
  EXPECT_TRUE(s.state.failed());
  s.tick();
  EXPECT_EQ(s.seqs("a"), Seqs{});
  EXPECT_EQ(s.take<protocol::ErrorMessage>("a").size(), 1u);
}

TEST(StreamState, CreditsBoundWhatIsSent) {
  Stream s(rules(8));
  s.hello("a");
  s.produce(5);
  s.tick();
  EXPECT_EQ(s.seqs("a"), Seqs{}) << "no credit, no descriptor";
  s.credit("a", 2);
  s.tick();
  EXPECT_EQ(s.seqs("a"), (Seqs{0, 1}));
  s.credit("a", 1);
  s.tick();
  EXPECT_EQ(s.seqs("a"), Seqs{2});
}

using Waited = std::optional<uint64_t>;

TEST(StreamState, TheHeadIsWaitedForOnceAConsumerLevelWithItHasTakenEveryChunkItWasSent) {
  Stream s(rules(8));
  s.join("a", 2);  // prefetch 2, as the consumer library asks
  s.tick();
  EXPECT_EQ(s.state.waited_chunk(), Waited(0)) << "nothing published: a waits for chunk 0";
  auto f0 = s.fill(), f1 = s.fill();
  ASSERT_TRUE(f0 && f1);
  s.publish(*f0, 100);
  EXPECT_EQ(s.state.waited_chunk(), Waited()) << "chunk 0 is published, not yet sent";
  s.tick();
  EXPECT_EQ(s.seqs("a"), Seqs{0});
  EXPECT_EQ(s.state.waited_chunk(), Waited()) << "a has chunk 0 to read";
  s.credit("a", 1);  // it took chunk 0 (the library gives the credit back as it reads a chunk)
  EXPECT_EQ(s.state.waited_chunk(), Waited(1)) << "a read everything: it waits for chunk 1";
  s.publish(*f1, 100);
  s.tick();
  EXPECT_EQ(s.seqs("a"), Seqs{1});
  EXPECT_EQ(s.state.waited_chunk(), Waited());
}

TEST(StreamState, NoChunkIsWaitedForWhileEveryConsumerHasChunksOrNoneReads) {
  Stream s(rules(8, /*min_consumers=*/2));
  s.join("a", 2);
  s.tick();
  EXPECT_EQ(s.state.waited_chunk(), Waited()) << "the stream has not started";
  s.join("b", 2);
  s.produce(4);
  s.tick();
  EXPECT_EQ(s.seqs("a"), (Seqs{0, 1}));
  EXPECT_EQ(s.seqs("b"), (Seqs{0, 1}));
  EXPECT_EQ(s.state.waited_chunk(), Waited()) << "both have chunks to read, and more wait";
  s.credit("a", 2);
  EXPECT_EQ(s.state.waited_chunk(), Waited()) << "chunks 2 and 3 are published for a";
  s.tick();
  s.credit("a", 2);
  EXPECT_EQ(s.state.waited_chunk(), Waited(4)) << "a, ahead of b, waits: that is enough";
  s.send("a", protocol::Goodbye{});
  EXPECT_EQ(s.state.waited_chunk(), Waited()) << "a left; b still has chunks";
}

TEST(StreamState, NoChunkIsWaitedForAfterTheLastOne) {
  Stream s(rules(4));
  s.join("a", 2);
  s.produce(2, /*per_epoch=*/2);
  s.state.finish();
  s.tick();
  s.credit("a", 2);
  EXPECT_EQ(s.state.waited_chunk(), Waited()) << "nothing follows: End, not a chunk, is next";
}

TEST(StreamState, ARefusedSendStopsDeliveryToThatConsumerOnlyAndResumesInOrder) {
  Stream s(rules(4));
  s.join("a", 10);
  s.join("b", 10);
  s.refusing.insert("a");
  s.produce(2);
  s.tick();
  EXPECT_EQ(s.seqs("b"), (Seqs{0, 1}));
  EXPECT_EQ(s.state.stats().descriptors_sent, 2u);
  s.refusing.clear();
  s.tick();
  EXPECT_EQ(s.seqs("a"), (Seqs{0, 1})) << "nothing lost, nothing reordered";
}

TEST(StreamState, WelcomeAndHeartbeatsGoOutOnTheirSchedule) {
  Stream s(rules(2));
  s.hello("a");
  auto w = s.take<protocol::Welcome>("a");
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(w[0].consumer_id, 1u);
  EXPECT_EQ(w[0].boot_id, kBoot);
  s.tick();
  s.now += 0.1;
  s.tick();
  EXPECT_EQ(s.take<protocol::Heartbeat>("a").size(), 1u);
  s.now += 0.2;
  s.tick();
  EXPECT_EQ(s.take<protocol::Heartbeat>("a").size(), 1u);
}

TEST(StreamState, ProducerBlockedTimeIsTheTimeAcquireWasRefused) {
  Stream s(rules(2));
  s.join("a", 10);
  s.produce(2);
  s.tick();
  auto ds = s.take<ChunkDescriptor>("a");
  EXPECT_FALSE(s.fill());
  s.now += 1.5;
  EXPECT_FALSE(s.fill());
  // While the block goes on it counts up to now (a tick's rate never exceeds 100 %).
  s.now += 0.5;
  EXPECT_DOUBLE_EQ(s.state.producer_blocked_s(s.now), 2.0);
  s.release("a", ds[0]);
  EXPECT_TRUE(s.fill());
  EXPECT_DOUBLE_EQ(s.state.stats().producer_blocked_s, 2.0);
  EXPECT_DOUBLE_EQ(s.state.producer_blocked_s(s.now + 3), 2.0);
}

// --- Seek, catch-up and break (docs/stream.md, "Positions") ---

using protocol::Seek;
using protocol::SeekReply;

std::vector<uint64_t> indexes(const std::vector<ChunkDescriptor>& ds) {
  std::vector<uint64_t> out;
  for (const auto& d : ds) out.push_back(d.position.epoch * 1000 + d.position.index_in_epoch);
  return out;
}

TEST(StreamState, ASeekIntoARetainedChunkMovesTheCursorThere) {
  Stream s(rules(8));
  s.join("a", 100);
  s.produce(6, /*per_epoch=*/4);
  s.tick();
  EXPECT_EQ(s.consume("a"), (Seqs{0, 1, 2, 3, 4, 5}));
  s.send("a", Seek{0, 5});
  s.tick();
  auto replies = s.take<SeekReply>("a");
  ASSERT_EQ(replies.size(), 1u);
  EXPECT_TRUE(replies[0].available);
  EXPECT_EQ(s.consume("a"), (Seqs{1, 2, 3, 4, 5})) << "from the chunk holding sample 5";
  s.send("a", Seek{0, 16});  // the end of epoch 0 is the start of epoch 1
  s.tick();
  EXPECT_EQ(s.consume("a"), (Seqs{4, 5}));
}

TEST(StreamState, ASeekAheadWaitsForItsChunkAndPinsNothingBeforeIt) {
  Stream s(rules(3));
  s.join("a", 100);
  s.join("b", 100);
  s.send("b", Seek{1, 0});  // epoch 1 starts at chunk 4
  EXPECT_EQ(s.produce_until_refused(4), 3);
  s.tick();
  EXPECT_EQ(s.consume("a"), (Seqs{0, 1, 2}));
  EXPECT_EQ(s.seqs("b"), Seqs{}) << "chunks before its position are not sent";
  EXPECT_TRUE(s.take<SeekReply>("b").empty()) << "answered once its chunk is there";
  s.produce(2, 4);  // b pins none of chunks 0-2
  s.tick();
  auto replies = s.take<SeekReply>("b");
  ASSERT_EQ(replies.size(), 1u);
  EXPECT_TRUE(replies[0].available);
  EXPECT_EQ(s.consume("b"), (Seqs{4}));
}

TEST(StreamState, AGonePositionIsRefusedWithoutRegenerationAndTheConsumerStays) {
  Stream s(rules(2));
  s.lead("a", 4, 100);
  s.send("a", Seek{0, 0});
  s.tick();
  auto replies = s.take<SeekReply>("a");
  ASSERT_EQ(replies.size(), 1u);
  EXPECT_FALSE(replies[0].available);
  EXPECT_NE(replies[0].message.find("position unavailable: epoch 0 sample 0"), std::string::npos)
      << replies[0].message;
  EXPECT_NE(replies[0].message.find("from epoch 0 sample 8"), std::string::npos)
      << "names what the server holds: " << replies[0].message;
  EXPECT_TRUE(s.take<protocol::ErrorMessage>("a").empty()) << "not a stream failure";
  s.send("a", Seek{0, 13});  // chunk 3 is retained
  s.tick();
  replies = s.take<SeekReply>("a");
  ASSERT_EQ(replies.size(), 1u);
  EXPECT_TRUE(replies[0].available);
  EXPECT_EQ(s.consume("a"), (Seqs{3}));
}

TEST(StreamState, ABreakSeekToTheNextEpochReleasesTheChunksItSkipped) {
  Stream s(rules(4));
  s.join("a", 100);
  s.join("b", 1);
  EXPECT_EQ(s.produce_until_refused(8), 4);
  s.tick();
  s.consume("a");
  auto b = s.take<ChunkDescriptor>("b");
  ASSERT_EQ(b.size(), 1u);
  EXPECT_FALSE(s.fill()) << "b holds chunk 0 and pins chunks 1-3";
  s.send("b", Seek{1, 0});  // b left epoch 0 after one batch
  s.release("b", b[0]);     // its batch is gone: its client lets the chunk go at once
  s.credit("b", 1);
  s.tick();
  EXPECT_EQ(s.produce_until_refused(8), 4) << "nothing b skipped is pinned any more";
  s.tick();
  EXPECT_EQ(s.seqs("b"), Seqs{}) << "epoch 1 starts at chunk 8";
}

TEST(StreamState, ALateJoinerCatchesUpOnRegeneratedChunksThenMergesIntoTheStream) {
  const uint64_t per_epoch = 100;
  Stream s(regenerating(8, per_epoch));
  s.lead("a", 12, per_epoch);  // a is 12 chunks into epoch 0; chunks 0-3 are gone
  s.join("b", 2);              // replay: the whole epoch, not a partial one from chunk 4
  std::vector<ChunkDescriptor> got;
  for (int round = 0; round < 40 && got.size() < 20; ++round) {
    s.regenerate(per_epoch);
    if (auto f = s.fill()) s.publish(*f, per_epoch);
    s.tick();
    for (auto& d : s.take<ChunkDescriptor>("b")) {
      got.push_back(d);
      s.release("b", d);
      s.credit("b", 1);
    }
    s.consume("a");
  }
  ASSERT_GE(got.size(), 20u);
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].position.index_in_epoch, i) << "every chunk of the epoch, in order";
    if (i) {
      EXPECT_EQ(got[i].position.stream_position, got[i - 1].position.stream_position + kChunk)
          << "no gap: nothing reported missed";
    }
  }
  EXPECT_TRUE(protocol::is_private_seq(got.front().seq)) << "chunk 0 was regenerated";
  EXPECT_FALSE(protocol::is_private_seq(got.back().seq)) << "b merged into the shared stream";
  auto stats = s.state.stats();
  EXPECT_EQ(stats.chunks_regenerated, 4u + 3u)
      << "what the ring had lost, and the 3 slots left before its merge chunk";
}

TEST(StreamState, ARegeneratedChunkGoesToItsConsumerOnlyAndItsSlotIsReusedAfterRelease) {
  const uint64_t per_epoch = 100;
  Stream s(regenerating(4, per_epoch));
  s.lead("a", 6, per_epoch);
  s.hello("b", protocol::LateJoin::kNextEpoch);
  s.credit("b", 1);
  s.send("b", Seek{0, 0});
  s.tick();
  EXPECT_TRUE(s.take<SeekReply>("b").front().available);
  EXPECT_EQ(s.regenerate(per_epoch), 1) << "asked ahead as far as its credits";
  s.tick();
  auto b = s.take<ChunkDescriptor>("b");
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(b[0].position.index_in_epoch, 0u);
  EXPECT_TRUE(s.seqs("a").empty()) << "private chunks go to their consumer only";
  EXPECT_EQ(s.regenerate(per_epoch), 0) << "its slots are held";
  s.release("b", b[0]);
  s.credit("b", 1);
  s.tick();
  EXPECT_EQ(s.regenerate(per_epoch), 1) << "the released slot took the next private chunk";
  s.tick();
  b = s.take<ChunkDescriptor>("b");
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(b[0].position.index_in_epoch, 1u);
}

TEST(StreamState, APositionMoreThanAnEpochAwayIsPrivateForGoodAndPinsNothing) {
  const uint64_t per_epoch = 4;
  StreamRules r = regenerating(4, per_epoch);
  r.epochs = 0;
  Stream s(r);
  s.join("a", 100);
  s.join("b", 2);
  s.send("b", Seek{5, 4});  // epoch 5 chunk 1, far ahead of the stream
  s.tick();
  EXPECT_TRUE(s.take<SeekReply>("b").front().available);
  EXPECT_EQ(s.regenerate(per_epoch), 2);
  s.tick();
  EXPECT_EQ(indexes(s.take<ChunkDescriptor>("b")), (Seqs{5001, 5002}));
  s.produce(2, per_epoch);
  s.tick();
  EXPECT_EQ(s.consume("a"), (Seqs{0, 1}));
  EXPECT_EQ(s.produce_until_refused(per_epoch), 2) << "b pins no shared chunk";
}

TEST(StreamState, AChunkEveryConsumerSoughtPastIsSkippedAndKeepsItsPlace) {
  Stream s(rules(4));
  s.join("a", 100);
  s.produce(2, 8);
  s.tick();
  s.consume("a");
  auto chunk = [](uint64_t epoch, uint64_t index) {
    protocol::ChunkPosition p;
    p.epoch = epoch;
    p.index_in_epoch = index;
    p.sample_start = index * kChunk;
    p.sample_count = kChunk;
    p.epoch_end = index == 7;
    return p;
  };
  EXPECT_TRUE(s.state.wanted(chunk(0, 2)));
  s.send("a", Seek{1, 0});  // a broke out of epoch 0
  for (uint64_t i = 2; i < 8; ++i) {
    ASSERT_FALSE(s.state.wanted(chunk(0, i))) << "nobody reads the rest of epoch 0";
    s.state.skip(chunk(0, i));
  }
  EXPECT_TRUE(s.state.wanted(chunk(1, 0)));
  s.produce(1, 8);
  s.tick();
  EXPECT_TRUE(s.take<SeekReply>("a").front().available);
  auto ds = s.take<ChunkDescriptor>("a");
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].seq, 8u);
  EXPECT_EQ(ds[0].position.stream_position, 8 * kChunk) << "skipped chunks keep their place";
  EXPECT_EQ(s.state.stats().chunks_skipped, 6u);
}

TEST(StreamState, ACatchUpFindsSlotsWhileTheOthersDoNotRead) {
  // Two loaders of one process: a pauses with every chunk it has not read pinned, while b
  // joins mid-epoch. b's private chunks must still find slots, or each would wait for the other.
  const uint64_t per_epoch = 100;
  Stream s(regenerating(8, per_epoch));
  s.lead("a", 4, per_epoch);
  EXPECT_EQ(s.produce_until_refused(per_epoch), 8 - 3) << "the stream leaves the reserve";
  s.tick();
  s.join("b", 2);  // mid-epoch 0: catches up from chunk 0
  s.tick();
  EXPECT_GT(s.regenerate(per_epoch), 0) << "b's private chunks get the reserved slots";
  s.tick();
  EXPECT_FALSE(s.take<ChunkDescriptor>("b").empty());
}

TEST(StreamState, AConsumerThatLeavesWhileCatchingUpHoldsNobodyBack) {
  const uint64_t per_epoch = 100;
  Stream s(regenerating(8, per_epoch));
  s.lead("a", 12, per_epoch);
  s.join("b", 2);  // catches up from chunk 0, pinning its merge chunk
  s.tick();
  s.regenerate(per_epoch);
  s.tick();
  auto held = s.take<ChunkDescriptor>("b");
  ASSERT_FALSE(held.empty());
  s.send("b", protocol::Goodbye{});  // still holding what it was sent
  EXPECT_EQ(s.produce_until_refused(per_epoch), std::min(8 - 3, 8 - static_cast<int>(held.size())))
      << "the stream goes on, up to the ring less its reserve; b's held slots stay out";
}

// `got` is the stream from its first chunk on (`per_epoch` chunks an epoch), without a gap: the
// first chunks regenerated, the last the shared stream's.
void expect_caught_up(const std::vector<ChunkDescriptor>& got, uint64_t per_epoch,
                      const std::string& id) {
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].position.epoch * per_epoch + got[i].position.index_in_epoch, i)
        << id << ": every chunk, in order";
    if (i) {
      EXPECT_EQ(got[i].position.stream_position, got[i - 1].position.stream_position + kChunk)
          << id << ": no gap";
    }
  }
  ASSERT_FALSE(got.empty()) << id;
  EXPECT_TRUE(protocol::is_private_seq(got.front().seq)) << id << " caught up privately";
  EXPECT_FALSE(protocol::is_private_seq(got.back().seq)) << id << " merged into the stream";
}

TEST(StreamState, SeveralConsumersCatchingUpAtOnceAllReachTheStream) {
  // The soak's stall: consumers that join mid-epoch together (trainers started at once) all
  // catch up privately. Private chunks are not shared, so their slots add up; had each consumer
  // kept its private chunks while its user held their batches, three of them took every slot
  // of the reserve and none got a next chunk. Released on arrival, they share it.
  const uint64_t per_epoch = 100;
  Stream s(regenerating(8, per_epoch));
  s.lead("a", 12, per_epoch);
  const std::vector<std::string> late = {"b", "c", "d"};
  for (const auto& id : late) s.join(id, 3);
  std::map<std::string, std::vector<ChunkDescriptor>> got;
  for (int round = 0; round < 400; ++round) {
    s.regenerate(per_epoch);
    if (auto f = s.fill()) s.publish(*f, per_epoch);
    s.tick();
    if (auto n = s.consume("a").size()) s.credit("a", static_cast<uint32_t>(n));
    for (const auto& id : late)
      for (auto& d : s.client_reads(id, true)) got[id].push_back(d);
  }
  for (const auto& id : late) {
    EXPECT_GE(got[id].size(), 30u) << id << " stalled";
    expect_caught_up(got[id], per_epoch, id);
  }
}

TEST(StreamState, ACatchUpGoesOnWhileAnotherCatchingUpIsNotRead) {
  // Two loaders of one thread read in lockstep (zip) while both catch up: while the user waits
  // for b's next batch, c is not read, however many chunks it asked for ahead (3 here, the
  // whole reserve). Its private chunks are released on arrival, so they leave b slots.
  const uint64_t per_epoch = 100;
  Stream s(regenerating(8, per_epoch));
  s.lead("a", 12, per_epoch);
  s.join("b", 3);
  s.join("c", 3);
  std::map<std::string, std::vector<ChunkDescriptor>> got;
  auto rounds = [&](int n, bool read_c) {
    for (int round = 0; round < n; ++round) {
      s.regenerate(per_epoch);
      if (auto f = s.fill()) s.publish(*f, per_epoch);
      s.tick();
      if (auto k = s.consume("a").size()) s.credit("a", static_cast<uint32_t>(k));
      for (auto& d : s.client_reads("b", true)) got["b"].push_back(d);
      for (auto& d : s.client_reads("c", read_c)) got["c"].push_back(d);
    }
  };
  rounds(100, /*read_c=*/false);
  ASSERT_FALSE(got["b"].empty());
  EXPECT_FALSE(protocol::is_private_seq(got["b"].back().seq))
      << "b reached the stream while c was not read";
  EXPECT_TRUE(got["c"].empty());
  rounds(300, /*read_c=*/true);  // the user gets to c: both go on together
  for (const std::string id : {"b", "c"}) {
    EXPECT_GE(got[id].size(), 30u) << id << " stalled";
    expect_caught_up(got[id], per_epoch, id);
  }
}

}  // namespace
}  // namespace batchcast

namespace batchcast {
namespace {

// Stall policy decouple on a producer that regenerates (epochs of 100 chunks, ring of 8): "a"
// reads everything at once; "b" read chunk 0 and asks for nothing more, so after the ring has
// filled b pins the oldest chunk nobody holds while a waits for the stream's next one.
struct Decoupling {
  static constexpr uint64_t kPerEpoch = 100;
  explicit Decoupling(StallPolicy policy = StallPolicy::kDecouple, bool regenerates = true,
                      double b_bound = 0)
      : s([&] {
          StreamRules r = regenerating(8, kPerEpoch);
          r.regenerates = regenerates;
          r.stall_policy = policy;
          r.epochs = 0;
          return r;
        }()) {
    s.join("a", 1000);
    protocol::Hello h;
    h.pid = s.pid_of("b");
    h.boot_id = kBoot;
    h.stall_timeout_s = b_bound;
    s.send("b", h);
    s.credit("b", 1);
    s.produce(1, kPerEpoch);
    s.tick();
    EXPECT_EQ(s.consume("b"), Seqs{0});
    s.consume("a");
    filled = s.produce_until_refused(kPerEpoch);
    s.tick();
    s.consume("a");
  }
  // Advances the clock by `seconds` and ticks; true if the producer then gets a slot.
  bool after(double seconds) {
    s.now += seconds;
    s.tick();
    auto f = s.fill();
    if (f) s.publish(*f, kPerEpoch);
    return f.has_value();
  }
  const StreamStats::Consumer& stats_of(const StreamStats& st, const std::string& id) {
    for (const auto& c : st.consumers)
      if (c.pid == s.pid_of(id)) return c;
    throw std::runtime_error("no consumer " + id);
  }
  // One round: the producer fills and publishes up to `fills` chunks, regenerates, ticks, `a`
  // reads, and `b` takes what it was sent, releasing each chunk and giving its credit back.
  void round(int fills, std::vector<ChunkDescriptor>* got) {
    for (int i = 0; i < fills; ++i)
      if (auto f = s.fill()) s.publish(*f, kPerEpoch);
    s.regenerate(kPerEpoch);
    s.tick();
    s.consume("a");
    for (auto& c : s.take<ChunkDescriptor>("b")) {
      got->push_back(c);
      s.release("b", c);
      s.credit("b", 1);
    }
  }
  Stream s;
  int filled = 0;
};

TEST(StreamState, UnderDecoupleAConsumerHoldingTheStreamBackStopsPinningAfterItsBound) {
  Decoupling d;
  EXPECT_EQ(d.filled, 5) << "the ring less the catch-up reserve, then b pins chunk 1";
  EXPECT_FALSE(d.after(9.9)) << "b has held the stream back for less than stall_timeout";
  EXPECT_EQ(d.s.state.stats().decouplings, 0u);
  EXPECT_TRUE(d.after(0.2)) << "b no longer pins: the stream goes on with a";
  auto st = d.s.state.stats();
  EXPECT_EQ(st.decouplings, 1u);
  EXPECT_TRUE(d.stats_of(st, "b").decoupled);
  EXPECT_EQ(d.stats_of(st, "b").behind, 6 * kChunk) << "from chunk 1 to the newest, chunk 6";
}

TEST(StreamState, ADecoupledConsumerReadsWhatItMissedAsRegeneratedChunksInOrder) {
  Decoupling d;
  ASSERT_TRUE(d.after(10.1));
  d.s.produce_until_refused(Decoupling::kPerEpoch);  // chunks 1, 2, ... are reused
  d.s.credit("b", 3);
  d.s.tick();
  EXPECT_EQ(d.s.regenerate(Decoupling::kPerEpoch), 3) << "asked ahead as far as its credits";
  d.s.tick();
  auto got = d.s.take<ChunkDescriptor>("b");
  ASSERT_EQ(got.size(), 3u);
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_TRUE(protocol::is_private_seq(got[i].seq));
    EXPECT_EQ(got[i].position.index_in_epoch, i + 1) << "from where it was: nothing lost";
    EXPECT_EQ(got[i].position.stream_position, (i + 1) * kChunk) << "no gap reported";
  }
  EXPECT_EQ(d.s.state.stats().chunks_regenerated, 3u);
}

TEST(StreamState, ADecoupledConsumerMergesBackWhenItHasCaughtUp) {
  Decoupling d;
  ASSERT_TRUE(d.after(10.1));
  // The stream goes on with a, one chunk a round; b, resumed, reads two regenerated ones (its
  // four credits go round in two rounds: asked, filled, sent).
  std::vector<ChunkDescriptor> got;
  d.s.credit("b", 4);
  for (int round = 0; round < 60 && (got.empty() || protocol::is_private_seq(got.back().seq));
       ++round)
    d.round(1, &got);
  ASSERT_FALSE(got.empty());
  EXPECT_FALSE(protocol::is_private_seq(got.back().seq)) << "b merged into the shared stream";
  EXPECT_GE(got.size(), 8u) << "not before the stream went a ring's worth on without it";
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_EQ(got[i].position.index_in_epoch, i + 1) << "every chunk once, in order";
  EXPECT_FALSE(d.stats_of(d.s.state.stats(), "b").decoupled);
}

TEST(StreamState, ADecoupledConsumerAsSlowAsBeforeStaysDecoupled) {
  Decoupling d;
  ASSERT_TRUE(d.after(10.1));
  // The stream goes on with a, two chunks a round; b reads a private chunk every other
  // round (its credit goes round in two rounds: asked, filled, sent).
  std::vector<ChunkDescriptor> got;
  d.s.credit("b", 1);
  for (int round = 0; round < 40; ++round) d.round(2, &got);
  ASSERT_GE(got.size(), 19u) << "b reads on at its own pace";
  for (const auto& c : got) EXPECT_TRUE(protocol::is_private_seq(c.seq));
  EXPECT_EQ(d.s.state.stats().decouplings, 1u) << "decoupled once, never merged back";
}

TEST(StreamState, ALoneSlowConsumerIsNeverDecoupled) {
  const uint64_t per_epoch = 100;
  StreamRules r = regenerating(8, per_epoch);
  r.stall_policy = StallPolicy::kDecouple;
  Stream s(r);
  s.join("b", 1);
  s.produce_until_refused(per_epoch);
  s.tick();
  s.now += 100;
  s.tick();
  EXPECT_FALSE(s.fill()) << "it holds back nobody: decoupling would only cost decoding";
  EXPECT_EQ(s.state.stats().decouplings, 0u);
}

TEST(StreamState, UnderDecoupleAConsumerPinningTheRingForAResumedOneIsDecoupled) {
  // A 4-slot ring, 3 epochs of 4 chunks, every chunk made: "a" read 8 chunks, holds 8 and 9
  // unread and pins 10 and 11. "b" resumes epoch 0, long gone: its private chunks find no
  // slot until a, holding it back, is decoupled (nobody else reads the stream).
  const uint64_t per_epoch = 4;
  StreamRules r = regenerating(4, per_epoch);
  r.stall_policy = StallPolicy::kDecouple;
  r.epochs = 3;
  Stream s(r);
  s.join("a", 1);
  for (int i = 0; i < 8; ++i) {
    s.produce(1, per_epoch);
    s.tick();
    s.consume("a");
    s.credit("a", 1);
  }
  s.credit("a", 1);
  EXPECT_EQ(s.produce_until_refused(per_epoch), 4);
  s.state.finish();
  s.tick();
  EXPECT_EQ(s.seqs("a"), (Seqs{8, 9}));
  s.join("b", 2);
  s.send("b", Seek{0, 4});
  s.tick();
  ASSERT_TRUE(s.take<SeekReply>("b").front().available);
  EXPECT_EQ(s.regenerate(per_epoch), 0) << "every slot holds a chunk a has not read";
  s.now += 9.9;
  s.tick();
  EXPECT_EQ(s.regenerate(per_epoch), 0) << "a has held b back for less than stall_timeout";
  s.now += 0.2;
  s.tick();
  EXPECT_EQ(s.state.stats().decouplings, 1u);
  EXPECT_EQ(s.regenerate(per_epoch), 2) << "a no longer pins 10 and 11: b reads on";
  s.tick();
  EXPECT_EQ(indexes(s.take<ChunkDescriptor>("b")), (Seqs{1, 2}));
}

TEST(StreamState, AConsumersOwnStallBoundOverridesTheServers) {
  Decoupling d(StallPolicy::kDecouple, true, 2.0);
  EXPECT_FALSE(d.after(1.9));
  EXPECT_TRUE(d.after(0.2)) << "b's Hello asked to be decoupled after 2 s";
}

TEST(StreamState, WithoutRegenerationDecoupleWaitsAsUnderWait) {
  Decoupling d(StallPolicy::kDecouple, false);
  EXPECT_FALSE(d.after(1e6));
  EXPECT_EQ(d.s.state.stats().decouplings, 0u);
}

TEST(StreamState, TheOthersAreToldWhichConsumerHoldsTheStreamBack) {
  Decoupling d(StallPolicy::kWait);
  d.s.inbox.clear();
  d.s.now += 1.5;
  d.s.tick();
  auto a = d.s.take<protocol::Heartbeat>("a");
  ASSERT_FALSE(a.empty());
  const std::string pid = "pid " + std::to_string(d.s.pid_of("b"));
  EXPECT_NE(a.back().waiting_for.find(pid), std::string::npos) << a.back().waiting_for;
  EXPECT_NE(a.back().waiting_for.find("holds the stream back"), std::string::npos);
  auto b = d.s.take<protocol::Heartbeat>("b");
  ASSERT_FALSE(b.empty());
  EXPECT_EQ(b.back().waiting_for, "") << "b itself waits for nothing";
  auto st = d.s.state.stats();
  EXPECT_GE(d.stats_of(st, "b").holding_s, 1.5);
  EXPECT_EQ(d.stats_of(st, "b").held, 0u);
}

TEST(StreamState, BeforeMinConsumersHeartbeatsSayHowManyAreAttached) {
  Stream s(rules(4, 3));
  s.join("a", 10);
  s.now += 1;
  s.tick();
  auto a = s.take<protocol::Heartbeat>("a");
  ASSERT_FALSE(a.empty());
  EXPECT_EQ(a.back().waiting_for, "min_consumers not met: 1 of 3 consumers attached");
}

// Views: a consumer reads its view's pool and tensors; one whose view is added by its Hello
// mid-epoch gets that epoch whole, the chunks made before its view regenerated for it, then
// the shared stream from the first chunk made with its view; a view that cannot be made is
// refused with an ErrorMessage and nobody else notices.
TEST(StreamState, AViewAddedAtAttachGetsItsWholeEpochInItsOwnPool) {
  constexpr uint64_t kPerEpoch = 4;
  Stream s(regenerating(8, kPerEpoch));
  s.lead("a", 2, kPerEpoch);  // epoch 0 is two chunks along
  s.hello("bad", protocol::LateJoin::kReplay, true, "colour=red");
  auto refused = s.take<protocol::ErrorMessage>("bad");
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_NE(refused[0].message.find("colour=red"), std::string::npos);
  EXPECT_TRUE(s.take<protocol::Welcome>("bad").empty());
  EXPECT_EQ(s.state.consumers_now(), 1u);

  s.hello("b", protocol::LateJoin::kReplay, true, "size=6");
  auto welcome = s.take<protocol::Welcome>("b");
  ASSERT_EQ(welcome.size(), 1u);
  EXPECT_EQ(welcome[0].segment_name, "pool.v1");
  s.credit("b", 100);
  std::vector<ChunkDescriptor> got;
  for (int round = 0; round < 10 && got.size() < 2 * kPerEpoch; ++round) {
    s.regenerate(kPerEpoch);
    if (auto f = s.fill()) s.publish(*f, kPerEpoch);
    s.tick();
    s.consume("a");
    for (auto& d : s.take<ChunkDescriptor>("b")) {
      s.release("b", d);
      got.push_back(d);
    }
  }
  ASSERT_GE(got.size(), 2 * kPerEpoch);
  for (size_t i = 0; i < 2 * kPerEpoch; ++i) {
    EXPECT_EQ(got[i].position.epoch, i / kPerEpoch) << i;
    EXPECT_EQ(got[i].position.index_in_epoch, i % kPerEpoch) << i;
    ASSERT_EQ(got[i].tensors.size(), 2u);
    EXPECT_EQ(got[i].tensors[0].shape, (std::vector<int64_t>{kChunk, 6})) << "its view's tensor";
    EXPECT_EQ(got[i].tensors[1].offset, 256u) << "laid out in its view's slot";
  }
  EXPECT_TRUE(protocol::is_private_seq(got[0].seq)) << "made before its view: regenerated";
  EXPECT_FALSE(protocol::is_private_seq(got[2 * kPerEpoch - 1].seq)) << "merged: shared";
  // A second consumer of the same view reads the same pool.
  s.hello("c", protocol::LateJoin::kReplay, true, "size=6");
  EXPECT_EQ(s.take<protocol::Welcome>("c").at(0).segment_name, "pool.v1");
  EXPECT_EQ(s.state.view_count(), 2u);
}

TEST(StreamState, APrivateChunkNamesItsConsumersViewAndAStreamChunkNone) {
  constexpr uint64_t kPerEpoch = 4;
  Stream s(regenerating(8, kPerEpoch));
  s.lead("a", 2, kPerEpoch);
  s.hello("b", protocol::LateJoin::kReplay, true, "size=6");  // view 1, after two chunks
  s.credit("b", 100);
  s.tick();
  auto stream = s.fill();
  ASSERT_TRUE(stream);
  EXPECT_FALSE(stream->view) << "a stream chunk is filled in every view";
  auto mine = s.state.try_acquire_private(s.now);
  ASSERT_TRUE(mine) << "the chunks before its view are regenerated for it";
  EXPECT_EQ(mine->regenerate, (ChunkAddress{0, 0}));
  ASSERT_TRUE(mine->view);
  EXPECT_EQ(*mine->view, 1u) << "only b is sent it: filled in b's view alone";
}

// A ring sized by memory (rules.lead_chunks): the producer fills only `lead` chunks nobody was
// sent; the rest of the ring is a window in which consumers drift apart without holding anyone.
StreamRules windowed(uint32_t slots, uint32_t lead) {
  StreamRules r = regenerating(slots, 100);
  r.lead_chunks = lead;
  r.epochs = 0;
  return r;
}

TEST(StreamState, WithALeadTheProducerFillsThatManyChunksAheadOfEveryReader) {
  Stream s(windowed(64, 4));
  EXPECT_EQ(s.produce_until_refused(), 4) << "before anyone reads: the lead, not the ring";
  s.join("a", 2);
  s.tick();
  EXPECT_EQ(s.consume("a"), (Seqs{0, 1}));
  EXPECT_EQ(s.produce_until_refused(), 2) << "two were sent: two more may be filled";
  s.now += 5;
  EXPECT_EQ(s.produce_until_refused(), 0);
  s.tick();
  EXPECT_EQ(s.state.stats().decouplings, 0u) << "waiting for readers holds nobody back";
  EXPECT_GE(s.state.producer_blocked_s(s.now), 5.0) << "but it is time the producer waited";
}

// b pauses (asks for nothing more after chunk 0) while a reads on, one chunk per `step`
// seconds, until the window is full. Returns how many chunks a read.
int fill_the_window(Stream& s, double step) {
  s.join("a", 1000);
  s.join("b", 1);
  s.produce(1);
  s.tick();
  EXPECT_EQ(s.consume("b"), Seqs{0});
  s.consume("a");
  int read = 0;
  for (auto f = s.fill(); f; f = s.fill(), ++read) {
    s.publish(*f, 100);
    s.now += step;
    s.tick();
    s.consume("a");
  }
  return read;
}

TEST(StreamState, APausedConsumerFallsBehindInTheWindowWithoutHoldingTheOthersBack) {
  Stream s(windowed(64, 4));
  // A second per chunk: b is past its bound long before the window is full.
  const int read = fill_the_window(s, 1.0);
  // The window: b may pin the ring less the catch-up reserve (16) before the producer waits.
  EXPECT_EQ(read, 64 - 16);
  EXPECT_EQ(s.state.stats().decouplings, 0u) << "b held nobody back while the window lasted";
  // b comes back: it reads on from chunk 1 in the shared chunks, nothing regenerated.
  s.credit("b", 1000);
  s.tick();
  const Seqs got = s.consume("b");
  ASSERT_EQ(got.size(), static_cast<size_t>(read));
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], i + 1);
  EXPECT_EQ(s.state.stats().chunks_regenerated, 0u);
}

// When the window fills, a reader that has been behind the others for its bound already is
// decoupled at once: the others do not wait for it a second time (and a pause shorter than the
// bound still gets its bound, below).
TEST(StreamState, AReaderLongBehindIsDecoupledAsSoonAsTheWindowFills) {
  Stream s(windowed(64, 4));  // stall bound 10 s
  EXPECT_EQ(fill_the_window(s, 1.0), 64 - 16) << "48 s behind";
  s.now += 0.1;
  s.tick();
  EXPECT_EQ(s.state.stats().decouplings, 1u);
  for (const auto& c : s.state.stats().consumers)
    EXPECT_EQ(c.decoupled, c.pid == s.pid_of("b")) << "pid " << c.pid;
  EXPECT_TRUE(s.fill()) << "the window no longer waits for b";
}

TEST(StreamState, AReaderBehindForLessThanItsBoundWhenTheWindowFillsGetsItsBound) {
  Stream s(windowed(24, 4));  // a window of 24 - 6 slots, read in 1.8 s; stall bound 10 s
  EXPECT_EQ(fill_the_window(s, 0.1), 24 - 6);
  s.now += 0.1;
  s.tick();
  EXPECT_EQ(s.state.stats().decouplings, 0u) << "b is not decoupled for a short pause";
  for (int i = 0; i < 11; ++i) {
    s.now += 1;
    s.tick();
  }
  EXPECT_EQ(s.state.stats().decouplings, 1u) << "but once it held the stream back its bound";
}

// A GPU pool's ring of 8 slots, endless epochs of `per_epoch` chunks, the default stall bound.
StreamRules gpu_ring(uint64_t per_epoch) {
  StreamRules r = regenerating(8, per_epoch);
  r.epochs = 0;
  r.stall_timeout_s = 3;
  return r;
}

// Lockstep on a small ring (a GPU pool's 8 slots), the readers reading as the client does
// (client/consumer.cpp): each asks for `prefetch` (2) chunks, asks for one more as its user
// takes one, copies a private chunk out and releases it as it arrives, and releases a stream
// chunk once the user is done with it. The fast one keeps one chunk in hand and takes one every
// round; the slow one works on one every 4 rounds and keeps 3 in hand (`eager`: it takes each
// chunk as it arrives, a GPU trainer whose loader runs ahead while its batches wait for the
// GPU, so it never has one left unread and always has credits). The ring fills with what the
// slow one holds and the fast one waits for each of its releases. The producer takes
// `fill_rounds` rounds to fill a chunk (nvJPEG on a GPU time-sliced with the trainers): while it
// fills the slot the slow one freed, the fast one still waits for the slow one.
// Returns the reads of the fast and the slow reader; `stats` the stream's.
std::pair<uint64_t, uint64_t> read_fast_beside_slow(int fill_rounds, bool eager, StreamStats* stats,
                                                    int slow_every = 4) {
  constexpr uint64_t kPerEpoch = 100;
  Stream s(gpu_ring(kPerEpoch));
  s.join("fast", 2);
  s.join("slow", 2);
  struct Reader {
    std::vector<ChunkDescriptor> queued, in_hand;
    uint64_t read = 0;
    double wait_s = 0;  // rounds it had nothing to work on, told in its heartbeats
  };
  std::map<std::string, Reader> readers;
  auto take = [&](const std::string& id) {  // the user takes the next chunk
    Reader& rd = readers[id];
    const ChunkDescriptor d = rd.queued.front();
    rd.queued.erase(rd.queued.begin());
    s.credit(id, 1);
    if (protocol::is_private_seq(d.seq))
      s.release(id, d);  // copied out on arrival (its copy is in hand)
    else
      rd.in_hand.push_back(d);
  };
  auto done_with_oldest = [&](const std::string& id, size_t keep) {
    Reader& rd = readers[id];
    while (rd.in_hand.size() > keep) {
      s.release(id, rd.in_hand.front());
      rd.in_hand.erase(rd.in_hand.begin());
    }
  };
  std::optional<StreamState::Fill> filling;
  int filled_in = 0;
  for (int round = 0; round < 2000; ++round) {
    if (!filling) filling = s.fill(), filled_in = fill_rounds;
    if (filling && --filled_in <= 0) s.publish(*filling, kPerEpoch), filling.reset();
    s.regenerate(kPerEpoch);
    s.tick();
    for (const char* id : {"fast", "slow"})
      for (auto& d : s.take<ChunkDescriptor>(id)) readers[id].queued.push_back(d);
    if (!readers["fast"].queued.empty()) {
      take("fast");
      ++readers["fast"].read;
      done_with_oldest("fast", 1);
    }
    Reader& slow = readers["slow"];
    if (eager)
      while (!slow.queued.empty()) take("slow");
    if (round % slow_every == 0 && (eager ? !slow.in_hand.empty() : !slow.queued.empty())) {
      if (!eager) take("slow");
      ++slow.read;
      done_with_oldest("slow", eager ? slow.in_hand.size() - 1 : 3);
    }
    // Its heartbeats carry its pace: a slow reader is not caught up first (it is not faster
    // than the stream), so it stays decoupled instead of holding the stream back again.
    for (const char* id : {"fast", "slow"}) {
      Reader& rd = readers[id];
      if (rd.queued.empty() && (std::string(id) == "fast" || rd.in_hand.empty()))
        rd.wait_s += 0.05;
      s.send(id, protocol::Heartbeat{rd.read * kChunk, rd.wait_s, {}});
    }
    s.now += 0.05;
  }
  *stats = s.state.stats();
  for (auto& c : stats->consumers) c.name = c.pid == s.pid_of("slow") ? "slow" : "fast";
  return {readers["fast"].read, readers["slow"].read};
}

// The slow one holds the stream back as a cursor left behind would, and it (not the fast one) is
// decoupled, however long the producer takes to fill a chunk, and whether or not it has taken
// every chunk it was sent.
TEST(StreamState, TheSlowerOfTwoReadersHoldingTheirChunksInLockstepIsDecoupled) {
  for (int fill_rounds : {1, 2}) {
    for (bool eager : {false, true}) {
      StreamStats st;
      auto [fast, slow] = read_fast_beside_slow(fill_rounds, eager, &st);
      const std::string what =
          "fill_rounds " + std::to_string(fill_rounds) + (eager ? ", eager" : "");
      EXPECT_EQ(st.decouplings, 1u) << what;
      for (const auto& c : st.consumers) EXPECT_EQ(c.decoupled, c.name == "slow") << c.name;
      // Lockstep reads both at the slow one's pace; decoupled, the producer fills for both, so
      // the fast one gets what the slow one leaves of it (2 rounds a chunk: about 150 of 200).
      EXPECT_GT(2 * fast, 3 * slow) << what << ": the fast one no longer waits for the slow one";
    }
  }
}

// Two readers of one speed are never decoupled, however many chunks one keeps in hand.
TEST(StreamState, ReadersOfOneSpeedInLockstepAreNotDecoupled) {
  for (int fill_rounds : {1, 2}) {
    for (bool eager : {false, true}) {
      StreamStats st;
      auto [fast, slow] = read_fast_beside_slow(fill_rounds, eager, &st, 1);
      EXPECT_EQ(st.decouplings, 0u) << "fill_rounds " << fill_rounds << (eager ? ", eager" : "");
      EXPECT_NEAR(double(fast), double(slow), 0.02 * fast);
    }
  }
}

// Two readers at the head of a producer that is the bottleneck (nvJPEG on a GPU both trainers
// keep busy): it fills as many chunks as the ring lets it and finishes one every 3 rounds; each
// reader takes each chunk as it arrives, and the slower one keeps the one before too (its GPU
// still works on that batch). The producer keeps finding the ring full with a reader waiting, but
// nobody holds the stream back: it goes at the producer's pace with or without them, and
// decoupling one would only add its private chunks to the producer's work.
TEST(StreamState, ReadersWaitingForABusyProducerHoldNobodyBack) {
  constexpr uint64_t kPerEpoch = 100;
  Stream s(gpu_ring(kPerEpoch));
  s.join("fast", 2);
  s.join("slow", 2);
  std::deque<StreamState::Fill> filling;
  std::map<std::string, std::deque<ChunkDescriptor>> in_hand;
  uint64_t published = 0, found_full = 0;
  for (int round = 0; round < 600; ++round) {  // 30 s, ten stall bounds
    while (auto f = s.fill()) filling.push_back(*f);
    found_full += filling.size() >= 2;
    if (round % 3 == 0 && !filling.empty()) {
      s.publish(filling.front(), kPerEpoch);
      filling.pop_front();
      ++published;
    }
    s.tick();
    for (const auto& [id, keep] : {std::pair<const char*, size_t>{"fast", 1}, {"slow", 2}}) {
      for (auto& d : s.take<ChunkDescriptor>(id)) {
        s.credit(id, 1);
        in_hand[id].push_back(d);
      }
      while (in_hand[id].size() > keep) {
        s.release(id, in_hand[id].front());
        in_hand[id].pop_front();
      }
    }
    s.now += 0.05;
  }
  ASSERT_GT(found_full, 500u) << "the producer had chunks in hand and wanted more slots";
  EXPECT_GE(published, 199u) << "the stream went at the producer's pace";
  EXPECT_EQ(s.state.stats().decouplings, 0u);
  EXPECT_GE(s.state.producer_blocked_s(s.now), 20.0) << "it found the ring full";
}

// Two GPU trainers of one speed at the head of a producer that is what both wait for (nvJPEG on
// a GPU the trainers keep busy): it fills chunks in the order they were asked for, stream and
// private alike, and finishes one every `fill_rounds` rounds. Each reader takes each chunk as it
// arrives, gives its credit back, keeps one in hand, and tells its counters in heartbeats (a
// round with nothing to take is waited for). `b` warms up for its first `warm_up_s` seconds: it
// holds its first chunk and reads nothing more (cudnn autotuning, a validation pass). With
// `b_every`, b is paced instead: a chunk every `b_every` rounds on schedule, and as many as it
// is sent while it is behind it (a trainer that sleeps until its next batch is due). Returns
// each reader's chunks read over the last `tail_rounds` rounds; `stats` the stream's.
std::pair<uint64_t, uint64_t> read_after_warm_up(double warm_up_s, int rounds, int tail_rounds,
                                                 StreamStats* stats, int b_every = 0) {
  constexpr uint64_t kPerEpoch = 100;
  constexpr int kFillRounds = 2;
  constexpr double kRoundS = 0.05;
  Stream s(gpu_ring(kPerEpoch));
  s.join("a", 2);
  s.join("b", 2);
  std::deque<StreamState::Fill> filling;
  int busy = kFillRounds;
  struct Reader {
    std::deque<ChunkDescriptor> in_hand;
    uint64_t read = 0, tail = 0;
    double wait_s = 0;
  };
  std::map<std::string, Reader> readers;
  const double start = s.now;
  for (int round = 0; round < rounds; ++round) {
    while (auto f = s.state.try_acquire_private(s.now)) filling.push_back(*f);
    while (auto f = s.fill()) filling.push_back(*f);
    if (!filling.empty() && --busy <= 0) {
      const StreamState::Fill f = filling.front();
      filling.pop_front();
      if (f.regenerate)
        s.publish_at(f, f.regenerate->epoch, f.regenerate->index, kPerEpoch);
      else
        s.publish(f, kPerEpoch);
      busy = kFillRounds;
    }
    s.tick();
    for (const char* id : {"a", "b"}) {
      Reader& rd = readers[id];
      const bool warming = std::string(id) == "b" && s.now - start < warm_up_s;
      if (warming && rd.read > 0) continue;  // its first batch takes that long
      if (b_every && std::string(id) == "b" && rd.read > uint64_t(round / b_every)) continue;
      auto got = s.take<ChunkDescriptor>(id);
      if (got.empty()) rd.wait_s += kRoundS;
      for (auto& d : got) {
        s.credit(id, 1);
        ++rd.read;
        if (round >= rounds - tail_rounds) ++rd.tail;
        if (protocol::is_private_seq(d.seq))
          s.release(id, d);  // copied out on arrival
        else
          rd.in_hand.push_back(d);
      }
      while (rd.in_hand.size() > 1) {
        s.release(id, rd.in_hand.front());
        rd.in_hand.pop_front();
      }
      s.send(id, protocol::Heartbeat{rd.read * kChunk, rd.wait_s, {}});
    }
    s.now += kRoundS;
  }
  *stats = s.state.stats();
  for (auto& c : stats->consumers) c.name = c.pid == s.pid_of("b") ? "b" : "a";
  return {readers["a"].tail, readers["b"].tail};
}

// A trainer decoupled while it warmed up reads faster than the stream once warm, but the
// producer is what everyone waits for: on private chunks it would take half of it from the
// stream for good and never close its gap. The stream waits while it catches up, once; then
// both read every chunk the producer makes.
TEST(StreamState, AFastReaderDecoupledWhileWarmingUpCatchesUpAndMerges) {
  StreamStats st;
  constexpr int kTail = 400;  // the last 20 s: the producer makes a chunk every 2 rounds
  auto [a, b] = read_after_warm_up(5.0, 1200, kTail, &st);
  EXPECT_EQ(st.decouplings, 1u) << "b held the stream back while it warmed up";
  for (const auto& c : st.consumers) EXPECT_FALSE(c.decoupled) << c.name << " merged back";
  EXPECT_GE(a, 0.9 * kTail / 2) << "a reads at the producer's pace again";
  EXPECT_GE(b, 0.9 * kTail / 2) << "b too, on the stream's chunks";
  EXPECT_LE(st.chunks_regenerated, 150u) << "b's gap, made once";
}

// A reader decoupled for reading slower than the stream is never caught up first, even though
// it reads in bursts as fast as it is served while behind its schedule: the stream would wait
// for it each time it is decoupled again.
TEST(StreamState, ASlowReaderDecoupledIsNotCaughtUpFirstWhateverItsBursts) {
  StreamStats st;
  constexpr int kTail = 400;
  auto [a, b] = read_after_warm_up(0.0, 1200, kTail, &st, 3);
  EXPECT_EQ(st.decouplings, 1u);
  for (const auto& c : st.consumers) EXPECT_EQ(c.decoupled, c.name == "b") << c.name;
  EXPECT_LE(b, kTail / 3 + 2) << "b reads at most on its schedule";
  EXPECT_GE(a, kTail / 2 - b - 10) << "a gets what b's private chunks leave of the producer";
}

// The lead counts the chunks ahead of the most advanced reader: chunks a reader that went past
// them will never be sent (made before its view existed, say) hold nobody's place.
TEST(StreamState, TheLeadIsCountedFromTheMostAdvancedReader) {
  constexpr uint64_t kPerEpoch = 4;
  StreamRules r = regenerating(64, kPerEpoch);
  r.lead_chunks = 4;
  r.epochs = 0;
  Stream s(r);
  s.join("a", 1);  // reads chunk 0 and keeps it: a trainer busy elsewhere
  s.produce(1, kPerEpoch);
  s.tick();
  ASSERT_EQ(s.seqs("a"), Seqs{0});
  EXPECT_EQ(s.produce_until_refused(kPerEpoch), 4) << "the lead: nobody was sent these";
  s.hello("b", protocol::LateJoin::kReplay, true, "size=6");  // a view made from now on
  s.credit("b", 100);
  std::vector<ChunkDescriptor> got;
  for (int round = 0; round < 40 && got.size() < 2 * kPerEpoch; ++round) {
    s.regenerate(kPerEpoch);
    if (auto f = s.fill()) s.publish(*f, kPerEpoch);
    s.tick();
    for (auto& d : s.take<ChunkDescriptor>("b")) {
      s.release("b", d);
      got.push_back(d);
    }
  }
  ASSERT_GE(got.size(), 2 * kPerEpoch) << "b reads on past the chunks made before its view";
  for (size_t i = 0; i < 2 * kPerEpoch; ++i) {
    EXPECT_EQ(got[i].position.epoch, i / kPerEpoch) << i;
    EXPECT_EQ(got[i].position.index_in_epoch, i % kPerEpoch) << i;
  }
}

}  // namespace
}  // namespace batchcast
