// Relaxed order's resume (docs/stream.md, "Order"; server/stream/relaxed_readers.h): a reader
// restarted from its state resumes its epoch after the samples it had there, on the fake clock
// (relaxed_sim.h) and message by message. The resumed epoch is exactly the rest of its shard,
// once; a resume whose samples had are not that many of the reader's shard is refused, naming the
// fault.
#include <algorithm>
#include <random>

#include "relaxed_sim.h"

namespace batchcast::testing {
namespace {

// A trainer restarted from its state resumes its epoch after the samples it had there: beside
// readers of random speeds, on one rank of two, it is sent exactly the rest of that epoch's shard,
// each sample once (none it had), its positions going on from the count had, then the next
// epochs whole. Its state is taken anywhere: early, mid-epoch, at an epoch's very end.
TEST(RelaxedTest, AResumedReaderReadsTheRestOfItsEpochOnce) {
  for (uint32_t seed = 1; seed <= 30; ++seed) {
    std::mt19937 rng(seed);
    auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
    RelaxedSim sim(20, 3, pick(8, 24), 1, 2);
    sim.add({"other", static_cast<uint32_t>(pick(1, kChunk)), pick(1, 3)});
    ReaderPlan first{"first", static_cast<uint32_t>(pick(1, kChunk)), pick(1, 4)};
    first.leave = pick(5, 250);
    sim.add(first);
    ReaderPlan resumed{"resumed", static_cast<uint32_t>(pick(1, kChunk)), pick(1, 4)};
    resumed.join = first.leave + pick(1, 60);
    resumed.resumes = "first";
    sim.add(resumed);
    ASSERT_TRUE(sim.run()) << "seed " << seed;
    EXPECT_TRUE(sim.failures().empty())
        << "seed " << seed << ": " << ::testing::PrintToString(sim.failures());
    const auto [epoch, had] = sim.yielded("first");
    const uint64_t whole = had == sim.epoch_samples() ? 1 : 0;  // it had its epoch whole

    EXPECT_EQ(sim.epochs_done("resumed"), 3 - epoch - whole)
        << "seed " << seed << ": resumed epoch " << epoch << " after " << had << " samples";
    EXPECT_EQ(sim.epochs_done("other"), 3u) << "seed " << seed;
  }
}

// The producer fills the next chunk for relaxed readers and the stream sends it: what reader
// `id` was sent (empty if nothing was filled or sent).
std::vector<ChunkDescriptor> next_relaxed_chunk(Stream& s, const std::string& id) {
  s.tick();
  auto fill = s.state.try_acquire_private(s.now);
  if (!fill || fill->samples.empty()) return {};
  publish_relaxed(s, *fill);
  s.tick();
  return s.take<ChunkDescriptor>(id);
}

// Resume refusals (a Seek inside an epoch of a relaxed reader): each names its fault, and the
// reader reads on as before; what was sent before a refused Seek is forgotten, so a good resume
// after it starts clean.
TEST(RelaxedTest, ABadResumeIsRefusedNamingTheFault) {
  const uint64_t per_epoch = 5;
  Stream s(make_rules(per_epoch, 4, 16, /*world_size=*/2));  // 40 samples, 20 on this rank
  const StreamPlan plan(per_epoch * kChunk * 2, {7, true, 0, 2});
  const StreamPlan other_rank(per_epoch * kChunk * 2, {7, true, 1, 2});
  const auto shard = plan.epoch_order(2);
  auto bits_of = [](const std::vector<uint64_t>& samples) {
    std::vector<uint64_t> bits(1, 0);
    for (uint64_t x : samples) bits[0] |= uint64_t{1} << x;
    return bits;
  };
  auto refusal = [&](std::vector<protocol::HadSamples> parts, Seek seek) {
    for (const auto& part : parts) s.send("a", part);
    s.send("a", seek);
    auto replies = s.take<SeekReply>("a");
    EXPECT_EQ(replies.size(), 1u);
    if (replies.empty()) return std::string("no reply");
    EXPECT_FALSE(replies[0].available) << "accepted";
    EXPECT_EQ(replies[0].message.rfind("position unavailable: ", 0), 0u) << replies[0].message;
    return replies[0].message;
  };
  s.join("a", 4);
  const std::vector<uint64_t> three(shard.begin(), shard.begin() + 3);
  EXPECT_NE(refusal({}, Seek{2, 5}).find("none came"), std::string::npos);
  EXPECT_NE(refusal(protocol::had_parts(2, bits_of(three)), Seek{2, 5})
                .find("the state says 5 samples of epoch 2 were had but lists 3"),
            std::string::npos);
  EXPECT_NE(refusal(protocol::had_parts(1, bits_of(three)), Seek{2, 3})
                .find("the samples had are of epoch 1, the position of epoch 2"),
            std::string::npos);
  auto foreign = three;
  foreign[1] = other_rank.epoch_order(2)[0];
  const std::string not_ours = refusal(protocol::had_parts(2, bits_of(foreign)), Seek{2, 3});
  EXPECT_NE(not_ours.find("sample " + std::to_string(foreign[1]) +
                          " had is not in this server's shard of epoch 2"),
            std::string::npos)
      << not_ours;
  const std::string beyond = refusal({{2, 0, {1}}, {2, 2, {2}}}, Seek{2, 2});
  EXPECT_NE(beyond.find("sample 129 had is outside the dataset of 40 samples"), std::string::npos)
      << beyond;
  EXPECT_NE(refusal({{2, 0, {uint64_t{1} << 45}}}, Seek{2, 1}).find("sample 45 had is outside"),
            std::string::npos);

  // It reads on as before (its first epoch); a good resume after the refusals starts clean.
  const auto sent = next_relaxed_chunk(s, "a");
  ASSERT_FALSE(sent.empty());
  EXPECT_EQ(sent[0].position.epoch, 0u);
  for (const auto& part : protocol::had_parts(2, bits_of(three))) s.send("a", part);
  s.send("a", Seek{2, 3});
  auto answered = s.take<SeekReply>("a");
  ASSERT_EQ(answered.size(), 1u);
  EXPECT_TRUE(answered[0].available) << answered[0].message;
  std::vector<uint64_t> got = three;
  for (int i = 0; i < 20 && got.size() < shard.size(); ++i) {
    s.credit("a", 1);
    s.tick();
    if (auto g = s.state.try_acquire_private(s.now)) publish_relaxed(s, *g);
    s.tick();
    for (const auto& d : s.take<ChunkDescriptor>("a")) {
      s.release("a", d);
      EXPECT_EQ(d.position.epoch, 2u);
      EXPECT_EQ(d.position.sample_start, got.size());
      EXPECT_EQ(d.position.epoch_samples, shard.size());
      got.insert(got.end(), d.samples.begin(), d.samples.end());
    }
  }
  std::sort(got.begin(), got.end());
  auto expected = shard;
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(got, expected) << "epoch 2 is not the samples had, then the rest of its shard once";
}

// A resume at an epoch's start reads it whole: a Seek to sample 0, with no samples had.
TEST(RelaxedTest, AResumeAtAnEpochStartReadsItWhole) {
  Stream s(make_rules(5, 4, 16));
  s.join("a", 4);
  s.send("a", Seek{2, 0});
  auto answered = s.take<SeekReply>("a");
  ASSERT_EQ(answered.size(), 1u);
  EXPECT_TRUE(answered[0].available);
  const auto sent = next_relaxed_chunk(s, "a");
  ASSERT_FALSE(sent.empty());
  EXPECT_EQ(sent[0].position.epoch, 2u);
  EXPECT_EQ(sent[0].position.sample_start, 0u);
  EXPECT_EQ(sent[0].position.epoch_samples, 20u);
}

}  // namespace
}  // namespace batchcast::testing
