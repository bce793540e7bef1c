#include "shm/cuda_pool.h"

#include <cstring>

#include "common/cuda_check.h"
#include "common/error.h"

namespace batchcast {

int cuda_device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no driver" error for later callers
    return 0;
  }
  return n;
}

int require_cuda_device(int device) {
  int n = cuda_device_count();
  if (n == 0)
    throw Error("cuda:" + std::to_string(device) +
                ": no CUDA device is usable here (no GPU or no driver); use --device cpu");
  if (device < 0 || device >= n)
    throw Error("cuda:" + std::to_string(device) + ": this process sees " + std::to_string(n) +
                " CUDA device(s) (0.." + std::to_string(n - 1) +
                "); pick one of them or check CUDA_VISIBLE_DEVICES");
  return device;
}

DeviceUuid cuda_device_uuid(int device) {
  cudaDeviceProp prop{};
  cuda_check(cudaGetDeviceProperties(&prop, device),
             "cudaGetDeviceProperties(cuda:" + std::to_string(device) + ")");
  DeviceUuid uuid;
  std::memcpy(uuid.data(), prop.uuid.bytes, uuid.size());
  return uuid;
}

std::vector<VisibleDevice> visible_cuda_devices() noexcept {
  std::vector<VisibleDevice> out;
  int n = cuda_device_count();
  for (int d = 0; d < n; ++d) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, d) != cudaSuccess) continue;
    VisibleDevice v;
    v.index = d;
    v.name = prop.name;
    std::memcpy(v.uuid.data(), prop.uuid.bytes, v.uuid.size());
    out.push_back(std::move(v));
  }
  return out;
}

int cuda_device_by_uuid(const DeviceUuid& uuid) noexcept {
  for (const auto& d : visible_cuda_devices())
    if (d.uuid == uuid) return d.index;
  return -1;
}

int require_cuda_device(const DeviceSpec& spec) {
  if (spec.kind != DeviceSpec::Kind::kUuid) return require_cuda_device(spec.index);
  const std::string name = format_device_uuid(spec.uuid, spec.mig);
  int index = cuda_device_by_uuid(spec.uuid);
  if (index >= 0) return index;
  std::string seen;
  for (const auto& d : visible_cuda_devices())
    seen += (seen.empty() ? "" : ", ") + describe_device(d);
  throw Error("--device " + name + ": this process does not see that device (it sees " +
              (seen.empty() ? std::string("none") : seen) +
              "); start the server with CUDA_VISIBLE_DEVICES=" + name +
              " (a process sees a MIG instance only when it is named there)");
}

CudaDeviceGuard::CudaDeviceGuard(int device) {
  cuda_check(cudaGetDevice(&previous_), "cudaGetDevice");
  cuda_check(cudaSetDevice(device), "cudaSetDevice(cuda:" + std::to_string(device) + ")");
}

CudaDeviceGuard::~CudaDeviceGuard() noexcept {
  if (previous_ >= 0) (void)cudaSetDevice(previous_);
}

// --- CudaEvent ---

CudaEvent CudaEvent::create(bool interprocess) {
  cudaEvent_t e = nullptr;
  unsigned flags = cudaEventDisableTiming | (interprocess ? cudaEventInterprocess : 0u);
  cuda_check(cudaEventCreateWithFlags(&e, flags), "cudaEventCreateWithFlags");
  return CudaEvent(e);
}

CudaEvent CudaEvent::open(const IpcHandleBytes& handle) {
  cudaIpcEventHandle_t h;
  static_assert(sizeof(h) == kIpcHandleBytes);
  std::memcpy(&h, handle.data(), sizeof(h));
  cudaEvent_t e = nullptr;
  cuda_check(cudaIpcOpenEventHandle(&e, h),
             "cudaIpcOpenEventHandle (the server's slot event; did the server exit?)");
  return CudaEvent(e);
}

CudaEvent& CudaEvent::operator=(CudaEvent&& o) noexcept {
  if (this != &o) {
    if (event_) (void)cudaEventDestroy(event_);
    event_ = o.event_;
    o.event_ = nullptr;
  }
  return *this;
}

