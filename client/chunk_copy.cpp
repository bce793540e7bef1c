#include "client/chunk_copy.h"

#include <algorithm>
#include <cstring>

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
    const size_t bytes = chunk_bytes(d);
    auto copy = std::make_shared<HostChunkCopy>(bytes);
    std::memcpy(copy->bytes(), memory_.slot_data(d.slot), bytes);
    return {std::move(copy), {}};
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

uint64_t chunk_bytes(const protocol::ChunkDescriptor& d) {
  uint64_t end = 0;
  for (const auto& t : d.tensors)
    end = std::max(end, t.offset + protocol::tensor_extent_bytes(t).value_or(0));
  return end;
}

}  // namespace batchcast
