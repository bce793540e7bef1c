// CUDA building blocks of the GPU batch pool: RAII owners for every CUDA handle batchcast holds.
// Compiled only when BATCHCAST_HAVE_CUDA (CMake found nvcc); a CPU-only build has none of it.
//
// - DeviceArena (server): one device allocation of K equal slots (cudaMalloc once), exported
//   once with cudaIpcGetMemHandle, and one interprocess event per slot (recorded by the producer
//   after the slot's last write, waited on by consumers before they read it).
// - ArenaMapping (consumer): the same arena and events opened once in another process
//   (cudaIpcOpenMemHandle / cudaIpcOpenEventHandle), closed when the mapping is destroyed.
// - PinnedBuffer (cudaHostAlloc), DeviceBuffer (cudaMalloc), CudaStream, CudaEvent.
// - HostRegistration (consumer): a host pool's read-only mapping page-locked in place
//   (cudaHostRegister), so copies from it to a GPU are DMA transfers that overlap compute.
//
// Ownership and lifetime: every class is move-only; its destructor is noexcept and frees what it
// owns (errors while freeing are ignored: the process may be tearing down its context). The
// exporting DeviceArena must outlive every ArenaMapping of it: the server keeps it until all
// consumers left (a consumer of a dead server gets errors from CUDA, never a crash here).
// Errors: "no GPU" is a value (cuda_device_count() == 0); every other failure throws
// batchcast::Error naming the call, the device and the fix.
// Thread-safety: objects are not synchronised; the CUDA calls they make are thread-safe.
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "shm/device_identity.h"

