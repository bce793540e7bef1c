// Device identity: which GPU (or MIG instance) a pool lives on, as CUDA and nvidia-smi name it.
//
// A GPU pool is shared through CUDA IPC, which works only between processes on the same device
// and never across MIG instances. Indices are per process (CUDA_VISIBLE_DEVICES renumbers), so
// the one stable name is the device UUID: the server announces its arena's UUID in the Welcome
// and a consumer looks for it among the devices it sees. Under MIG each instance has its own
// UUID (nvidia-smi -L: "MIG-..."), so a consumer in another instance cannot find it.
// A pool may be placed on several GPUs (one arena each); a consumer reads the one on its own.
// This file is the pure part of those rules (no CUDA calls), so that it is tested everywhere:
// parsing `--device` (cpu, cuda, cuda:K, GPU-<uuid>, MIG-<uuid>, lists of GPUs, all), formatting
// UUIDs as nvidia-smi does, which arena a consumer reads, and the message it gets when none of
// the pool's devices is its own.
// Thread-safety: pure functions. Ownership: values only.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace batchcast {

using DeviceUuid = std::array<uint8_t, 16>;

// What `--device` names: the host, a CUDA index, or a device by UUID (a GPU or a MIG instance).
struct DeviceSpec {
  enum class Kind { kCpu, kIndex, kUuid } kind = Kind::kCpu;
  int index = -1;     // kIndex
  DeviceUuid uuid{};  // kUuid
  bool mig = false;   // kUuid: named as "MIG-..."
};

// Parses cpu, cuda (= cuda:0), cuda:K, GPU-<uuid> or MIG-<uuid> (<uuid> as nvidia-smi -L prints
// it: 8-4-4-4-12 hex digits). nullopt for anything else; device_spec_error says why.
std::optional<DeviceSpec> parse_device_spec(const std::string& text);
// Empty when `text` parses, else the message naming the accepted forms (and, for the old
// "MIG-GPU-<uuid>/gi/ci" names of drivers before R470, where to find the current one).
std::string device_spec_error(const std::string& text);

// A server's `--device`: one of the forms above, a comma-separated list of GPUs (the pool is
// placed on each: cuda:0,cuda:1), or `all` (every GPU the server sees). `cpu` stands alone.
struct DeviceList {
  bool all = false;
  std::vector<DeviceSpec> devices;  // unless `all`; one kCpu entry for a host pool
};
std::optional<DeviceList> parse_device_list(const std::string& text);
// Empty when `text` parses, else why not.
std::string device_list_error(const std::string& text);

// "cuda:0, cuda:1": CUDA indices of this process as messages name them.
std::string cuda_list(const std::vector<int>& indices);

// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" ("MIG-..." when mig), as nvidia-smi -L prints it.
std::string format_device_uuid(const DeviceUuid& uuid, bool mig);

// A CUDA device as one process sees it.
struct VisibleDevice {
  int index = 0;     // this process's index
  std::string name;  // cudaDeviceProp::name ("NVIDIA H100 80GB HBM3 MIG 1g.10gb" for an instance)
  DeviceUuid uuid{};
};

// CUDA names a MIG instance "<GPU name> MIG <profile>", which is how a process tells an
// instance from a whole GPU without NVML.
bool is_mig_device(const std::string& name);
// "cuda:0 = NVIDIA H100 ... (MIG-...)": the device as both CUDA and nvidia-smi name it.
std::string describe_device(const VisibleDevice& device);

// The consumer's error when none of the pool's devices (`pool`, from the Welcome) is among
// `visible`: names the pool's UUIDs, every device this process sees, and the fix (the same GPU
// or MIG instance in CUDA_VISIBLE_DEVICES, a host pool, or one server per instance).
std::string unreachable_pool_message(const std::vector<DeviceUuid>& pool,
                                     const std::vector<VisibleDevice>& visible);

// Which arena of a GPU pool a consumer reads: the one on its device `wanted` (this process's
// index), or with wanted = -1 the one on its current device `current`, else the first of the
// pool's devices it sees. `arena` indexes `pool`; on failure it is -1 and `error` names the
// pool's devices, the consumer's and the fix.
struct ArenaChoice {
  int arena = -1;
  int device = -1;  // this process's index of the arena's device
  std::string error;
};
ArenaChoice choose_pool_arena(const std::vector<DeviceUuid>& pool,
                              const std::vector<VisibleDevice>& visible, int wanted, int current);

}  // namespace batchcast
