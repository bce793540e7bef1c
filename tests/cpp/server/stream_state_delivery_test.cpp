// The stream rules of delivery (docs/stream.md), against StreamState alone
// (stream_state_fixture.h): order, min_consumers, slot reuse, the ring's bound on the producer,
// where late joiners start, credits, when the head is waited for, refused sends, the welcome and
// heartbeat schedule, the producer's blocked time.
#include <gtest/gtest.h>

#include "tests/cpp/server/stream_state_fixture.h"

namespace batchcast {
namespace {

using namespace batchcast::testing;

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

TEST(StreamState, BeforeMinConsumersHeartbeatsSayHowManyAreAttached) {
  Stream s(rules(4, 3));
  s.join("a", 10);
  s.now += 1;
  s.tick();
  auto a = s.take<protocol::Heartbeat>("a");
  ASSERT_FALSE(a.empty());
  EXPECT_EQ(a.back().waiting_for, "min_consumers not met: 1 of 3 consumers attached");
}

}  // namespace
}  // namespace batchcast
