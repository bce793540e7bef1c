#include "client/assembler.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "client/host_assembler.h"
#include "common/error.h"
#ifdef BATCHCAST_HAVE_CUDA
#include "client/cuda_assembler.h"
#endif

namespace batchcast {

std::unique_ptr<Assembler> Assembler::create(const std::shared_ptr<Session>& session,
                                             uint32_t batch_size, int cuda_device) {
  const SlotMemory& memory = session->memory();
#ifdef BATCHCAST_HAVE_CUDA
  if (memory.cuda_device() >= 0) return std::make_unique<CudaAssembler>(*session);
  if (memory.host_pinned()) return std::make_unique<PinnedHostAssembler>(batch_size, cuda_device);
#else
  (void)cuda_device;
#endif
  if (!memory.pin_failure().empty())
    spdlog::warn(
        "pin_memory: the pool of {} stays pageable ({}); copies of its batches to the GPU are "
        "staged through pinned buffers",
        session->endpoint(), memory.pin_failure());
  return std::make_unique<HostAssembler>(batch_size);
}

std::vector<TensorView> views_in_place(const Piece& p) {
  std::vector<TensorView> out;
  for (const auto& t : p.chunk->desc.tensors) {
    TensorView v{t.name, t.dtype, t.shape, t.strides, nullptr};
    v.shape[0] = p.count;
    v.data = const_cast<uint8_t*>(p.chunk->base + t.offset +
                                  p.start * t.strides[0] * dtype_size(t.dtype));
    out.push_back(std::move(v));
  }
  return out;
}

TensorView contiguous_view(const protocol::TensorSpec& t, uint32_t rows) {
  TensorView v{t.name, t.dtype, t.shape, {}, nullptr};
  v.shape[0] = rows;
  v.strides.assign(v.shape.size(), 1);
  for (size_t i = v.shape.size() - 1; i-- > 0;) v.strides[i] = v.strides[i + 1] * v.shape[i + 1];
  return v;
}

void check_stackable(const protocol::ChunkDescriptor& first, const protocol::ChunkDescriptor& other,
                     bool contiguous) {
  auto chunks = "chunks " + std::to_string(first.seq) + " and " + std::to_string(other.seq);
  const char* fix = "; use the producer's batch size to avoid mixing them";
  if (other.tensors.size() != first.tensors.size())
    throw Error(chunks + " disagree on their tensors" + fix);
  for (size_t ti = 0; ti < first.tensors.size(); ++ti) {
    const auto& t = first.tensors[ti];
    const auto& o = other.tensors[ti];
    bool same = o.dtype == t.dtype && o.shape.size() == t.shape.size() &&
                std::equal(o.shape.begin() + 1, o.shape.end(), t.shape.begin() + 1);
    if (same && contiguous) same = o.strides == contiguous_view(t, 1).strides;
    if (!same)
      throw Error(chunks + " disagree on tensor '" + t.name + "' (" +
                  (contiguous ? "shape, dtype or layout" : "shape or dtype") + ")" + fix);
  }
}

}  // namespace batchcast
