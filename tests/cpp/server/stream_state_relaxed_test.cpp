// Relaxed order (docs/stream.md, "Order"; server/stream/relaxed_readers.h) on the fake clock
// (relaxed_sim.h): readers of random speeds, pauses, late joins, leaves and kills against a
// producer of a fixed capacity. Every epoch a relaxed reader completes is its shard exactly once,
// its descriptors' positions run on without a gap, and the producer decodes little more than the
// fastest reader reads.
#include <algorithm>
#include <random>

#include "relaxed_sim.h"

namespace batchcast::testing {
namespace {

// A fast reader beside one k times slower, from the start: the fast one reads every epoch at
// its pace, the slow one every epoch of its own, and the producer decodes little more than the
// fast one reads.
class RelaxedPairTest : public ::testing::TestWithParam<uint32_t> {};

TEST_P(RelaxedPairTest, SlowerReaderCostsFewDecodes) {
  const uint32_t k = GetParam();
  RelaxedSim sim(/*per_epoch=*/50, /*epochs=*/k + 2, /*slots=*/16, /*capacity=*/1);
  sim.add({"fast"});
  sim.add({"slow", kChunk, static_cast<int>(k)});
  ASSERT_TRUE(sim.run()) << "the readers did not finish";
  EXPECT_TRUE(sim.failures().empty()) << ::testing::PrintToString(sim.failures());
  EXPECT_EQ(sim.epochs_done("fast"), k + 2);
  EXPECT_EQ(sim.epochs_done("slow"), k + 2);
  // The producer decodes exactly what the fast one reads: it is never slowed down, and the slow
  // one reads at its own pace from the fast one's decodes (its tail aside).
  EXPECT_LE(sim.decoded_at_end("fast"), sim.samples("fast") * 11 / 10);
  EXPECT_GE(sim.pace("fast"), 0.95);
  EXPECT_GE(sim.pace("slow"), 0.95);
}

INSTANTIATE_TEST_SUITE_P(Speeds, RelaxedPairTest, ::testing::Values(2u, 4u, 13u, 20u));

// A reader that starts when the first is half through its first epoch reads from the first
// chunk on (no replay, no private chunks), at its own pace.
TEST(RelaxedTest, LateJoinerReadsAtOnce) {
  RelaxedSim sim(50, 4, 16, 1);
  sim.add({"first"});
  sim.add({"late", kChunk, 1, 25});
  ASSERT_TRUE(sim.run());
  EXPECT_TRUE(sim.failures().empty()) << ::testing::PrintToString(sim.failures());
  EXPECT_EQ(sim.epochs_done("late"), 4u);
  EXPECT_GE(sim.pace("first"), 0.95);
  EXPECT_GE(sim.pace("late"), 0.95);
  EXPECT_LE(sim.decoded_at_end("first"), sim.samples("first") * 11 / 10);
}

// A reader that stops for a long while (validation) holds nobody back, and reads on after.
TEST(RelaxedTest, PausedReaderHoldsNobodyBack) {
  RelaxedSim sim(50, 4, 16, 1);
  sim.add({"busy"});
  sim.add({"paused", kChunk, 2, 0, -1, -1, 40, 240});
  ASSERT_TRUE(sim.run());
  EXPECT_TRUE(sim.failures().empty()) << ::testing::PrintToString(sim.failures());
  EXPECT_GE(sim.pace("busy"), 0.95);
  EXPECT_EQ(sim.epochs_done("paused"), 4u);
}

// Readers of random speeds, pauses, late joins, leaves and kills, on one rank of two (each
// epoch a different shard): every epoch a reader completes is its shard once, and the producer
// decodes at most 1.1 x what the fastest reads while it reads, plus one epoch for the tails of
// the others.
TEST(RelaxedTest, RandomReadersGetEachEpochOnce) {
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    std::mt19937 rng(seed);
    auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
    RelaxedSim sim(30, 3, pick(8, 24), 1, 2);
    sim.add({"fastest"});
    for (int i = 0; i < 3; ++i) {
      ReaderPlan p{"r" + std::to_string(i), static_cast<uint32_t>(pick(1, kChunk)), pick(1, 6),
                   pick(0, 100)};
      if (pick(0, 3) == 0) p.leave = p.join + pick(20, 200);
      if (pick(0, 3) == 0) p.killed = p.join + pick(20, 200);
      if (pick(0, 2) == 0) {
        p.pause_from = p.join + pick(0, 50);
        p.pause_to = p.pause_from + pick(10, 300);
      }
      sim.add(p);
    }
    ASSERT_TRUE(sim.run()) << "seed " << seed;
    EXPECT_TRUE(sim.failures().empty())
        << "seed " << seed << ": " << ::testing::PrintToString(sim.failures());
    EXPECT_EQ(sim.epochs_done("fastest"), 3u) << "seed " << seed;
    EXPECT_LE(sim.decoded_at_end("fastest"), sim.samples("fastest") * 11 / 10 + sim.epoch_samples())
        << "seed " << seed;
  }
}

// The shape of an 8-trial sweep (bench/RESULTS.md, "A sweep with batchcast sweep"): eight
// readers of two views, joining up to half an epoch apart at speeds 1 to 1.5x apart, on a ring
// of 8 chunks and epochs of 23, against a producer that decodes several times faster than any
// of them reads. Each reads every epoch once at its own pace, and the producer decodes at most
// 1.1 x what the fastest reads plus one epoch for the others' tails: a chunk stays while
// readers still need its rows, instead of one taker freeing its slot for the next decode.
TEST(RelaxedTest, ASweepOfEightReadersDecodesEachEpochAboutOnce) {
  for (uint32_t seed = 1; seed <= 10; ++seed) {
    std::mt19937 rng(seed);
    auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
    RelaxedSim sim(/*per_epoch=*/23, /*epochs=*/2, /*slots=*/8, /*capacity=*/1);
    std::string fastest;
    int fastest_every = 0;
    for (int i = 0; i < 8; ++i) {
      ReaderPlan p{"r" + std::to_string(i), kChunk, pick(8, 12), i == 0 ? 0 : pick(0, 90)};
      p.view = i % 2 ? "" : "size=8";
      if (fastest.empty() || p.every < fastest_every) {
        fastest = p.id;
        fastest_every = p.every;
      }
      sim.add(p);
    }
    ASSERT_TRUE(sim.run()) << "seed " << seed;
    EXPECT_TRUE(sim.failures().empty())
        << "seed " << seed << ": " << ::testing::PrintToString(sim.failures());
    for (int i = 0; i < 8; ++i) {
      const std::string id = "r" + std::to_string(i);
      EXPECT_EQ(sim.epochs_done(id), 2u) << "seed " << seed << " " << id;
      EXPECT_GE(sim.pace(id), 0.95) << "seed " << seed << " " << id;
    }
    EXPECT_LE(sim.decoded(), sim.samples(fastest) * 11 / 10 + sim.epoch_samples())
        << "seed " << seed;
  }
}

// An exact reader and a relaxed one share the stream: the exact one reads the seeded order,
// the relaxed one takes its rows from the same chunks and nothing is decoded for it alone
// while it keeps up.
TEST(RelaxedTest, ExactAndRelaxedShareOneStream) {
  RelaxedSim sim(50, 3, 16, 1);
  sim.add({"exact", kChunk, 1, 0, -1, -1, -1, -1, true});
  sim.add({"relaxed"});
  ASSERT_TRUE(sim.run());
  EXPECT_TRUE(sim.failures().empty()) << ::testing::PrintToString(sim.failures());
  EXPECT_EQ(sim.epochs_done("exact"), 3u);
  EXPECT_EQ(sim.epochs_done("relaxed"), 3u);
  EXPECT_LE(sim.decoded(), sim.samples("exact") * 11 / 10);
  // What a producer weighing its ways of decoding reads (server/produce/rule_trial.h): every
  // row either reader was sent, once.
  EXPECT_EQ(sim.sent(), sim.samples("exact") + sim.samples("relaxed"));
}

// A reader of a view added after the stream's chunks were made (in view 0 only) is not left
// waiting for them: the samples it needs are decoded for it, in its view.
TEST(RelaxedTest, AReaderOfALaterViewIsDecodedFor) {
  Stream s(make_rules(3, 1, 11));
  for (uint64_t i = 0; i < 3; ++i) {  // made before anyone attached: view 0 only
    auto f = s.fill();
    ASSERT_TRUE(f);
    protocol::ChunkPosition p;
    p.index_in_epoch = i;
    p.sample_start = i * kChunk;
    p.sample_count = kChunk;
    p.epoch_end = i == 2;
    s.state.publish(f->seq, f->slot, p, {{"#", DType::kUInt8, {kChunk}, {1}, 0}},
                    {4 * i, 4 * i + 1, 4 * i + 2, 4 * i + 3});
  }
  s.hello("b", protocol::LateJoin::kReplay, true, "size=8");
  s.credit("b", 4);
  s.tick();
  EXPECT_TRUE(s.take<ChunkDescriptor>("b").empty()) << "sent chunks of another view";
  auto f = s.state.try_acquire_private(s.now);
  ASSERT_TRUE(f) << "nothing decoded for the reader of the later view";
  publish_relaxed(s, *f);
  s.tick();
  auto sent = s.take<ChunkDescriptor>("b");
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].tensors[0].shape[1], 8) << "not its view's tensors";
}

// The mixed decoder's rule (decode_split.h): the chunk being filled for a relaxed reader that
// has credit and nothing to take is the one waited for.
TEST(RelaxedTest, TheChunkAStarvedReaderWaitsForIsTheWaitedChunk) {
  Stream s(make_rules(5, 2, 16));
  s.join("a", 2);
  s.tick();
  auto f = s.state.try_acquire_private(s.now);
  ASSERT_TRUE(f);
  s.tick();
  EXPECT_EQ(s.state.waited_chunk(), std::optional<uint64_t>(f->seq));
}

// Its Welcome tells a consumer the order it is served in.
TEST(RelaxedTest, TheWelcomeSaysTheOrderServed) {
  Stream s(make_rules(5, 2, 16));
  s.hello("relaxed");
  protocol::Hello exact;
  exact.pid = s.pid_of("exact");
  exact.boot_id = kBoot;
  exact.order = protocol::Order::kExact;
  s.send("exact", exact);
  EXPECT_EQ(s.take<protocol::Welcome>("relaxed").at(0).order, protocol::Order::kRelaxed);
  EXPECT_EQ(s.take<protocol::Welcome>("exact").at(0).order, protocol::Order::kExact);
}

}  // namespace
}  // namespace batchcast::testing
