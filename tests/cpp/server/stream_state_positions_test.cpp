// The stream rules of positions (docs/stream.md, "Positions"), against StreamState alone
// (stream_state_fixture.h): seeks into, ahead of and past what the ring retains, a break to the
// next epoch, regenerated chunks and the catch-up that merges them into the stream.
#include <gtest/gtest.h>

#include "tests/cpp/server/stream_state_fixture.h"

namespace batchcast {
namespace {

using namespace batchcast::testing;

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
