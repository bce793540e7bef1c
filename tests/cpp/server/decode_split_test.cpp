// server/produce/decode_split.h: each chunk goes whole to one side; the engine takes chunks only
// while a consumer waits, up to a depth set by the two sides' measured rates. (When a consumer
// counts as waiting is StreamState::waited_chunk's rule, tested in stream_state_*_test.cpp.)
#include "server/produce/decode_split.h"

#include <gtest/gtest.h>

#include <atomic>
#include <optional>
#include <thread>
#include <vector>

namespace batchcast {
namespace {

constexpr uint32_t kSlots = 8;

// The stream as the host hands it over, set by the test: whether a consumer waits, the samples
// sent to consumers and the clock (which stands still unless a test moves it: the trial between
// the split by rates and the engine alone then never leaves its first settling time).
struct FakeStream {
  std::atomic<bool> waits{false};
  std::atomic<uint64_t> sent{0};
  std::atomic<double> now{0};
  DecodeSplit::Stream source() {
    return {[this]() -> std::optional<uint64_t> {
              return waits ? std::optional<uint64_t>(0) : std::nullopt;
            },
            [this] { return sent.load(); }, [this] { return now.load(); }};
  }
};

// Starts the chunk in `slot` (begin, then `n` samples); how many the CPU takes.
int chunk(DecodeSplit& split, uint32_t slot, int n = 64) {
  split.begin(slot);
  int cpu = 0;
  for (int i = 0; i < n; ++i) cpu += split.cpu_decodes(slot);
  return cpu;
}

// A chunk of 64 in `slot` that the engine takes and uploads at `seconds` a sample.
void engine_chunk(DecodeSplit& split, uint32_t slot, double seconds) {
  ASSERT_EQ(chunk(split, slot), 0) << "not the engine's";
  split.uploaded(slot, 64, 64 * seconds);
}

TEST(DecodeSplit, WhileNoConsumerWaitsEveryChunkIsTheCpus) {
  // A stream the CPU keeps up with: the engine's GPU work would only cost the trainers.
  FakeStream stream;
  DecodeSplit split(stream.source(), kSlots, 2);
  for (uint32_t slot = 0; slot < kSlots; ++slot) EXPECT_EQ(chunk(split, slot), 64) << slot;
  EXPECT_EQ(split.cpu_samples(), 8u * 64);
  EXPECT_EQ(split.engine_samples(), 0u);
}

TEST(DecodeSplit, AChunkStaysWithTheSideThatStartedIt) {
  // 20 samples of a chunk are on the CPU when a consumer starts waiting: the other 44 stay there
  // (a chunk split between the sides pays the engine's per-chunk wait for a few images).
  FakeStream stream;
  DecodeSplit split(stream.source(), kSlots, 2);
  split.begin(3);
  for (int i = 0; i < 20; ++i) EXPECT_TRUE(split.cpu_decodes(3));
  stream.waits = true;
  for (int i = 0; i < 44; ++i) EXPECT_TRUE(split.cpu_decodes(3));
  EXPECT_EQ(chunk(split, 4), 0) << "the next chunk is the engine's";
}

TEST(DecodeSplit, UnmeasuredTheEngineHoldsOneChunkAtATime) {
  FakeStream stream;
  stream.waits = true;
  DecodeSplit split(stream.source(), kSlots, 2);
  EXPECT_EQ(split.engine_depth(), 1u);
  EXPECT_EQ(chunk(split, 0), 0) << "a consumer waits: the engine's";
  EXPECT_EQ(chunk(split, 1), 64) << "the engine holds one: the CPU's";
  split.uploaded(1, 0, 0.01);  // a CPU chunk's upload changes nothing
  EXPECT_EQ(chunk(split, 2), 64);
  split.uploaded(0, 64, 0.032);
  EXPECT_EQ(chunk(split, 3), 0) << "the engine's chunk went up: it takes the next";
  EXPECT_EQ(split.engine_samples(), 128u);
  EXPECT_EQ(split.cpu_samples(), 128u);
}

TEST(DecodeSplit, TheEnginesDepthFollowsTheMeasuredRates) {
  // Two workers at 1 ms a sample decode a chunk of 64 in 32 ms; an engine at 0.125 ms a sample
  // decodes 4 chunks meanwhile: it holds 5 (4 decoding, one being prepared).
  FakeStream stream;
  stream.waits = true;
  DecodeSplit split(stream.source(), kSlots, 2);
  split.cpu_sample_done(0.001);
  engine_chunk(split, 0, 0.000125);
  EXPECT_EQ(split.engine_depth(), 5u);
  for (uint32_t slot = 0; slot < 5; ++slot) EXPECT_EQ(chunk(split, slot), 0) << slot;
  EXPECT_EQ(chunk(split, 5), 64) << "the engine holds 5: the workers take the sixth";
  for (uint32_t slot = 0; slot < 5; ++slot) split.uploaded(slot, 64, 64 * 0.000125);
  // An engine slower than the workers together still holds 2: one decoding, one prepared.
  for (int i = 0; i < 100; ++i) engine_chunk(split, 0, 0.004);
  EXPECT_EQ(split.engine_depth(), 2u);
  // One far faster than the workers takes every chunk the ring holds.
  for (int i = 0; i < 100; ++i) engine_chunk(split, 0, 0.00001);
  EXPECT_EQ(split.engine_depth(), kSlots);
}

TEST(DecodeSplit, WhereEveryChunkOnTheEngineServesWaitingConsumersBetterItIsFollowed) {
  // The rates say depth 2: of three chunks in flight the workers take the third. But consumers
  // are sent 9400 samples/s while the engine takes every chunk, against 8000 by rates (the busy
  // workers slow the engine's side): once they wait for data, the trial compares both and
  // follows the engine, which then takes every chunk, whether a consumer waits or not (as
  // --decoder nvjpeg).
  FakeStream stream;
  stream.waits = true;
  DecodeSplit split(stream.source(), kSlots, 2, RuleTrial::Timing{0.5, 1.0, 15.0, 0.03});
  split.cpu_sample_done(0.001);
  for (int i = 0; i < 100; ++i) engine_chunk(split, 0, 0.004);
  ASSERT_EQ(split.engine_depth(), 2u);
  uint64_t cpu_by_rates = 0, cpu_by_engine = 0;
  for (double t = 0; t < 3.5; t += 0.01) {  // three chunks chosen every 10 ms, then uploaded
    stream.now = t;
    const bool by_rates = split.by_rates();
    stream.sent += by_rates ? 80 : 94;
    const uint64_t cpu_before = split.cpu_samples();
    for (uint32_t slot = 1; slot <= 3; ++slot) chunk(split, slot);
    (by_rates ? cpu_by_rates : cpu_by_engine) += split.cpu_samples() - cpu_before;
    for (uint32_t slot = 1; slot <= 3; ++slot) split.uploaded(slot, 64, 64 * 0.004);
  }
  EXPECT_GT(cpu_by_rates, 0u) << "by rates the workers took the third chunk";
  EXPECT_EQ(cpu_by_engine, 0u) << "the engine alone takes every chunk";
  EXPECT_FALSE(split.by_rates());
  EXPECT_NE(split.describe().find("followed every chunk on the engine after 1 trial(s): consumers "
                                  "sent 8000 samples/s by rates, 9400 with every chunk"),
            std::string::npos)
      << split.describe();
  stream.waits = false;
  for (uint32_t slot = 0; slot < kSlots; ++slot) EXPECT_EQ(chunk(split, slot), 0) << slot;
}

TEST(DecodeSplit, ConcurrentWorkersCountEverySample) {
  FakeStream stream;
  stream.waits = true;
  DecodeSplit split(stream.source(), kSlots, 4);
  split.begin(0);  // the engine's: the first chosen while a consumer waits
  split.cpu_decodes(0);
  split.begin(1);  // the CPU's: the engine holds its one chunk
  split.cpu_decodes(1);
  std::vector<std::thread> workers;
  for (int w = 0; w < 4; ++w)
    workers.emplace_back([&, w] {
      for (int s = 0; s < 250; ++s) split.cpu_decodes(w % 2);
    });
  for (auto& t : workers) t.join();
  EXPECT_EQ(split.engine_samples(), 501u);
  EXPECT_EQ(split.cpu_samples(), 501u);
}

}  // namespace
}  // namespace batchcast
