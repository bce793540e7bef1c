#include "server/produce/slot_layout.h"

namespace batchcast {
namespace {

constexpr uint64_t kTensorAlignment = 256;

}  // namespace

SlotLayout SlotLayout::plan(const std::vector<SampleTensor>& tensors, uint32_t chunk_size) {
  SlotLayout layout;
  for (const auto& t : tensors) {
    layout.bytes = (layout.bytes + kTensorAlignment - 1) / kTensorAlignment * kTensorAlignment;
    layout.offsets.push_back(layout.bytes);
    layout.bytes += t.bytes() * chunk_size;
  }
  return layout;
}

std::vector<uint8_t*> SlotLayout::sample_outs(uint8_t* base,
                                              const std::vector<SampleTensor>& tensors,
                                              uint32_t position) const {
  std::vector<uint8_t*> outs(tensors.size());
  for (size_t t = 0; t < tensors.size(); ++t)
    outs[t] = base + offsets[t] + position * tensors[t].bytes();
  return outs;
}

std::vector<protocol::TensorSpec> SlotLayout::specs(const std::vector<SampleTensor>& tensors,
                                                    uint32_t sample_count) const {
  std::vector<protocol::TensorSpec> specs;
  for (size_t t = 0; t < tensors.size(); ++t) {
    protocol::TensorSpec spec;
    spec.name = tensors[t].name;
    spec.dtype = tensors[t].dtype;
    spec.shape.push_back(sample_count);
    spec.shape.insert(spec.shape.end(), tensors[t].shape.begin(), tensors[t].shape.end());
    spec.strides.assign(spec.shape.size(), 1);
    for (size_t i = spec.shape.size() - 1; i-- > 0;)
      spec.strides[i] = spec.strides[i + 1] * spec.shape[i + 1];
    spec.offset = offsets[t];
    specs.push_back(std::move(spec));
  }
  return specs;
}

}  // namespace batchcast
