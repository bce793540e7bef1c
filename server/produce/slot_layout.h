// SlotLayout: where each tensor of a chunk sits inside a slot of the batch pool. One layout rule
// for every producer (the native SampleProducer, the GPU chunk stages, batch_publisher.h's
// host batches and, through the `chunk_bytes` binding, the Python Producer): each tensor's
// samples are contiguous, one after another, and every tensor starts at a 256-byte aligned
// offset (the alignment CUDA and vector loads want for a tensor's base).
//
// Contract: a plain value computed by a pure function (plan); thread-safe to read from any
// number of threads. It holds no pointer: sample_outs() and specs() borrow their arguments for
// the call only.
#pragma once

#include <cstdint>
#include <vector>

#include "protocol/messages.h"
#include "server/produce/sample_source.h"

namespace batchcast {

struct SlotLayout {
  std::vector<uint64_t> offsets;  // per tensor, 256-byte aligned
  uint64_t bytes = 0;             // the slot bytes a chunk of this layout needs
  // The layout of chunks of `chunk_size` samples of `tensors`.
  static SlotLayout plan(const std::vector<SampleTensor>& tensors, uint32_t chunk_size);
  // Where sample `position` of each of `tensors` goes in a chunk laid out from `base`.
  std::vector<uint8_t*> sample_outs(uint8_t* base, const std::vector<SampleTensor>& tensors,
                                    uint32_t position) const;
  // The descriptor's view of a chunk of `sample_count` samples: C-contiguous, at `offsets`.
  std::vector<protocol::TensorSpec> specs(const std::vector<SampleTensor>& tensors,
                                          uint32_t sample_count) const;
};

}  // namespace batchcast
