// SyntheticSource: a dataset of `size` samples whose bytes are a pure function of the sample
// index, so tests can tell exactly which sample landed where. Tensors: "0" = uint8 payload of
// sample_bytes (byte j of sample i = synthetic_byte(i, j)), "1" = int64 label = the index.
// Thread-safe (stateless).
#pragma once

#include "server/produce/sample_source.h"

namespace batchcast {

inline uint8_t synthetic_byte(uint64_t index, uint64_t j) {
  return static_cast<uint8_t>((index * 2654435761u + j * 40503u + (index >> 8)) >> 3);
}

class SyntheticSource : public SampleSource {
 public:
  SyntheticSource(uint64_t size, uint64_t sample_bytes)
      : size_(size), sample_bytes_(sample_bytes) {}
  uint64_t size() const override { return size_; }
  std::vector<SampleTensor> tensors() const override {
    return {{tuple_tensor_name(0), DType::kUInt8, {static_cast<int64_t>(sample_bytes_)}},
            {tuple_tensor_name(1), DType::kInt64, {}}};
  }
  void fill(uint64_t index, uint64_t, const std::vector<uint8_t*>& outs) const override {
    for (uint64_t j = 0; j < sample_bytes_; ++j) outs[0][j] = synthetic_byte(index, j);
    auto label = static_cast<int64_t>(index);
    __builtin_memcpy(outs[1], &label, sizeof(label));
  }

 private:
  uint64_t size_;
  uint64_t sample_bytes_;
};

}  // namespace batchcast
