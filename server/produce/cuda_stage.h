// CudaStage: the ChunkStage of a GPU pool with CPU decoding (chunk_stage.h). fill() has the
// source decode each sample on the CPU into pinned staging memory, one staging area per slot laid
// out like the source's tensors; upload() then, on the stage's own stream, copies the chunk to the
// device with cudaMemcpyAsync, converts image tensors (uint8 HWC -> normalised CHW,
// decoders/gpu_convert.h) straight into the slot, copies the other tensors as they are, and records
// the slot's interprocess event, which consumers wait on before they read the slot. A pool on
// several GPUs is written on the first and the slot then copied to the others (ArenaSet).
//
// Staging layout: K pinned areas (cudaHostAlloc) of the source's chunk size (uint8 images, so a
// quarter of a float32 slot), plus one device scratch buffer for the uint8 images of one chunk,
// reused in stream order. begin(slot) waits for the slot's previous upload (its event) before the
// area is filled again, so a chunk is never overwritten while it is being copied.
//
// Thread-safety: fill() from any producer worker; upload() from the producer's one upload thread
// (so the scratch buffer's copy/convert pairs stay in order on the one stream); begin() from the
// producer thread. Ownership: created after the StreamHost (it borrows its ArenaSet)
// and destroyed before it; it borrows the source, which outlives it; the destructor waits for the
// stream to finish. CUDA builds only.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <vector>

#include "decoders/gpu_convert.h"
#include "server/produce/chunk_stage.h"
#include "server/produce/slot_layout.h"
#include "shm/arena_set.h"
#include "shm/cuda_pool.h"

namespace batchcast {

// What happens to one source tensor on its way into the slot.
struct TensorConversion {
  // Set: the tensor is uint8 {H, W, 3} in staging and becomes normalised {3, H, W} of this type
  // (kFloat32/kFloat16/kBFloat16) in the slot. Empty: copied unchanged.
  std::optional<DType> normalize;
  std::array<float, 3> mean{0.485f, 0.456f, 0.406f};
  std::array<float, 3> std{0.229f, 0.224f, 0.225f};
};

class CudaStage : public ChunkStage {
 public:
  // Stages `source`'s tensors; `conversions`: one per tensor (or empty: copy all).
  CudaStage(const ArenaSet& arenas, const SampleSource& source,
            std::vector<TensorConversion> conversions, uint32_t chunk_size);
  ~CudaStage() override;
  CudaStage(const CudaStage&) = delete;
  CudaStage& operator=(const CudaStage&) = delete;

  std::vector<SampleTensor> slot_tensors() const override;
  void begin(uint32_t slot, uint32_t samples) override;
  void fill(uint32_t slot, uint32_t position, uint64_t index, uint64_t epoch) override;
  void upload(const FillLease& lease, uint32_t sample_count) override;

  // The slot tensors a source's tensors become under `conversions`.
  static std::vector<SampleTensor> converted(const std::vector<SampleTensor>& staged,
                                             const std::vector<TensorConversion>& conversions);

 private:
  const ArenaSet& arenas_;
  const DeviceArena& arena_;  // the primary: chunks are written there
  const SampleSource& source_;
  std::vector<SampleTensor> staged_;
  std::vector<TensorConversion> conversions_;
  std::vector<SampleTensor> slot_tensors_;
  SlotLayout staged_layout_;
  SlotLayout slot_layout_;
  uint32_t chunk_size_;
  PinnedBuffer staging_;
  CudaStream stream_;
  std::vector<DeviceBuffer> tables_;  // per tensor: conversion table on the device (or empty)
  DeviceBuffer scratch_;              // uint8 images of one chunk
};

}  // namespace batchcast
