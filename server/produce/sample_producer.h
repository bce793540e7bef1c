// SampleProducer: drives a StreamHost from a SampleSource. For every epoch of the StreamPlan it
// cuts the order into chunks of chunk_size, acquires a slot per chunk and has W worker threads
// decode each sample straight into its place in the slot (no intermediate batch copy); a chunk
// is published when its last sample is written, and the stream host publishes in stream order.
//
// GPU pools: with a ChunkStage (chunk_stage.h) the workers have the stage prepare each sample
// instead, and a thread of its own has the stage upload each finished chunk into its device
// slot, then publishes it (an upload may wait on the GPU: a worker waiting there would not
// decode).
//
// Regeneration: a chunk's content is a function of (seed, epoch, chunk index) (the plan's order
// comes from (seed, epoch), each sample's augmentation from (seed, epoch, index)), so on a core
// that regenerates, a second thread serves acquire_private() with the same workers, producing
// any chunk again byte for byte for consumers catching up; run() then returns once every
// consumer got End. The same thread fills the chunks relaxed readers need (FillLease::samples:
// the samples chosen for them, each drawn with the chunk's own number for its epoch).
// Bad samples: on_error=raise fails the stream with the file and reason (consumers get the
// error); skip fills the position from the next good sample of the epoch's order and counts it.
// Thread-safety: run() once, from one thread; stop() from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include "server/host/stream_host.h"
#include "server/produce/chunk_stage.h"
#include "server/produce/sample_source.h"
#include "server/produce/slot_layout.h"
#include "server/stream/stream_plan.h"

namespace batchcast {

enum class OnErrorPolicy { kRaise, kSkip };

struct SampleProducerOptions {
  uint32_t chunk_size = 64;  // samples per chunk (slot)
  uint32_t workers = 4;      // decoding threads
  uint64_t epochs = 1;       // 0: until stopped
  uint64_t first_epoch = 0;
  OnErrorPolicy on_error = OnErrorPolicy::kRaise;
  ChunkStage* stage = nullptr;  // GPU pools only; not owned, outlives the producer
};

class SampleProducer {
 public:
  SampleProducer(StreamHost& core, const SampleSource& source, const StreamPlan& plan,
                 SampleProducerOptions options);
  // Produces every epoch, then finish()es the stream host. False if the stream failed or was
  // stopped.
  bool run();
  // Bad samples replaced under on_error=skip (the stage's included).
  uint64_t skipped_samples() const {
    return skipped_.load() + (options_.stage ? options_.stage->skipped() : 0);
  }

 private:
  StreamHost& core_;
  const SampleSource& source_;
  const StreamPlan& plan_;
  SampleProducerOptions options_;
  std::vector<SampleTensor> tensors_;  // as the source writes them
  SlotLayout layout_;
  std::vector<SampleTensor> slot_tensors_;  // as they sit in a slot (differ only with a stage)
  SlotLayout slot_layout_;
  std::atomic<uint64_t> skipped_{0};
  // on_error=skip: a bad sample is logged the first time it is read (the first kMaxReported
  // samples), and counted every time.
  static constexpr size_t kMaxReported = 20;
  bool first_report(uint64_t index);  // true: log it
  std::mutex reported_mu_;
  std::unordered_set<uint64_t> reported_;
};

}  // namespace batchcast
