#include "client/cuda_assembler.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <optional>

#include "common/cuda_check.h"
#include "common/error.h"

namespace batchcast {

namespace {

// A release fence that passes once device work recorded on an event has completed.
class EventFence : public ReleaseFence {
 public:
  EventFence(int device, CudaEvent event) : device_(device), event_(std::move(event)) {}
  // Called on the session's I/O thread, which is left on the fence's device: restoring the
  // thread's previous device would create a context on cuda:0 there.
  bool passed() noexcept override {
    (void)cudaSetDevice(device_);
    cudaError_t st = cudaEventQuery(event_.get());
    if (st == cudaErrorNotReady) return false;
    if (st != cudaSuccess) (void)cudaGetLastError();  // a failed context: release anyway
    return true;
  }
  cudaEvent_t get() const { return event_.get(); }

 private:
  int device_;
  CudaEvent event_;
};

// Records an event on `stream` (on the current device) as a fence.
std::shared_ptr<EventFence> record_fence(int device, cudaStream_t stream, const char* what) {
  auto fence = std::make_shared<EventFence>(device, CudaEvent::create(/*interprocess=*/false));
  cuda_check(cudaEventRecord(fence->get(), stream), what);
  return fence;
}

class CudaBatchState : public BatchDeviceState {
 public:
  CudaBatchState(int device, std::shared_ptr<CudaStream> copy_stream)
      : device_(device), copy_stream_(std::move(copy_stream)) {}

  void use_on_stream(uintptr_t stream) override {
    CudaDeviceGuard guard(device_);
    auto s = reinterpret_cast<cudaStream_t>(stream);
    for (cudaEvent_t e : ready)
      cuda_check(cudaStreamWaitEvent(s, e, 0),
                 "making stream " + std::to_string(stream) + " wait for the server's batch");
    stream_ = stream;
  }

  void on_destroy(const std::vector<std::shared_ptr<ChunkRef>>& chunks) noexcept override {
    try {
      CudaDeviceGuard guard(device_);
      if (stream_ && !chunks.empty()) {
        auto done = record_fence(device_, reinterpret_cast<cudaStream_t>(*stream_),
                                 "recording a batch's release event");
        for (const auto& c : chunks) c->add_fence(done);
      }
      // Never used on a stream: the only device work on it is our own copy.
      for (void* p : owned)
        (void)cudaFreeAsync(
            p, stream_ ? reinterpret_cast<cudaStream_t>(*stream_) : copy_stream_->get());
    } catch (const std::exception& e) {
      spdlog::warn("releasing a CUDA batch: {}", e.what());
    }
  }

  std::vector<cudaEvent_t> ready;         // wait on these before reading
  std::shared_ptr<EventFence> copy_done;  // copied batches: their ready event
  std::vector<void*> owned;               // copied batches: cudaMallocAsync'd buffers

 private:
  int device_;
  // Frees the copies of batches never used on a stream; null for pinned host views (no copies).
  std::shared_ptr<CudaStream> copy_stream_;
  std::optional<uintptr_t> stream_;  // the user's stream (use_on_stream)
};

// A private chunk's copy in device memory (allocated on `stream`), ready once `done` has passed.
class CudaChunkCopy : public ChunkCopy {
 public:
  CudaChunkCopy(int device, std::shared_ptr<CudaStream> stream, void* buffer)
      : device_(device), stream_(std::move(stream)) {
    data_ = static_cast<const uint8_t*>(buffer);
  }
  ~CudaChunkCopy() override {
    try {
      CudaDeviceGuard guard(device_);
      // Its readers are done (their fences passed), and the copy is ordered before on stream_.
      (void)cudaFreeAsync(const_cast<uint8_t*>(data_), stream_->get());
    } catch (const std::exception& e) {
      spdlog::warn("freeing a private chunk's copy: {}", e.what());
    }
  }
  cudaEvent_t ready() const { return done->get(); }

  std::shared_ptr<EventFence> done;  // recorded after the copy

