// server/produce/decode_split.h: a worker decodes a sample itself unless a consumer waits for its
// chunk; then the engine takes it. (When the stream's head counts as waited for is
// StreamState::waited_chunk's rule, tested in stream_state_test.cpp.)
#include "server/produce/decode_split.h"

#include <gtest/gtest.h>

#include <atomic>
#include <optional>
#include <thread>
#include <vector>

namespace batchcast {
namespace {

constexpr uint64_t kNone = ~uint64_t{0};

// The chunk consumers wait for, as the stream host hands it over: set by the test.
struct Waited {
  std::atomic<uint64_t> seq{kNone};
  DecodeSplit::WaitedChunk source() {
    return [this]() -> std::optional<uint64_t> {
      const uint64_t s = seq.load();
      return s == kNone ? std::nullopt : std::optional<uint64_t>(s);
    };
  }
};

// Starts `n` samples of chunk `seq`; how many the CPU takes.
int start(DecodeSplit& split, uint64_t seq, int n) {
  int cpu = 0;
  for (int i = 0; i < n; ++i) cpu += split.cpu_decodes(seq);
  return cpu;
}

TEST(DecodeSplit, WhileNoConsumerWaitsEverySampleIsDecodedOnTheCpu) {
  // A stream the CPU keeps up with: consumers always find a published chunk, whatever the
  // number of chunks queued for the workers (a rule on the backlog alone would send chunks beyond
  // a backlog of two to the engine).
  Waited waited;
  DecodeSplit split(waited.source());
  for (uint64_t seq = 0; seq < 8; ++seq) EXPECT_EQ(start(split, seq, 64), 64) << seq;
  EXPECT_EQ(split.cpu_samples(), 8u * 64);
  EXPECT_EQ(split.engine_samples(), 0u);
}

TEST(DecodeSplit, TheUnstartedSamplesOfTheChunkConsumersWaitForGoToTheEngine) {
  // Chunk 3 is on the CPU; 20 of its 64 samples are started when it becomes the stream's head
  // and a consumer waits for it: the other 44 go to the engine (kept whole on the CPU, the chunk
  // would stall the stream behind it).
  Waited waited;
  DecodeSplit split(waited.source());
  EXPECT_EQ(start(split, 3, 20), 20);
  waited.seq = 3;
  EXPECT_EQ(start(split, 3, 44), 0);
  EXPECT_EQ(split.cpu_samples(), 20u);
  EXPECT_EQ(split.engine_samples(), 44u);
}

TEST(DecodeSplit, OnlyTheWaitedChunkGoesToTheEngineAndTheCpuTakesTheNextOne) {
  // While the engine decodes the head, the workers decode the chunk behind it themselves; once
  // that one is waited for, the engine takes what they have not started of it.
  Waited waited;
  DecodeSplit split(waited.source());
  waited.seq = 5;
  EXPECT_EQ(start(split, 5, 64), 0);   // the head, waited for from its first sample
  EXPECT_EQ(start(split, 6, 30), 30);  // behind it: the CPU's
  EXPECT_EQ(start(split, 7, 10), 10);
  waited.seq = 6;  // chunk 5 published and taken; the consumer is level with chunk 6
  EXPECT_EQ(start(split, 6, 34), 0);
  EXPECT_EQ(start(split, 7, 54), 54);  // not waited for: the CPU's again
  waited.seq = kNone;                  // consumers have chunks to read again
  EXPECT_EQ(start(split, 8, 64), 64);
}

TEST(DecodeSplit, ConcurrentWorkersCountEverySample) {
  Waited waited;
  DecodeSplit split(waited.source());
  waited.seq = 1;
  std::vector<std::thread> workers;
  for (int w = 0; w < 4; ++w)
    workers.emplace_back([&, w] {
      for (int s = 0; s < 250; ++s) split.cpu_decodes(w % 2);  // chunks 0 (CPU) and 1 (engine)
    });
  for (auto& t : workers) t.join();
  EXPECT_EQ(split.cpu_samples(), 500u);
  EXPECT_EQ(split.engine_samples(), 500u);
}

}  // namespace
}  // namespace batchcast