CudaEvent::~CudaEvent() noexcept {
  if (event_) (void)cudaEventDestroy(event_);
}

IpcHandleBytes CudaEvent::ipc_handle() const {
  cudaIpcEventHandle_t h;
  cuda_check(cudaIpcGetEventHandle(&h, event_), "cudaIpcGetEventHandle");
  IpcHandleBytes out;
  std::memcpy(out.data(), &h, out.size());
  return out;
}

// --- CudaStream ---

CudaStream CudaStream::create() {
  CudaStream s;
  cuda_check(cudaStreamCreateWithFlags(&s.stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  return s;
}

CudaStream& CudaStream::operator=(CudaStream&& o) noexcept {
  if (this != &o) {
    if (stream_) (void)cudaStreamDestroy(stream_);
    stream_ = o.stream_;
    o.stream_ = nullptr;
  }
  return *this;
}

CudaStream::~CudaStream() noexcept {
  if (stream_) (void)cudaStreamDestroy(stream_);
}

// --- PinnedBuffer / DeviceBuffer ---

PinnedBuffer PinnedBuffer::allocate(size_t bytes) {
  PinnedBuffer b;
  void* p = nullptr;
  cuda_check(cudaHostAlloc(&p, bytes, cudaHostAllocPortable),
             "cudaHostAlloc of " + std::to_string(bytes >> 20) +
                 " MiB pinned staging memory (lower --ring or --batch-size, or raise the "
                 "locked-memory limit)");
  b.data_ = static_cast<uint8_t*>(p);
  b.bytes_ = bytes;
  return b;
}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& o) noexcept {
  if (this != &o) {
    if (data_) (void)cudaFreeHost(data_);
    data_ = o.data_;
    bytes_ = o.bytes_;
    o.data_ = nullptr;
  }
  return *this;
}

PinnedBuffer::~PinnedBuffer() noexcept {
  if (data_) (void)cudaFreeHost(data_);
}

DeviceBuffer DeviceBuffer::allocate(size_t bytes) {
  DeviceBuffer b;
  void* p = nullptr;
  cuda_check(cudaMalloc(&p, bytes), "cudaMalloc of " + std::to_string(bytes >> 20) +
                                        " MiB (lower --ring or --batch-size, or free GPU memory)");
  b.data_ = static_cast<uint8_t*>(p);
  b.bytes_ = bytes;
  return b;
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (data_) (void)cudaFree(data_);
    data_ = o.data_;
    bytes_ = o.bytes_;
    o.data_ = nullptr;
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() noexcept {
  if (data_) (void)cudaFree(data_);
}

// --- HostRegistration ---

std::optional<HostRegistration> HostRegistration::try_register(const void* data, size_t bytes,
                                                               int device, bool read_only,
                                                               std::string* why) {
  const int n = cuda_device_count();
  if (n == 0 || device >= n) {
    *why =
        n == 0 ? "no CUDA device is usable" : "cuda:" + std::to_string(device) + " does not exist";
    return std::nullopt;
  }
  int previous = 0;
  (void)cudaGetDevice(&previous);
  if (device < 0) device = previous;
  // Registering creates a context on the current device: make that the copies' device (and
  // switch only when needed: setting a device creates its context too).
  if (device != previous) (void)cudaSetDevice(device);
  int supported = 0;
  cudaError_t st =
      cudaDeviceGetAttribute(&supported, cudaDevAttrHostRegisterReadOnlySupported, device);
  if (st == cudaSuccess && read_only && !supported) {
    *why = "cuda:" + std::to_string(device) +
           " cannot page-lock read-only memory (cudaDevAttrHostRegisterReadOnlySupported is 0)";
  } else if (st == cudaSuccess) {
    unsigned flags = cudaHostRegisterPortable | (read_only ? cudaHostRegisterReadOnly : 0u);
    st = cudaHostRegister(const_cast<void*>(data), bytes, flags);
  }
  if (st != cudaSuccess) {
    (void)cudaGetLastError();
    *why = "cudaHostRegister of " + std::to_string(bytes >> 20) +
           " MiB on cuda:" + std::to_string(device) + " failed: " + cudaGetErrorString(st) +
           " (the locked-memory limit? see ulimit -l)";
  }
  if (device != previous) (void)cudaSetDevice(previous);
  if (!why->empty()) return std::nullopt;
  return HostRegistration(const_cast<void*>(data));
}

HostRegistration& HostRegistration::operator=(HostRegistration&& o) noexcept {
  if (this != &o) {
    if (data_) (void)cudaHostUnregister(data_);
    data_ = o.data_;
    o.data_ = nullptr;
  }
  return *this;
}

HostRegistration::~HostRegistration() noexcept {
  if (data_) (void)cudaHostUnregister(data_);
}

// --- DeviceArena ---

DeviceArena DeviceArena::create(int device, uint32_t slot_count, uint64_t slot_bytes) {
  require_cuda_device(device);
  CudaDeviceGuard guard(device);
  // The server waits on the GPU (a slot's previous upload, nvJPEG's own waits) from several
  // threads. With the default scheduling CUDA spins a core per waiting thread on a machine
  // with many cores; a data server exists to spare the CPU, so its waits sleep instead. A
  // process whose context is already set otherwise (flags fixed) keeps its own: no error.
  if (cudaSetDeviceFlags(cudaDeviceScheduleBlockingSync) != cudaSuccess) (void)cudaGetLastError();
  DeviceArena a;
  a.device_ = device;
  a.slot_bytes_ = slot_bytes;
  a.memory_ = DeviceBuffer::allocate(slot_count * slot_bytes);
  cudaIpcMemHandle_t mh;
  static_assert(sizeof(mh) == kIpcHandleBytes);
  cuda_check(
      cudaIpcGetMemHandle(&mh, a.memory_.data()),
      "cudaIpcGetMemHandle (CUDA IPC needs Linux and a GPU not in WDDM/MIG-restricted mode)");
  std::memcpy(a.memory_handle_.data(), &mh, sizeof(mh));
  for (uint32_t i = 0; i < slot_count; ++i) {
    a.events_.push_back(CudaEvent::create(/*interprocess=*/true));
    a.event_handles_.push_back(a.events_.back().ipc_handle());
  }
  a.uuid_ = cuda_device_uuid(device);
  return a;
}

void DeviceArena::wait_for_slot(uint32_t slot) const {
  CudaDeviceGuard guard(device_);
  cuda_check(cudaEventSynchronize(slot_event(slot)),
             "waiting for the previous upload of slot " + std::to_string(slot));
}

// --- ArenaMapping ---

ArenaMapping ArenaMapping::open(int device, const IpcHandleBytes& memory,
                                const std::vector<IpcHandleBytes>& events, uint64_t slot_bytes) {
  ArenaMapping m;
  m.device_ = device;
  CudaDeviceGuard guard(m.device_);
  cudaIpcMemHandle_t mh;
  std::memcpy(&mh, memory.data(), sizeof(mh));
  void* base = nullptr;
  cuda_check(cudaIpcOpenMemHandle(&base, mh, cudaIpcMemLazyEnablePeerAccess),
             "cudaIpcOpenMemHandle (the server's GPU pool; did the server exit?)");
  m.base_ = static_cast<uint8_t*>(base);
  m.slot_bytes_ = slot_bytes;
  for (const auto& h : events) m.events_.push_back(CudaEvent::open(h));
  return m;
}

ArenaMapping::ArenaMapping(ArenaMapping&& o) noexcept
    : device_(o.device_),
      base_(o.base_),
      slot_bytes_(o.slot_bytes_),
      events_(std::move(o.events_)) {
  o.base_ = nullptr;
}

ArenaMapping& ArenaMapping::operator=(ArenaMapping&& o) noexcept {
  if (this != &o) {
    close();
    device_ = o.device_;
    base_ = o.base_;
    slot_bytes_ = o.slot_bytes_;
    events_ = std::move(o.events_);
    o.base_ = nullptr;
  }
  return *this;
}

ArenaMapping::~ArenaMapping() noexcept { close(); }

void ArenaMapping::close() noexcept {
  events_.clear();
  if (base_) (void)cudaIpcCloseMemHandle(base_);
  base_ = nullptr;
}

}  // namespace batchcast
