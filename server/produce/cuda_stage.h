// CudaStage: the ChunkStage of a GPU pool with CPU decoding (chunk_stage.h). fill() has the
// source decode each sample on the CPU into pinned staging memory, one staging area per slot and
// view laid out like the source's tensors of that view; upload() then, on the stage's own stream,
// copies the chunk to the device with cudaMemcpyAsync, converts image tensors (uint8 HWC ->
// normalised CHW, decoders/gpu_convert.h) straight into the view's slot, copies the other tensors
// as they are, and records the slot's interprocess event in each view's arenas, which consumers
// wait on before they read the slot. A pool on several GPUs is written on the first and the slot
// then copied to the others (ArenaSet).
//
// Views (docs/views.md): view v of the pool has its own ArenaSet (its own GPU memory, the same
// slot count) and its own staging; the source's view v is that view's uint8 HWC pipeline, and
// one fill_views() decode per sample writes every view's staging. The stage learns a view when
// the first lease carrying it reaches begin() (ViewOf says what the view is); a lease carries
// the views that existed when it was acquired, and only those it fills (a private chunk: its
// consumer's view alone) are filled and uploaded.
//
// Staging layout, per view: K pinned areas (cudaHostAlloc) of the source's chunk size for the
// view (uint8 images, so a quarter of a float32 slot), plus one device scratch buffer for the
// uint8 images of one chunk, reused in stream order. begin(lease) waits for the slot's previous
// upload (its events) before the areas are filled again, so a chunk is never overwritten while
// it is being copied.
//
// Thread-safety: fill() from any producer worker; upload() from the producer's one upload thread
// (so the scratch buffers' copy/convert pairs stay in order on the one stream); begin() from one
// thread at a time (the producer's). Views live in a fixed array published by their count, so
// begin() may add one while workers fill others. Ownership: created after the StreamHost (it
// borrows its ArenaSets) and destroyed before it; it borrows the source, which outlives it; the
// destructor waits for the stream to finish. CUDA builds only.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "decoders/gpu_convert.h"
#include "server/produce/chunk_stage.h"
#include "server/produce/slot_layout.h"
#include "server/produce/tensor_conversion.h"
#include "shm/arena_set.h"
#include "shm/cuda_pool.h"

namespace batchcast {

class CudaStage : public ChunkStage {
 public:
  // View v of the pool: the arenas its chunks go to, and per source tensor of view v its
  // conversion (or empty: copy all). Called from begin(), once per view.
  struct View {
    const ArenaSet* arenas = nullptr;
    std::vector<TensorConversion> conversions;
  };
  using ViewOf = std::function<View(uint32_t view)>;

  // Stages `source`'s tensors of each view; view 0 is set up here.
  CudaStage(const SampleSource& source, ViewOf view_of, uint32_t chunk_size);
  ~CudaStage() override;
  CudaStage(const CudaStage&) = delete;
  CudaStage& operator=(const CudaStage&) = delete;

  std::vector<SampleTensor> slot_tensors() const override;  // view 0's
  void begin(const FillLease& lease, uint32_t samples) override;
  void fill(const FillLease& lease, uint32_t position, uint64_t index, uint64_t epoch) override;
  void upload(const FillLease& lease, uint32_t sample_count) override;

 private:
  struct ViewStage {
    const ArenaSet* arenas;
    std::vector<SampleTensor> staged;
    std::vector<TensorConversion> conversions;
    std::vector<SampleTensor> slot_tensors;
    SlotLayout staged_layout;
    SlotLayout slot_layout;
    PinnedBuffer staging;
    std::vector<DeviceBuffer> tables;  // per tensor: conversion table on the device (or empty)
    DeviceBuffer scratch;              // uint8 images of one chunk
  };
  void add_view(uint32_t view);  // from begin() (or the constructor)
  void upload_view(const ViewStage& v, uint8_t* slot, const FillLease& lease,
                   uint32_t sample_count);

  const SampleSource& source_;
  ViewOf view_of_;
  uint32_t chunk_size_;
  int device_;  // the primary GPU of every view's arenas
  CudaStream stream_;
  std::array<std::unique_ptr<ViewStage>, SampleSource::kMaxViews> views_;
  std::atomic<uint32_t> view_count_{0};
};

}  // namespace batchcast
