// SampleProducer: drives a ServerCore from a SampleSource. For every epoch of the StreamPlan it
// cuts the order into chunks of batch_size, acquires a slot per chunk and has W worker threads
// decode each sample straight into its place in the slot (no intermediate batch copy); a chunk
// is published when its last sample is written, and the core publishes in stream order.
//
// Bad samples: on_error=raise fails the stream with the file and reason (consumers get the
// error); skip fills the position from the next good sample of the epoch's order and counts it.
// Thread-safety: run() once, from one thread; stop() from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "server/sample_source.h"
#include "server/server_core.h"
#include "server/stream_plan.h"

namespace batchcast {

enum class OnErrorPolicy { kRaise, kSkip };

struct SampleProducerOptions {
  uint32_t batch_size = 64;   // samples per chunk (slot)
  uint32_t workers = 4;       // decoding threads
  uint64_t epochs = 1;        // 0: until stopped
  uint64_t first_epoch = 0;
  OnErrorPolicy on_error = OnErrorPolicy::kRaise;
};

// Where each tensor of a chunk sits inside a slot.
struct SlotLayout {
  std::vector<uint64_t> offsets;  // per tensor, 256-byte aligned
  uint64_t bytes = 0;
  static SlotLayout plan(const std::vector<SampleTensor>& tensors, uint32_t batch_size);
};

class SampleProducer {
 public:
  SampleProducer(ServerCore& core, const SampleSource& source, const StreamPlan& plan,
                 SampleProducerOptions options);
  // Produces every epoch, then finish()es the core. False if the stream failed or was stopped.
  bool run();
  uint64_t skipped_samples() const { return skipped_.load(); }

 private:
  ServerCore& core_;
  const SampleSource& source_;
  const StreamPlan& plan_;
  SampleProducerOptions options_;
  std::vector<SampleTensor> tensors_;
  SlotLayout layout_;
  std::atomic<uint64_t> skipped_{0};
};

}  // namespace batchcast
