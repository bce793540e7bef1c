// DecodeSplit: under `--decoder mixed`, which samples the CPU workers decode themselves and which
// they hand to the GPU's JPEG engine (server/produce/nvjpeg_stage.h).
//
// Why: nvJPEG queues a colour-conversion kernel behind every image the hardware engine decodes,
// so the server's context holds the GPU's compute engine, waiting, for as long as the engine works
// on its images; under time-slicing that is time the collocated trainers lose
// (docs/architecture.md). Samples the CPU decodes cost the trainers one copy.
//
// The rule: a worker decodes a sample itself unless a consumer waits for that sample's chunk,
// i.e. the chunk is the stream's head (the oldest one not yet published, which consumers read
// next) and some consumer level with it has taken every chunk it was sent
// (StreamState::waited_chunk). Then the worker only prepares the sample for the engine (reads,
// checks, draws its geometry) and the chunk's upload has nvJPEG decode those samples beside the
// squares the CPU finished. Decided when a worker starts the sample: samples already started stay
// on the CPU, so a chunk the consumers wait for is done after at most one sample per worker plus
// the engine's share, and the engine's finished chunks never wait behind a CPU chunk.
// So the CPU decodes all it keeps up with and the engine only what consumers would otherwise wait
// for, with no clock, no backlog threshold and no tuning: a consumer-bound stream is decoded on the
// CPU; a CPU-starved one has the engine decode the rest of each head chunk while the workers
// decode the next chunk, both at work.
// Not a rule "the engine is idle": the engine is idle whenever the CPU keeps up, which is exactly
// when the engine should stay off. Private chunks (regenerated for a consumer catching up) are
// never the stream's head, so the CPU decodes them. Under relaxed order the chunk waited for is
// the oldest one being filled for relaxed readers while one of them has credit and nothing to take.
//
// Thread-safety: cpu_decodes() and the counters from any thread; `waited` must be callable
// concurrently (StreamHost::waited_chunk is lock-free). Ownership: `waited` must stay callable as
// long as the split is used.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <utility>

namespace batchcast {

class DecodeSplit {
 public:
  // The stream chunk a consumer waits for now, if any (StreamHost::waited_chunk).
  using WaitedChunk = std::function<std::optional<uint64_t>()>;

  explicit DecodeSplit(WaitedChunk waited) : waited_(std::move(waited)) {}

  // A worker starts a sample of chunk `seq`: true if it decodes it, false if the engine does.
  // (A sample retried after a bad file starts, and counts, twice.)
  bool cpu_decodes(uint64_t seq) {
    const bool cpu = waited_() != seq;
    ++(cpu ? cpu_samples_ : engine_samples_);
    return cpu;
  }
  uint64_t cpu_samples() const { return cpu_samples_.load(); }
  uint64_t engine_samples() const { return engine_samples_.load(); }

 private:
  const WaitedChunk waited_;
  std::atomic<uint64_t> cpu_samples_{0}, engine_samples_{0};
};

}  // namespace batchcast
