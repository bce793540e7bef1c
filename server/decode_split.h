// DecodeSplit: under `--decoder mixed`, which samples the CPU workers decode themselves and which
// they hand to the GPU's JPEG engine (server/nvjpeg_stage.h).
//
// Why: nvJPEG queues a colour-conversion kernel behind every image the hardware engine decodes,
// so the server's context holds the GPU's compute engine, waiting, for as long as the engine works
// on its images; under time-slicing that is time the collocated trainers lose (bench/RESULTS.md,
// "where the last 9 % goes"). Samples the CPU decodes cost the trainers nothing but one copy.
//
// The rule: a worker decodes its sample on the CPU while at most `slack` samples wait behind it
// for the workers; beyond that the stream is falling behind its consumers (the producer only
// queues a chunk when a slot is free), and the sample goes to the engine, its worker only reading
// the file. So the CPU does all it can keep up with and the engine the rest, with no clock and no
// tuning: a consumer-bound stream ends up decoded on the CPU, a CPU-starved one on the engine.
//
// Thread-safety: every call may come from any thread (one atomic counter). Value semantics are
// not needed: the stage owns one.
#pragma once

#include <atomic>
#include <cstdint>

namespace batchcast {

class DecodeSplit {
 public:
  explicit DecodeSplit(uint32_t slack) : slack_(slack) {}

  // A chunk of `samples` samples was queued for the workers.
  void queued(uint32_t samples) { waiting_ += samples; }
  // A worker starts a sample: true if it decodes it on the CPU, false if the engine does.
  // (A sample retried after a bad file counts twice; that only lowers the backlog seen by one.)
  bool take_on_cpu() { return --waiting_ <= static_cast<int64_t>(slack_); }

 private:
  const uint32_t slack_;
  std::atomic<int64_t> waiting_{0};
};

}  // namespace batchcast
