// SampleProducer: drives a ServerCore from a SampleSource. For every epoch of the StreamPlan it
// cuts the order into chunks of batch_size, acquires a slot per chunk and has W worker threads
// decode each sample straight into its place in the slot (no intermediate batch copy); a chunk
// is published when its last sample is written, and the core publishes in stream order.
//
// GPU pools: with a ChunkStage the workers have the stage prepare each sample instead, and the
// last worker of a chunk has the stage upload it into its device slot before publishing.
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

// Where chunks are decoded when the pool's slots are not host memory (a GPU pool): the stage
// prepares each sample on the workers (fill) and moves the whole chunk into its device slot,
// converted to slot_tensors(), before it is published (upload). Implemented by CudaStage (CPU
// decode into pinned staging; server/cuda_stage.h) and NvjpegStage (GPU decode;
// server/nvjpeg_stage.h).
class ChunkStage {
 public:
  virtual ~ChunkStage() = default;
  // The tensors as they sit in a slot: dtype and per-sample shape.
  virtual std::vector<SampleTensor> slot_tensors() const = 0;
  // Called once per chunk, from the producer thread, before any fill() for `slot`: waits until
  // the previous upload from the slot's host-side memory is done.
  virtual void begin(uint32_t slot) = 0;
  // Prepares sample `index` of `epoch` as sample `position` of the chunk in `slot`. Called from
  // the worker threads, concurrently for different positions. Throws SampleError for a bad sample.
  virtual void fill(uint32_t slot, uint32_t position, uint64_t index, uint64_t epoch) = 0;
  // Queues the chunk's copy (and conversion) into its slot and marks when it is done for the
  // consumers. Thread-safe. Throws Error if the device fails.
  virtual void upload(const FillLease& lease, uint32_t sample_count) = 0;
  // Bad samples the stage itself replaced at upload time (on_error=skip), beyond fill()'s.
  virtual uint64_t skipped() const { return 0; }
};

struct SampleProducerOptions {
  uint32_t batch_size = 64;  // samples per chunk (slot)
  uint32_t workers = 4;      // decoding threads
  uint64_t epochs = 1;       // 0: until stopped
  uint64_t first_epoch = 0;
  OnErrorPolicy on_error = OnErrorPolicy::kRaise;
  ChunkStage* stage = nullptr;  // GPU pools only; not owned, outlives the producer
};

// Where each tensor of a chunk sits inside a slot.
struct SlotLayout {
  std::vector<uint64_t> offsets;  // per tensor, 256-byte aligned
  uint64_t bytes = 0;
  static SlotLayout plan(const std::vector<SampleTensor>& tensors, uint32_t batch_size);
  // Where sample `position` of each of `tensors` goes in a chunk laid out from `base`.
  std::vector<uint8_t*> sample_outs(uint8_t* base, const std::vector<SampleTensor>& tensors,
                                    uint32_t position) const;
  // The descriptor's view of a chunk of `sample_count` samples: C-contiguous, at `offsets`.
  std::vector<protocol::TensorSpec> specs(const std::vector<SampleTensor>& tensors,
                                          uint32_t sample_count) const;
};

class SampleProducer {
 public:
  SampleProducer(ServerCore& core, const SampleSource& source, const StreamPlan& plan,
                 SampleProducerOptions options);
  // Produces every epoch, then finish()es the core. False if the stream failed or was stopped.
  bool run();
  // Bad samples replaced under on_error=skip (the stage's included).
  uint64_t skipped_samples() const {
    return skipped_.load() + (options_.stage ? options_.stage->skipped() : 0);
  }

 private:
  ServerCore& core_;
  const SampleSource& source_;
  const StreamPlan& plan_;
  SampleProducerOptions options_;
  std::vector<SampleTensor> tensors_;  // as the source writes them
  SlotLayout layout_;
  std::vector<SampleTensor> slot_tensors_;  // as they sit in a slot (differ only with a stage)
  SlotLayout slot_layout_;
  std::atomic<uint64_t> skipped_{0};
};

}  // namespace batchcast