namespace batchcast {

constexpr size_t kIpcHandleBytes =
    64;  // sizeof(cudaIpcMemHandle_t) == sizeof(cudaIpcEventHandle_t)
using IpcHandleBytes = std::array<uint8_t, kIpcHandleBytes>;

// Number of usable CUDA devices; 0 when there is no driver, no GPU, or CUDA fails to start.
int cuda_device_count() noexcept;
// Throws Error naming the fix unless `device` is a usable device index; returns it.
int require_cuda_device(int device);
// The device's UUID (stable across processes, unlike indices under CUDA_VISIBLE_DEVICES).
DeviceUuid cuda_device_uuid(int device);
// Every device this process sees (empty without a GPU or driver).
std::vector<VisibleDevice> visible_cuda_devices() noexcept;
// The index, in this process, of the device with `uuid`; -1 if this process cannot see it.
int cuda_device_by_uuid(const DeviceUuid& uuid) noexcept;
// The index of the device `--device` names (shm/device_identity.h); throws Error naming the
// fix when this process has no such device.
int require_cuda_device(const DeviceSpec& spec);

// Sets the calling thread's current device for the guard's lifetime, then restores it.
class CudaDeviceGuard {
 public:
  explicit CudaDeviceGuard(int device);
  ~CudaDeviceGuard() noexcept;
  CudaDeviceGuard(const CudaDeviceGuard&) = delete;
  CudaDeviceGuard& operator=(const CudaDeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

class CudaEvent {
 public:
  CudaEvent() = default;
  // cudaEventDisableTiming, plus cudaEventInterprocess when `interprocess`.
  static CudaEvent create(bool interprocess);
  // Opens an event exported by another process.
  static CudaEvent open(const IpcHandleBytes& handle);
  CudaEvent(CudaEvent&& o) noexcept : event_(o.event_) { o.event_ = nullptr; }
  CudaEvent& operator=(CudaEvent&& o) noexcept;
  ~CudaEvent() noexcept;
  cudaEvent_t get() const { return event_; }
  IpcHandleBytes ipc_handle() const;

 private:
  explicit CudaEvent(cudaEvent_t e) : event_(e) {}
  cudaEvent_t event_ = nullptr;
};

class CudaStream {
 public:
  CudaStream() = default;
  static CudaStream create();  // non-blocking w.r.t. the legacy default stream
  CudaStream(CudaStream&& o) noexcept : stream_(o.stream_) { o.stream_ = nullptr; }
  CudaStream& operator=(CudaStream&& o) noexcept;
  ~CudaStream() noexcept;
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

// Page-locked host memory (cudaHostAlloc, portable to every device).
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  static PinnedBuffer allocate(size_t bytes);
  PinnedBuffer(PinnedBuffer&& o) noexcept : data_(o.data_), bytes_(o.bytes_) { o.data_ = nullptr; }
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept;
  ~PinnedBuffer() noexcept;
  uint8_t* data() const { return data_; }
  size_t size() const { return bytes_; }

 private:
  uint8_t* data_ = nullptr;
  size_t bytes_ = 0;
};

// A range of host memory page-locked in place for copies to any GPU (cudaHostRegister with
// cudaHostRegisterPortable, plus cudaHostRegisterReadOnly for a read-only mapping, which CUDA
// requires there). Failure is an expected outcome (no GPU, no read-only registration on this
// platform, the locked-memory limit): try_register() returns nullopt and sets *why (which must
// be empty on entry). Unregisters on
// destruction, which must come before the range is unmapped.
class HostRegistration {
 public:
  // device: where the registration is made (a context is created there); -1: the current one.
  static std::optional<HostRegistration> try_register(const void* data, size_t bytes, int device,
                                                      bool read_only, std::string* why);
  HostRegistration(HostRegistration&& o) noexcept : data_(o.data_) { o.data_ = nullptr; }
  HostRegistration& operator=(HostRegistration&& o) noexcept;
  HostRegistration(const HostRegistration&) = delete;
  HostRegistration& operator=(const HostRegistration&) = delete;
  ~HostRegistration() noexcept;

 private:
  explicit HostRegistration(void* data) : data_(data) {}
  void* data_ = nullptr;
};

// Device memory on the current device (cudaMalloc).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  static DeviceBuffer allocate(size_t bytes);
  DeviceBuffer(DeviceBuffer&& o) noexcept : data_(o.data_), bytes_(o.bytes_) { o.data_ = nullptr; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  ~DeviceBuffer() noexcept;
  uint8_t* data() const { return data_; }
  size_t size() const { return bytes_; }

 private:
  uint8_t* data_ = nullptr;
  size_t bytes_ = 0;
};

// The server's GPU pool: slot_count slots of slot_bytes each (the host pool's slot size, a
// multiple of 4 KiB) in one cudaMalloc on `device`, plus one interprocess event per slot.
class DeviceArena {
 public:
  static DeviceArena create(int device, uint32_t slot_count, uint64_t slot_bytes);
  DeviceArena(DeviceArena&&) noexcept = default;
  DeviceArena& operator=(DeviceArena&&) noexcept = default;
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;

  int device() const { return device_; }
  uint32_t slot_count() const { return static_cast<uint32_t>(events_.size()); }
  uint64_t slot_bytes() const { return slot_bytes_; }
  uint8_t* slot_data(uint32_t slot) const { return memory_.data() + slot * slot_bytes_; }
  cudaEvent_t slot_event(uint32_t slot) const { return events_[slot].get(); }
  // Blocks until the work last recorded on the slot's event is done (a never-recorded event
  // counts as done): the producer's staging for that slot is free again. Throws Error.
  void wait_for_slot(uint32_t slot) const;
  const IpcHandleBytes& memory_handle() const { return memory_handle_; }
  const std::vector<IpcHandleBytes>& event_handles() const { return event_handles_; }
  const DeviceUuid& device_uuid() const { return uuid_; }

 private:
  DeviceArena() = default;
  int device_ = 0;
  uint64_t slot_bytes_ = 0;
  DeviceBuffer memory_;
  std::vector<CudaEvent> events_;
  IpcHandleBytes memory_handle_{};
  std::vector<IpcHandleBytes> event_handles_;
  DeviceUuid uuid_{};
};

// A consumer's view of a server's DeviceArena, opened once on `device` (this process's index of
// the arena's GPU: shm/device_identity.h, choose_pool_arena).
class ArenaMapping {
 public:
  // Throws Error when the handles cannot be opened (e.g. the server died).
  static ArenaMapping open(int device, const IpcHandleBytes& memory,
                           const std::vector<IpcHandleBytes>& events, uint64_t slot_bytes);
  ArenaMapping(ArenaMapping&& o) noexcept;
  ArenaMapping& operator=(ArenaMapping&& o) noexcept;
  ArenaMapping(const ArenaMapping&) = delete;
  ArenaMapping& operator=(const ArenaMapping&) = delete;
  ~ArenaMapping() noexcept;

  int device() const { return device_; }
  uint8_t* slot_data(uint32_t slot) const { return base_ + slot * slot_bytes_; }
  cudaEvent_t slot_event(uint32_t slot) const { return events_[slot].get(); }

 private:
  ArenaMapping() = default;
  void close() noexcept;
  int device_ = -1;
  uint8_t* base_ = nullptr;
  uint64_t slot_bytes_ = 0;
  std::vector<CudaEvent> events_;
};

}  // namespace batchcast
