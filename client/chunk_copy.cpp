#include "client/chunk_copy.h"

#include <algorithm>
#include <cstring>

#include "protocol/descriptor_checks.h"

#ifdef BATCHCAST_HAVE_CUDA
#include "client/cuda_assembler.h"
#endif

namespace batchcast {

namespace {

class HostChunkCopy : public ChunkCopy {
 public:
  // Uninitialised: every byte is written by the copy.
  explicit HostChunkCopy(size_t bytes) : bytes_(new uint8_t[std::max<size_t>(bytes, 1)]) {
    data_ = bytes_.get();
  }
  uint8_t* bytes() { return bytes_.get(); }

 private:
  std::unique_ptr<uint8_t[]> bytes_;
};

class HostChunkCopier : public ChunkCopier {
 public:
  explicit HostChunkCopier(const SlotMemory& memory) : memory_(memory) {}

  Copied copy(const protocol::ChunkDescriptor& d) override {
    CopyPlan plan = plan_copy(d);
    auto copy = std::make_shared<HostChunkCopy>(plan.bytes);
    const uint8_t* slot = memory_.slot_data(d.slot);
    for (const auto& run : plan.runs)
      std::memcpy(copy->bytes() + run.to, slot + run.from, run.bytes);
    return {std::move(copy), std::move(plan.desc), {}};
  }

 private:
  const SlotMemory& memory_;  // the session's, which owns this copier
};

}  // namespace

std::unique_ptr<ChunkCopier> ChunkCopier::create(const SlotMemory& memory) {
#ifdef BATCHCAST_HAVE_CUDA
  if (memory.cuda_device() >= 0) return std::make_unique<CudaChunkCopier>(memory);
#endif
  return std::make_unique<HostChunkCopier>(memory);
}

CopyPlan plan_copy(const protocol::ChunkDescriptor& d) {
  CopyPlan plan;
  plan.desc = d;
  if (d.take.empty()) {  // the whole chunk, where it is in its slot
    for (const auto& t : d.tensors)
      plan.bytes = std::max(plan.bytes, t.offset + protocol::tensor_extent_bytes(t).value_or(0));
    plan.runs.push_back({0, 0, plan.bytes});
    return plan;
  }
  const auto& take = d.take;
  for (auto& t : plan.desc.tensors) {
    const uint64_t stride = protocol::row_stride_bytes(t);
    const uint64_t extent = protocol::row_extent_bytes(t);
    const uint64_t at = (plan.bytes + kCopyAlignment - 1) / kCopyAlignment * kCopyAlignment;
    if (extent > 0) {
      for (size_t first = 0, last = 0; first < take.size(); first = last + 1) {
        for (last = first; last + 1 < take.size() && take[last + 1] == take[last] + 1;) ++last;
        plan.runs.push_back({t.offset + take[first] * stride, at + first * stride,
                             (last - first) * stride + extent});
      }
      plan.bytes = at + (take.size() - 1) * stride + extent;
    } else {
      plan.bytes = at;  // rows of no bytes: the offset still lies inside the copy
    }
    t.shape[0] = static_cast<int64_t>(take.size());
    t.offset = at;
  }
  plan.desc.take.clear();
  return plan;
}

}  // namespace batchcast
