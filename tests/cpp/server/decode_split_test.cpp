// server/produce/decode_split.h: a chunk goes to the CPU while at most `slack` samples wait ahead
// of it.
#include "server/produce/decode_split.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace batchcast {
namespace {

TEST(DecodeSplit, AStreamThatKeepsUpIsDecodedOnTheCpu) {
  // The producer queues a chunk when a slot frees and the workers finish it before the next:
  // every chunk to the CPU, whatever the slack.
  DecodeSplit split(0);
  for (int chunk = 0; chunk < 10; ++chunk) {
    EXPECT_TRUE(split.queue(64)) << chunk;
    for (int s = 0; s < 64; ++s) split.started();
  }
}

TEST(DecodeSplit, ChunksQueuedBeyondTheSlackGoToTheEngine) {
  // Eight chunks queued at once (a start, or consumers freeing slots faster than the CPU refills
  // them): those with at most two chunks' samples ahead of them go to the CPU.
  DecodeSplit split(128);
  int cpu = 0;
  for (int chunk = 0; chunk < 8; ++chunk) cpu += split.queue(64);
  EXPECT_EQ(cpu, 3);  // 0, 64 and 128 samples ahead
}

TEST(DecodeSplit, EngineChunksDoNotCountInTheBacklog) {
  // The engine's chunks wait in the workers' queue too, for a file read each: counted, one engine
  // chunk would push every later chunk to the engine.
  DecodeSplit split(64);
  EXPECT_TRUE(split.queue(64));
  EXPECT_TRUE(split.queue(64));
  EXPECT_FALSE(split.queue(64));  // 128 CPU samples ahead
  EXPECT_FALSE(split.queue(64));
  for (int s = 0; s < 64; ++s) split.started();  // the first CPU chunk; engine chunks never start
  EXPECT_TRUE(split.queue(64));  // 64 CPU samples ahead, whatever the engine's chunks
}

TEST(DecodeSplit, TheCpuTakesChunksAgainOnceTheBacklogIsWorkedOff) {
  DecodeSplit split(64);
  EXPECT_TRUE(split.queue(64));
  EXPECT_TRUE(split.queue(64));
  EXPECT_FALSE(split.queue(64));  // 128 ahead
  for (int s = 0; s < 50; ++s) split.started();
  EXPECT_FALSE(split.queue(64));  // 78 ahead
  for (int s = 0; s < 50; ++s) split.started();
  EXPECT_TRUE(split.queue(64));  // 28 ahead
}

TEST(DecodeSplit, ConcurrentWorkersCountEverySample) {
  DecodeSplit split(0);
  EXPECT_TRUE(split.queue(1000));
  std::vector<std::thread> workers;
  for (int w = 0; w < 4; ++w)
    workers.emplace_back([&] {
      for (int s = 0; s < 250; ++s) split.started();
    });
  for (auto& t : workers) t.join();
  EXPECT_TRUE(split.queue(1));  // nothing waits any more
  EXPECT_FALSE(split.queue(1));
}

}  // namespace
}  // namespace batchcast
