// ChunkStage: where chunks are decoded when the pool's slots are not host memory (a GPU pool).
// The SampleProducer (sample_producer.h) drives it: the stage prepares each sample on the
// producer's workers (fill) and moves the whole chunk into its device slot, converted to
// slot_tensors(), before it is published (upload). Implemented by CudaStage (CPU decode into
// pinned staging; server/produce/cuda_stage.h) and NvjpegStage (GPU decode;
// server/produce/nvjpeg_stage.h).
//
// Thread-safety: as documented per call below (fill runs on the worker threads, upload on the
// producer's upload thread, begin on the producer thread). Ownership: the producer borrows the
// stage; the stage outlives it.
#pragma once

#include <cstdint>
#include <vector>

#include "server/host/stream_host.h"
#include "server/produce/sample_source.h"

namespace batchcast {

class ChunkStage {
 public:
  virtual ~ChunkStage() = default;
  // The tensors as they sit in a slot: dtype and per-sample shape.
  virtual std::vector<SampleTensor> slot_tensors() const = 0;
  // Called once per chunk of `samples` samples, from one thread at a time, before any fill() for
  // the lease's slot: waits until the previous upload from the slot's host-side memory is done.
  virtual void begin(const FillLease& lease, uint32_t samples) = 0;
  // Prepares sample `index` of `epoch` as sample `position` of the lease's chunk (in the slot of
  // every view the lease fills: a null FillLease::views entry is skipped). Called from the worker
  // threads, concurrently for different positions. Throws SampleError for a bad sample.
  virtual void fill(const FillLease& lease, uint32_t position, uint64_t index, uint64_t epoch) = 0;
  // Queues the chunk's copy (and conversion) into its slot and marks when it is done for the
  // consumers. Called from one thread, chunks in the order their last sample was filled; may
  // block on the device. Throws Error if the device fails.
  virtual void upload(const FillLease& lease, uint32_t sample_count) = 0;
  // Bad samples the stage itself replaced at upload time (on_error=skip), beyond fill()'s.
  virtual uint64_t skipped() const { return 0; }
};

}  // namespace batchcast
