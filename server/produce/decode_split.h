// DecodeSplit: under `--decoder mixed`, which chunks the CPU workers decode themselves and which
// they hand to the GPU's JPEG engine (server/produce/nvjpeg_stage.h), from the two sides'
// measured rates.
//
// Why not always the engine: nvJPEG queues a colour-conversion kernel behind every image the
// hardware engine decodes, so the server's context holds the GPU's compute engine, waiting, for as
// long as the engine works on its images; collocated trainers lose that time
// (docs/architecture.md). A chunk the CPU decodes costs them one copy. Why not a share of each chunk: under time-slicing
// each engine decode waits for turns of the GPU, a cost per chunk, not per image, so a chunk split
// between the sides pays it for a few images and is published only when its slower side is done.
//
// The split by rates: a chunk is decoded whole by one side, chosen when a worker starts its first
// sample that needs decoding (cached images need none). The engine takes it when a consumer waits
// for decoding (StreamHost::waited_chunk: the stream's head waited for, or a relaxed reader with
// credit and nothing to take) and the engine holds fewer chunks than its depth; otherwise the
// workers decode it. The depth is how many chunks the engine decodes while the workers decode
// one, plus the one being prepared: 1 + ceil(cpu_s / (workers * engine_s)) from the measured
// seconds per sample of a worker (cpu_s) and of the engine's uploads (engine_s), at most the
// ring's slots; 1 until both are measured. So a consumer-bound stream is decoded on the CPU
// alone; a CPU-starved one keeps both sides busy, each in proportion to its rate: an engine 4x
// faster than the workers together holds 5 chunks and takes 4 of every 5, a slower one 2 (one
// decoding, one prepared) beside the workers' one; an engine beyond the ring's depth takes every
// chunk. The workers are never idle behind an engine chunk: its samples are only read, checked
// and given their geometry.
//
// The split by rates assumes the sides do not slow each other. They can: a worker busy with a CPU
// chunk is not preparing the engine's next one (reading its files, drawing its geometry), and on
// few cores the busy workers take the time the engine's upload thread needs, so that the CPU's
// share can cost more than it brings. So a RuleTrial (server/produce/rule_trial.h) weighs the
// split by rates against every chunk on the engine (`--decoder nvjpeg`), waited for or not, by
// the samples the stream's consumers are sent under each while they wait for data, and follows
// the better one for a while.
//
// Thread-safety: every member from any thread (one mutex; a few calls per sample). The Stream's
// functions must be callable concurrently (StreamHost's are lock-free) for as long as the split
// is used.
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "server/produce/rule_trial.h"

namespace batchcast {

class DecodeSplit {
 public:
  // What the split reads of the stream it decodes for.
  struct Stream {
    // The stream chunk a consumer waits for now, if any (StreamHost::waited_chunk).
    std::function<std::optional<uint64_t>()> waited;
    // Samples sent to consumers so far (StreamHost::samples_sent).
    std::function<uint64_t()> samples_sent;
    std::function<double()> now;  // seconds, monotonic
  };

  // `slots`: the ring's (a chunk per slot); `workers`: the producer's decoding threads.
  DecodeSplit(Stream stream, uint32_t slots, uint32_t workers,
              RuleTrial::Timing trial = RuleTrial::Timing{});

  // A new chunk in `slot`: neither side's yet.
  void begin(uint32_t slot);
  // A worker starts a sample of the chunk in `slot` that needs decoding: true if it decodes it,
  // false if the engine does (the chunk's first such sample chooses for the whole chunk).
  // A sample retried after a bad file starts, and counts, twice.
  bool cpu_decodes(uint32_t slot);
  // A worker decoded one sample in `seconds`.
  void cpu_sample_done(double seconds);
  // The engine's chunk in `slot` went up: `samples` decoded on the engine in `seconds` of its
  // upload. Ignored for a CPU chunk.
  void uploaded(uint32_t slot, uint32_t samples, double seconds);

  uint32_t engine_depth() const;  // chunks the engine may hold in the split by rates
  // The split by rates followed at the last choice (not every chunk on the engine).
  bool by_rates() const;
  // "N samples decoded on the CPU, M on the GPU's JPEG decoder (...)": the counts, both sides'
  // rates, the depth and the trial's rates and choice, for the server's last lines.
  std::string describe() const;
  uint64_t cpu_samples() const;
  uint64_t engine_samples() const;

 private:
  enum class Side : uint8_t { kUnchosen, kCpu, kEngine };
  uint32_t depth_by_rates_locked() const;

  const Stream stream_;
  const uint32_t workers_;
  mutable std::mutex mu_;
  std::vector<Side> side_;       // per slot
  uint32_t engine_chunks_ = 0;   // chosen for the engine, not yet uploaded
  uint64_t cpu_samples_ = 0, engine_samples_ = 0;
  std::optional<double> cpu_s_, engine_s_;  // moving averages
  RuleTrial trial_;  // kDefault: the split by rates; kAlternative: every chunk on the engine
  RuleTrial::Rule rule_ = RuleTrial::Rule::kDefault;  // followed at the last choice
};

}  // namespace batchcast
