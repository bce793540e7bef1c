#include "server/produce/tensor_conversion.h"

#include "common/error.h"

namespace batchcast {

std::vector<SampleTensor> converted(const std::vector<SampleTensor>& staged,
                                    const std::vector<TensorConversion>& conversions) {
  std::vector<SampleTensor> out = staged;
  for (size_t t = 0; t < conversions.size() && t < out.size(); ++t) {
    const auto& c = conversions[t];
    if (!c.normalize) continue;
    const auto& s = staged[t];
    if (s.dtype != DType::kUInt8 || s.shape.size() != 3 || s.shape[2] != 3)
      throw Error("tensor '" + s.name +
                  "' cannot be normalised on the GPU: it is not uint8 HWC RGB");
    const DType to = *c.normalize;
    if (to != DType::kFloat32 && to != DType::kFloat16 && to != DType::kBFloat16)
      throw Error("tensor '" + s.name + "' cannot be normalised to " + dtype_name(to) +
                  " on the GPU; use float32, float16 or bfloat16 (uint8 is copied as it is)");
    out[t].shape = {3, s.shape[0], s.shape[1]};
    out[t].dtype = to;
  }
  return out;
}

}  // namespace batchcast
