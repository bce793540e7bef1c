// server/decode_split.h: the CPU takes a sample while at most `slack` wait behind it.
#include "server/decode_split.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace batchcast {
namespace {

// Samples of `queued_chunks` chunks of `batch`, all queued before any is started: how many the
// CPU takes.
int cpu_share(uint32_t slack, uint32_t batch, int queued_chunks) {
  DecodeSplit split(slack);
  for (int c = 0; c < queued_chunks; ++c) split.queued(batch);
  int cpu = 0;
  for (uint32_t s = 0; s < batch * queued_chunks; ++s) cpu += split.take_on_cpu();
  return cpu;
}

TEST(DecodeSplit, AStreamThatKeepsUpIsDecodedOnTheCpu) {
  // The producer queues one chunk at a time (consumer-bound): every sample to the CPU.
  DecodeSplit split(64);
  for (int chunk = 0; chunk < 10; ++chunk) {
    split.queued(64);
    for (int s = 0; s < 64; ++s) EXPECT_TRUE(split.take_on_cpu()) << chunk << "/" << s;
  }
}

TEST(DecodeSplit, ABacklogGoesToTheEngineUntilOnlySlackIsLeft) {
  // Eight chunks queued at once (a start, or the workers falling behind): the first samples go to
  // the engine until no more than `slack` wait, and those last ones to the CPU.
  EXPECT_EQ(cpu_share(64, 64, 8), 65);  // the sample that leaves 64 behind, and those 64
  EXPECT_EQ(cpu_share(0, 64, 1), 1);    // slack 0: only a sample with none behind it
  EXPECT_EQ(cpu_share(128, 64, 1), 64);
}

TEST(DecodeSplit, ASecondChunkQueuedMidwaySendsTheRestOfTheFirstToTheEngine) {
  DecodeSplit split(64);
  split.queued(64);
  for (int s = 0; s < 32; ++s) EXPECT_TRUE(split.take_on_cpu());
  split.queued(64);  // 32 + 64 wait now
  int engine = 0;
  for (int s = 0; s < 96; ++s) engine += !split.take_on_cpu();
  EXPECT_EQ(engine, 31);  // down to 64 waiting behind, then the CPU again
}

TEST(DecodeSplit, ConcurrentWorkersSplitExactlyAsOneThreadWould) {
  DecodeSplit split(100);
  split.queued(1000);
  std::atomic<int> cpu{0};
  std::vector<std::thread> workers;
  for (int w = 0; w < 4; ++w)
    workers.emplace_back([&] {
      for (int s = 0; s < 250; ++s) cpu += split.take_on_cpu();
    });
  for (auto& t : workers) t.join();
  EXPECT_EQ(cpu.load(), 101);
}

}  // namespace
}  // namespace batchcast
