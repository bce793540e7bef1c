#include "shm/slot_memory.h"

#include <unistd.h>

#include "common/error.h"

namespace batchcast {

SlotMemory::SlotMemory(SlotPool pool) : pool_(std::move(pool)) {}
SlotMemory::SlotMemory(SlotMemory&&) noexcept = default;
SlotMemory::~SlotMemory() = default;

SlotMemory SlotMemory::create(const std::string& segment_name, uint32_t slot_count,
                              uint64_t slot_bytes, const std::vector<int>& cuda_devices) {
  const bool on_gpu = !cuda_devices.empty();
#ifndef BATCHCAST_HAVE_CUDA
  if (on_gpu)
    throw Error(
        "--device cuda: this build has no CUDA support (use --device cpu, or rebuild with "
        "nvcc: see scripts/README.md)");
#endif
  SlotMemory m(SlotPool::create(segment_name, slot_count, slot_bytes, /*host_slots=*/!on_gpu));
#ifdef BATCHCAST_HAVE_CUDA
  if (on_gpu) {
    // The pool's slot size, not the one asked for: the pool rounds it up, the Welcome announces
    // the rounded one, and consumers find slot k of the arena at k times that.
    m.arenas_ =
        std::make_unique<ArenaSet>(cuda_devices, m.pool_.slot_count(), m.pool_.slot_bytes());
    m.cuda_device_ = m.arenas_->primary().device();
  }
#endif
  return m;
}

SlotMemory SlotMemory::attach(const protocol::Welcome& w, bool pin_host, int cuda_device) {
  const bool host = w.device == protocol::DeviceKind::kCpu;
  SlotMemory m(SlotPool::attach(w.segment_name, w.slot_count, w.slot_bytes, w.slots_offset,
                                host && pin_host ? OnWrite::kFail : OnWrite::kCopy));
  if (host) {
    if (pin_host) m.pin_slots(cuda_device);
    if (pin_host && !m.pinned_)  // staged copies instead: in-place writes stay private
      m.pool_ = SlotPool::attach(w.segment_name, w.slot_count, w.slot_bytes, w.slots_offset,
                                 OnWrite::kCopy);
    return m;
  }
  // CUDA IPC opens only another process's memory (the exporter gets an invalid context error).
  if (w.server_pid == static_cast<uint32_t>(::getpid()))
    throw Error("a GPU pool cannot be read by the process that serves it (CUDA IPC maps another "
                "process's memory only): read it from another process, or serve a host pool");
#ifdef BATCHCAST_HAVE_CUDA
  std::vector<DeviceUuid> pool;
  for (const auto& a : w.cuda_arenas) pool.push_back(a.device_uuid);
  int current = -1;
  if (cuda_device < 0 && cudaGetDevice(&current) != cudaSuccess) (void)cudaGetLastError();
  const ArenaChoice choice =
      choose_pool_arena(pool, visible_cuda_devices(), cuda_device, current);
  if (choice.arena < 0) throw Error(choice.error);
  const protocol::CudaArena& arena = w.cuda_arenas[choice.arena];
  m.mapping_ = std::make_unique<ArenaMapping>(ArenaMapping::open(
      choice.device, arena.memory_handle, arena.event_handles, w.slot_bytes));
  m.cuda_device_ = m.mapping_->device();
  return m;
#else
  throw Error("the pool " + w.segment_name +
              " is in CUDA memory; this build has no CUDA support (rebuild with nvcc: see "
              "scripts/README.md)");
#endif
}

void SlotMemory::pin_slots(int device) {
#ifdef BATCHCAST_HAVE_CUDA
  // The mapping is read-only and shared, which cudaHostRegister accepts only as such, and stays so
  // (OnWrite::kFail): re-mapping a slot copy-on-write under the registration would leave the
  // driver's pinned pages behind, and a private mapping can be copied page by page when locked.
  registration_ =
      HostRegistration::try_register(pool_.slot_data(0), pool_.slot_count() * pool_.slot_bytes(),
                                     device, /*read_only=*/true, &pin_failure_);
  pinned_ = registration_.has_value();
#else
  (void)device;
  pin_failure_ = "this build of batchcast has no CUDA support";
#endif
}

void SlotMemory::describe(protocol::Welcome& w) const {
  w.segment_name = pool_.segment_name();
  w.segment_bytes = pool_.segment_bytes();
  w.slot_count = pool_.slot_count();
  w.slot_bytes = pool_.slot_bytes();
  w.slots_offset = pool_.slots_offset();
  w.device = device();
#ifdef BATCHCAST_HAVE_CUDA
  w.cuda_arenas.clear();
  if (arenas_)
    for (const DeviceArena& a : arenas_->arenas())
      w.cuda_arenas.push_back({a.device_uuid(), a.memory_handle(), a.event_handles()});
#endif
}

uint8_t* SlotMemory::slot_data(uint32_t slot) const {
#ifdef BATCHCAST_HAVE_CUDA
  if (arenas_) return arenas_->primary().slot_data(slot);
  if (mapping_) return mapping_->slot_data(slot);
#endif
  return pool_.slot_data(slot);
}

#ifdef BATCHCAST_HAVE_CUDA
cudaEvent_t SlotMemory::slot_event(uint32_t slot) const {
  if (arenas_) return arenas_->primary().slot_event(slot);
  if (mapping_) return mapping_->slot_event(slot);
  return nullptr;
}
#endif

}  // namespace batchcast
