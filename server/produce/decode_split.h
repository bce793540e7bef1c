// DecodeSplit: under `--decoder mixed`, which chunks the CPU workers decode themselves and which
// they hand to the GPU's JPEG engine (server/produce/nvjpeg_stage.h).
//
// Why: nvJPEG queues a colour-conversion kernel behind every image the hardware engine decodes,
// so the server's context holds the GPU's compute engine, waiting, for as long as the engine works
// on its images; under time-slicing that is time the collocated trainers lose
// (docs/architecture.md). Chunks the CPU decodes cost the trainers one copy.
//
// The rule: a chunk goes to the CPU workers when at most `slack` samples of CPU-decoded chunks
// wait ahead of it for the workers, else to the engine. The producer queues a chunk whenever a
// slot is free, so a backlog means the consumers freed slots faster than the CPU refills them.
// The CPU thus decodes all it keeps up with and the engine the rest, with no clock and no tuning:
// a consumer-bound stream ends up decoded on the CPU, a CPU-starved one partly on the engine.
// Only CPU chunks count in the backlog: an engine chunk costs the workers a file read and a header
// check, not a decode, and counting it would make one engine chunk send the next ones to the
// engine too.
// Whole chunks, not samples: the engine then always gets full batches, and nvJPEG never re-plans
// for a new batch size.
// Known limit (docs/architecture.md): when the consumers need several times what the CPU decodes
// (1-2 trainers on 2 cores), the CPU chunks in flight stall the in-order stream until the
// engine's chunks behind them fill the ring; the docs send such setups to --decoder nvjpeg.
//
// Thread-safety: queue() from one thread (the producer); started() from any thread.
#pragma once

#include <atomic>
#include <cstdint>

namespace batchcast {

class DecodeSplit {
 public:
  explicit DecodeSplit(uint64_t slack) : slack_(static_cast<int64_t>(slack)) {}

  // A chunk of `samples` samples is queued for the workers: true if the CPU decodes it, false if
  // the engine does.
  bool queue(uint32_t samples) {
    if (waiting_.load() > slack_) return false;
    waiting_ += samples;
    return true;
  }
  // A worker started one sample of a chunk queue() gave the CPU. (A sample retried after a bad
  // file starts twice; that only makes the backlog look one sample shorter.)
  void started() { --waiting_; }

 private:
  const int64_t slack_;
  std::atomic<int64_t> waiting_{0};
};

}  // namespace batchcast
