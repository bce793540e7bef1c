// Batch publishing for producers that already hold whole batches in host memory (the Python
// Producer, which shares any iterable of tensors): copies a list of host tensors into one
// acquired slot, laid out with the native producer's rules (SlotLayout: each tensor's rows
// contiguous, offsets 256-byte aligned), and publishes the chunk.
//
// Dimension 0 of every tensor is the sample dimension; the tensors of one batch must agree on
// it. Tensors are described DLTensor-style (dtype, shape, element strides, data pointer) so no
// framework is linked here; the caller keeps their memory alive and unchanged for the call.
//
// Thread-safety: the functions are stateless; publish_chunk() may run concurrently from
// several threads (the StreamHost is thread-safe), each with its own tensors. It blocks in
// StreamHost::acquire() until a slot is free.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "server/host/stream_host.h"
#include "server/produce/slot_layout.h"

namespace batchcast {

// One host tensor of a batch: a borrowed view, C-contiguous (strides empty, or equal to the
// contiguous strides of `shape`; make a strided tensor contiguous before publishing it).
struct HostTensor {
  std::string name;
  DType dtype = DType::kUInt8;
  std::vector<int64_t> shape;    // shape[0]: samples in the batch
  std::vector<int64_t> strides;  // elements; empty = C-contiguous
  const void* data = nullptr;
};

// The slot layout of a batch. Throws Error naming the tensor when the batch is malformed
// (no tensors, too many, a scalar, disagreeing sample counts, duplicate or empty names,
// non-contiguous strides).
SlotLayout plan_batch(const std::vector<HostTensor>& tensors);

// Acquires a slot, copies the batch into it and publishes it at `position` (its sample_count is
// taken from the tensors; epoch_samples 0: the server's current value is announced). Returns false
// (nothing published) once the stream host was stopped or failed. Throws Error, before acquiring,
// when the batch is malformed or larger than the stream host's slots.
bool publish_chunk(StreamHost& core, const std::vector<HostTensor>& tensors,
                   protocol::ChunkPosition position);
// The same into a slot already leased (StreamHost::acquire_private()): a private chunk.
// Throws Error, before writing, when the batch is malformed or larger than the slot.
void publish_chunk_into(StreamHost& core, const FillLease& lease,
                        const std::vector<HostTensor>& tensors, protocol::ChunkPosition position);

}  // namespace batchcast
