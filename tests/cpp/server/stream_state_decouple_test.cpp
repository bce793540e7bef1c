// The stall policy decouple (docs/stream.md), against StreamState alone (stream_state_fixture.h):
// a consumer holding the stream back stops pinning it after its bound, reads what it missed as
// regenerated chunks and merges back; a consumer's own bound; what the others are told.
#include <gtest/gtest.h>

#include "tests/cpp/server/stream_state_fixture.h"

namespace batchcast {
namespace {

using namespace batchcast::testing;

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

}  // namespace
}  // namespace batchcast
