#include "shm/arena_set.h"

#include "common/cuda_check.h"
#include "common/error.h"

namespace batchcast {

ArenaSet::ArenaSet(const std::vector<int>& devices, uint32_t slot_count, uint64_t slot_bytes) {
  if (devices.empty()) throw Error("a GPU pool needs at least one device");
  for (int device : devices) arenas_.push_back(DeviceArena::create(device, slot_count, slot_bytes));
  const int primary = devices.front();
  if (arenas_.size() > 1) {
    CudaDeviceGuard guard(primary);
    for (uint32_t i = 0; i < slot_count; ++i)
      written_.push_back(CudaEvent::create(/*interprocess=*/false));
  }
  streams_.resize(arenas_.size());
  peer_.assign(arenas_.size(), false);
  for (size_t k = 1; k < arenas_.size(); ++k) {
    const int device = devices[k];
    CudaDeviceGuard guard(device);
    streams_[k] = CudaStream::create();
    int can = 0;
    if (cudaDeviceCanAccessPeer(&can, device, primary) == cudaSuccess && can) {
      cudaError_t e = cudaDeviceEnablePeerAccess(primary, 0);
      if (e == cudaErrorPeerAccessAlreadyEnabled) e = cudaSuccess;
      (void)cudaGetLastError();
      peer_[k] = e == cudaSuccess;
    } else {
      (void)cudaGetLastError();
    }
  }
}

ArenaSet::~ArenaSet() {
  for (size_t k = 1; k < streams_.size(); ++k) {
    CudaDeviceGuard guard(arenas_[k].device());
    (void)cudaStreamSynchronize(streams_[k].get());
  }
}

void ArenaSet::replicate(uint32_t slot, uint64_t bytes, cudaStream_t written_on) const {
  if (arenas_.size() < 2) return;
  const DeviceArena& from = primary();
  {
    CudaDeviceGuard guard(from.device());
    cuda_check(cudaEventRecord(written_[slot].get(), written_on),
               "marking slot " + std::to_string(slot) + " written for its copies");
  }
  for (size_t k = 1; k < arenas_.size(); ++k) {
    const DeviceArena& to = arenas_[k];
    CudaDeviceGuard guard(to.device());
    cudaStream_t s = streams_[k].get();
    const std::string what = "copying slot " + std::to_string(slot) +
                             " from cuda:" + std::to_string(from.device()) +
                             " to cuda:" + std::to_string(to.device());
    cuda_check(cudaStreamWaitEvent(s, written_[slot].get(), 0), what);
    cuda_check(cudaMemcpyPeerAsync(to.slot_data(slot), to.device(), from.slot_data(slot),
                                   from.device(), bytes, s),
               what);
    cuda_check(cudaEventRecord(to.slot_event(slot), s), what);
  }
}

void ArenaSet::wait_for_slot(uint32_t slot) const {
  for (const DeviceArena& a : arenas_) a.wait_for_slot(slot);
}

std::string ArenaSet::describe_copies() const {
  std::string out;
  for (size_t k = 1; k < arenas_.size(); ++k) {
    if (!out.empty()) out += ", ";
    out += "cuda:" + std::to_string(primary().device()) +
           " -> cuda:" + std::to_string(arenas_[k].device()) +
           (peer_[k] ? " peer" : " through the host");
  }
  return out;
}

}  // namespace batchcast
