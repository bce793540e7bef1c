// A ring sized by memory (rules.lead_chunks, docs/stream.md), against StreamState alone
// (stream_state_fixture.h): the lead the producer fills ahead of the most advanced reader, and
// the window in which readers drift apart before one is decoupled.
#include <gtest/gtest.h>

#include "tests/cpp/server/stream_state_fixture.h"

namespace batchcast {
namespace {

using namespace batchcast::testing;

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