 private:
  int device_;
  std::shared_ptr<CudaStream> stream_;
};

}  // namespace

// The event to wait on before reading a chunk's rows: the server's slot event, or our copy's.
cudaEvent_t CudaAssembler::ready_event(const ChunkRef& chunk) const {
  if (chunk.copy) return static_cast<const CudaChunkCopy&>(*chunk.copy).ready();
  return memory_.slot_event(chunk.desc.slot);
}

CudaChunkCopier::CudaChunkCopier(const SlotMemory& memory)
    : memory_(memory), device_(memory.cuda_device()) {
  CudaDeviceGuard guard(device_);
  stream_ = std::make_shared<CudaStream>(CudaStream::create());
}

ChunkCopier::Copied CudaChunkCopier::copy(const protocol::ChunkDescriptor& d) {
  (void)cudaSetDevice(device_);  // the I/O thread stays there (EventFence says why)
  cudaStream_t s = stream_->get();
  CopyPlan plan = plan_copy(d);
  cuda_check(cudaStreamWaitEvent(s, memory_.slot_event(d.slot), 0),
             "waiting for the server's chunk " + std::to_string(d.seq));
  void* buffer = nullptr;
  cuda_check(cudaMallocAsync(&buffer, std::max<uint64_t>(plan.bytes, 1), s),
             "allocating a " + std::to_string(plan.bytes) +
                 "-byte copy of a chunk on the GPU (free GPU memory)");
  auto copy = std::make_shared<CudaChunkCopy>(device_, stream_, buffer);  // frees it on a throw
  const uint8_t* slot = memory_.slot_data(d.slot);
  for (const auto& run : plan.runs)
    cuda_check(cudaMemcpyAsync(static_cast<uint8_t*>(buffer) + run.to, slot + run.from, run.bytes,
                               cudaMemcpyDeviceToDevice, s),
               "copying a chunk's rows on the GPU");
  copy->done = record_fence(device_, s, "recording a chunk copy's event");
  return {copy, std::move(plan.desc), {copy->done}};
}

CudaAssembler::CudaAssembler(const Session& session)
    : memory_(session.memory()), device_(memory_.cuda_device()) {
  CudaDeviceGuard guard(device_);
  copy_stream_ = std::make_shared<CudaStream>(CudaStream::create());
}

void CudaAssembler::view(Batch& batch) {
  const Piece& p = pieces_.front();
  auto state = std::make_unique<CudaBatchState>(device_, copy_stream_);
  state->ready.push_back(ready_event(*p.chunk));
  batch.tensors = views_in_place(p);
  for (auto& v : batch.tensors) {
    v.device = protocol::DeviceKind::kCuda;
    v.device_index = static_cast<uint32_t>(device_);
  }
  batch.chunks_.push_back(p.chunk);
  batch.device_ = std::move(state);
  pieces_.clear();
}

void CudaAssembler::copy(Batch& batch) {
  // The batch owns the state from the start: if a copy fails, destroying it frees the buffers.
  auto* state = new CudaBatchState(device_, copy_stream_);
  batch.device_.reset(state);
  CudaDeviceGuard guard(device_);
  cudaStream_t cs = copy_stream_->get();
  const auto& first = pieces_.front().chunk->desc;
  for (const auto& p : pieces_) {
    check_stackable(first, p.chunk->desc, /*contiguous=*/true);
    cuda_check(cudaStreamWaitEvent(cs, ready_event(*p.chunk), 0),
               "waiting for the server's chunk " + std::to_string(p.chunk->desc.seq));
  }
  for (size_t ti = 0; ti < first.tensors.size(); ++ti) {
    const auto& t = first.tensors[ti];
    TensorView v = contiguous_view(t, batch.size);
    v.device = protocol::DeviceKind::kCuda;
    v.device_index = static_cast<uint32_t>(device_);
    size_t row_bytes = static_cast<size_t>(v.strides[0]) * dtype_size(t.dtype);
    void* buffer = nullptr;
    cuda_check(cudaMallocAsync(&buffer, std::max<size_t>(row_bytes * batch.size, 1), cs),
               "allocating a " + std::to_string(row_bytes * batch.size) +
                   "-byte batch copy on the GPU (free GPU memory or hold fewer batches)");
    state->owned.push_back(buffer);
    size_t row = 0;
    for (const auto& p : pieces_) {
      const uint8_t* src = p.chunk->base + p.chunk->desc.tensors[ti].offset + p.start * row_bytes;
      cuda_check(cudaMemcpyAsync(static_cast<uint8_t*>(buffer) + row * row_bytes, src,
                                 p.count * row_bytes, cudaMemcpyDeviceToDevice, cs),
                 "copying tensor '" + t.name + "' of a batch on the GPU");
      row += p.count;
    }
    v.data = buffer;
    batch.tensors.push_back(std::move(v));
  }
  auto done = record_fence(device_, cs, "recording a batch copy's event");
  for (const auto& p : pieces_) p.chunk->add_fence(done);
  state->copy_done = done;
  state->ready.push_back(done->get());
  pieces_.clear();
}

PinnedHostAssembler::PinnedHostAssembler(uint32_t batch_size, int device)
    : HostAssembler(batch_size), device_(device) {
  if (device_ < 0) cuda_check(cudaGetDevice(&device_), "cudaGetDevice");
}

void PinnedHostAssembler::view(Batch& batch) {
  const bool in_pool = viewable() == View::kSlot;
  HostAssembler::view(batch);
  if (!in_pool) return;  // a view of a private chunk's pageable copy: nothing to fence
  // Host memory needs no readiness wait (the server wrote it before the descriptor was sent):
  // the state only fences the release behind the user's copy.
  batch.device_ = std::make_unique<CudaBatchState>(device_, nullptr);
  batch.pinned = true;
}

}  // namespace batchcast
