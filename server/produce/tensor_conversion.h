// TensorConversion: what a GPU pool with CPU decoding does to one source tensor between its
// staging and the slot (cuda_stage.h carries it out): a uint8 HWC image normalised into CHW
// floats on the GPU, or a copy. converted() is the shape rule, so that a pool's slot size is known
// in every build, with CUDA or without.
//
// Contract: plain values and a pure function; thread-safe.
#pragma once

#include <array>
#include <optional>
#include <vector>

#include "common/dtype.h"
#include "server/produce/sample_source.h"

namespace batchcast {

struct TensorConversion {
  // Set: the tensor is uint8 {H, W, 3} in staging and becomes normalised {3, H, W} of this type
  // (kFloat32/kFloat16/kBFloat16) in the slot. Empty: copied unchanged.
  std::optional<DType> normalize;
  std::array<float, 3> mean{0.485f, 0.456f, 0.406f};
  std::array<float, 3> std{0.229f, 0.224f, 0.225f};
};

// The slot tensors `staged` tensors become under `conversions` (one per tensor, or fewer: the rest
// copied). Throws Error naming the tensor when a conversion does not apply to it.
std::vector<SampleTensor> converted(const std::vector<SampleTensor>& staged,
                                    const std::vector<TensorConversion>& conversions);

}  // namespace batchcast
