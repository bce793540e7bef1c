#include "metrics/nvml.h"

#include <dlfcn.h>

#include <map>

namespace batchcast::metrics {
namespace {

// The subset of nvml.h that we call, declared here because the header is not installed on
// machines without CUDA. These layouts are part of NVML's stable ABI.
using nvmlReturn_t = int;  // NVML_SUCCESS == 0
constexpr nvmlReturn_t kNotFound = 6;
constexpr nvmlReturn_t kInsufficientSize = 7;
using nvmlDevice_t = struct nvmlDevice_st*;
using nvmlGpmSample_t = struct nvmlGpmSample_st*;
struct nvmlUtilization_t {
  unsigned int gpu;
  unsigned int memory;
};
struct nvmlMemory_t {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};
struct nvmlProcessUtilizationSample_t {
  unsigned int pid;
  unsigned long long timeStamp;  // microseconds
  unsigned int smUtil, memUtil, encUtil, decUtil;
};
// nvmlProcessInfo_v2_t, what the _v3 process-list functions fill on drivers whose struct did
// not grow; some drivers' _v3 wrote a larger struct (usedGpuCcProtectedMemory), which is why the
// versioned nvmlDeviceGetRunningProcessDetailList is preferred when present.
struct nvmlProcessInfo_v2_t {
  unsigned int pid;
  unsigned long long usedGpuMemory;
  unsigned int gpuInstanceId, computeInstanceId;
};
struct nvmlProcessDetail_v1_t {
  unsigned int pid;
  unsigned long long usedGpuMemory;
  unsigned int gpuInstanceId, computeInstanceId;
  unsigned long long usedGpuCcProtectedMemory;
};
struct nvmlProcessDetailList_v1_t {
  unsigned int version;  // NVML_STRUCT_VERSION(ProcessDetailList, 1)
  unsigned int mode;     // 0 compute, 1 graphics, 2 MPS compute
  unsigned int numProcArrayEntries;
  nvmlProcessDetail_v1_t* procArray;
};
constexpr unsigned int kProcessDetailListV1 =
    static_cast<unsigned int>(sizeof(nvmlProcessDetailList_v1_t)) | (1u << 24);
constexpr unsigned int kModeCompute = 0, kModeMps = 2;
// NVML's value for an unavailable usedGpuMemory (NVML_VALUE_NOT_AVAILABLE).
constexpr unsigned long long kValueNotAvailable = ~0ULL;
struct nvmlGpmSupport_t {
  unsigned int version;  // NVML_GPM_SUPPORT_VERSION == 1
  unsigned int isSupportedDevice;
};
struct nvmlGpmMetric_t {
  unsigned int metricId;
  nvmlReturn_t nvmlReturn;
  double value;
  struct {
    char* shortName;
    char* longName;
    char* unit;
  } metricInfo;
};
// The driver reads numMetrics entries only, so a short array is enough (nvml.h's is longer).
struct nvmlGpmMetricsGet_t {
  unsigned int version;  // NVML_GPM_METRICS_GET_VERSION == 1
  unsigned int numMetrics;
  nvmlGpmSample_t sample1, sample2;
  nvmlGpmMetric_t metrics[4];
};
// nvmlGpmMetricId_t: SM_UTIL, SM_OCCUPANCY, ANY_TENSOR_UTIL, DRAM_BW_UTIL.
constexpr unsigned int kGpmMetricIds[4] = {2, 3, 5, 10};
constexpr double kGpmMinSpanS = 0.1;  // GPM's minimum distance between two samples

using InitFn = nvmlReturn_t (*)();
using ShutdownFn = nvmlReturn_t (*)();
using GetCountFn = nvmlReturn_t (*)(unsigned int*);
using GetHandleFn = nvmlReturn_t (*)(unsigned int, nvmlDevice_t*);
using GetNameFn = nvmlReturn_t (*)(nvmlDevice_t, char*, unsigned int);
using GetUtilFn = nvmlReturn_t (*)(nvmlDevice_t, nvmlUtilization_t*);
using GetMemFn = nvmlReturn_t (*)(nvmlDevice_t, nvmlMemory_t*);
using GetPowerFn = nvmlReturn_t (*)(nvmlDevice_t, unsigned int*);  // milliwatts
using GetEnergyFn = nvmlReturn_t (*)(nvmlDevice_t, unsigned long long*);
using GetMigModeFn = nvmlReturn_t (*)(nvmlDevice_t, unsigned int*, unsigned int*);
using GetProcUtilFn = nvmlReturn_t (*)(nvmlDevice_t, nvmlProcessUtilizationSample_t*, unsigned int*,
                                       unsigned long long);
using GetProcDetailFn = nvmlReturn_t (*)(nvmlDevice_t, nvmlProcessDetailList_v1_t*);
using GetProcsV3Fn = nvmlReturn_t (*)(nvmlDevice_t, unsigned int*, nvmlProcessInfo_v2_t*);
using GpmSupportFn = nvmlReturn_t (*)(nvmlDevice_t, nvmlGpmSupport_t*);
using GpmAllocFn = nvmlReturn_t (*)(nvmlGpmSample_t*);
using GpmFreeFn = nvmlReturn_t (*)(nvmlGpmSample_t);
using GpmGetFn = nvmlReturn_t (*)(nvmlDevice_t, nvmlGpmSample_t);
using GpmMetricsGetFn = nvmlReturn_t (*)(nvmlGpmMetricsGet_t*);

struct DlCloser {
  void operator()(void* h) const {
    if (h != nullptr) dlclose(h);
  }
};

}  // namespace

struct Nvml::Impl {
  std::unique_ptr<void, DlCloser> handle;
  ShutdownFn shutdown = nullptr;
  GetUtilFn get_util = nullptr;
  GetMemFn get_mem = nullptr;
  GetPowerFn get_power = nullptr;        // optional symbols from here on
  GetPowerFn get_power_limit = nullptr;  // (enforced limit)
  GetEnergyFn get_energy = nullptr;
  GetProcUtilFn get_proc_util = nullptr;
  GetProcDetailFn get_proc_detail = nullptr;
  GetProcsV3Fn get_compute_procs = nullptr, get_mps_procs = nullptr;
  GpmFreeFn gpm_free = nullptr;
  GpmGetFn gpm_get = nullptr;
  GpmMetricsGetFn gpm_metrics = nullptr;
  struct Device {
    nvmlDevice_t handle = nullptr;
    bool energy = false;
    // GPM: the previous sample and when it was taken; null on a device without GPM.
    nvmlGpmSample_t gpm_prev = nullptr, gpm_next = nullptr;
    double gpm_prev_t = -1;
    unsigned long long last_util_ts = 0;  // process utilisation samples already seen
  };
  std::vector<Device> devices;
  std::vector<std::string> names;
  NvmlCapabilities caps;
  std::vector<std::string> missing;

  ~Impl() {
    for (Device& d : devices) {
      if (d.gpm_prev != nullptr) gpm_free(d.gpm_prev);
      if (d.gpm_next != nullptr) gpm_free(d.gpm_next);
    }
    if (shutdown != nullptr) shutdown();
  }

  void probe(void* lib) {
    auto sym = [&](const char* name) { return dlsym(lib, name); };
    get_energy = reinterpret_cast<GetEnergyFn>(sym("nvmlDeviceGetTotalEnergyConsumption"));
    get_proc_util = reinterpret_cast<GetProcUtilFn>(sym("nvmlDeviceGetProcessUtilization"));
    get_proc_detail =
        reinterpret_cast<GetProcDetailFn>(sym("nvmlDeviceGetRunningProcessDetailList"));
    get_compute_procs =
        reinterpret_cast<GetProcsV3Fn>(sym("nvmlDeviceGetComputeRunningProcesses_v3"));
    get_mps_procs =
        reinterpret_cast<GetProcsV3Fn>(sym("nvmlDeviceGetMPSComputeRunningProcesses_v3"));
    auto gpm_support = reinterpret_cast<GpmSupportFn>(sym("nvmlGpmQueryDeviceSupport"));
    auto gpm_alloc = reinterpret_cast<GpmAllocFn>(sym("nvmlGpmSampleAlloc"));
    gpm_free = reinterpret_cast<GpmFreeFn>(sym("nvmlGpmSampleFree"));
    gpm_get = reinterpret_cast<GpmGetFn>(sym("nvmlGpmSampleGet"));
    gpm_metrics = reinterpret_cast<GpmMetricsGetFn>(sym("nvmlGpmMetricsGet"));
    auto mig_mode = reinterpret_cast<GetMigModeFn>(sym("nvmlDeviceGetMigMode"));
    const bool gpm_api = gpm_support && gpm_alloc && gpm_free && gpm_get && gpm_metrics;
    for (Device& d : devices) {
      unsigned long long mj = 0;
      d.energy = get_energy != nullptr && get_energy(d.handle, &mj) == 0;
      caps.energy = caps.energy || d.energy;
      nvmlGpmSupport_t support{1, 0};
      if (gpm_api && gpm_support(d.handle, &support) == 0 && support.isSupportedDevice != 0 &&
          gpm_alloc(&d.gpm_prev) == 0 && gpm_alloc(&d.gpm_next) == 0) {
        caps.gpm = true;
      } else {
        if (d.gpm_prev != nullptr) gpm_free(d.gpm_prev);
        d.gpm_prev = nullptr;
      }
      unsigned int current = 0, pending = 0;
      if (mig_mode != nullptr && mig_mode(d.handle, &current, &pending) == 0 && current == 1)
        caps.mig_enabled = true;
    }
    caps.process_utilization = get_proc_util != nullptr;
    caps.process_list = get_proc_detail != nullptr || get_compute_procs != nullptr;
    if (!caps.energy)
      missing.push_back(
          "GPU energy: nvmlDeviceGetTotalEnergyConsumption unsupported (pre-Volta "
          "GPU or old driver); energy per sample is omitted");
    if (!caps.gpm)
      missing.push_back(
          "GPM metrics (SM activity, SM occupancy, tensor activity, DRAM "
          "bandwidth): need a Hopper or later GPU and a driver with nvmlGpm*");
    if (!caps.process_list)
      missing.push_back(
          "per-process GPU memory: the driver lacks the _v3/versioned "
          "running-process lists");
    if (!caps.process_utilization)
      missing.push_back(
          "per-process SM utilisation: the driver lacks "
          "nvmlDeviceGetProcessUtilization");
  }

  void read_gpm(Device& d, GpuReading& r, double now) {
    if (d.gpm_prev == nullptr) return;
    if (d.gpm_prev_t >= 0 && now - d.gpm_prev_t < kGpmMinSpanS) return;
    if (gpm_get(d.handle, d.gpm_next) != 0) return;
    if (d.gpm_prev_t >= 0) {
      nvmlGpmMetricsGet_t get{};
      get.version = 1;
      get.numMetrics = 4;
      get.sample1 = d.gpm_prev;
      get.sample2 = d.gpm_next;
      for (int i = 0; i < 4; ++i) get.metrics[i].metricId = kGpmMetricIds[i];
      if (gpm_metrics(&get) == 0) {
        std::optional<double>* out[4] = {&r.sm_active_percent, &r.sm_occupancy_percent,
                                         &r.tensor_active_percent, &r.dram_active_percent};
        for (int i = 0; i < 4; ++i)
          if (get.metrics[i].nvmlReturn == 0) *out[i] = get.metrics[i].value;
      }
    }
    std::swap(d.gpm_prev, d.gpm_next);
    d.gpm_prev_t = now;
  }

  // pid -> memory (bytes) for one device and mode, through the versioned call when present.
  bool list_processes(nvmlDevice_t dev, bool mps, std::map<unsigned int, unsigned long long>* out) {
    std::vector<nvmlProcessDetail_v1_t> buf(16);
    if (get_proc_detail != nullptr) {
      for (int attempt = 0; attempt < 3; ++attempt) {
        nvmlProcessDetailList_v1_t list{kProcessDetailListV1, mps ? kModeMps : kModeCompute,
                                        static_cast<unsigned int>(buf.size()), buf.data()};
        const nvmlReturn_t rc = get_proc_detail(dev, &list);
        if (rc == kInsufficientSize) {
          buf.resize(list.numProcArrayEntries + 8);
          continue;
        }
        if (rc != 0) return false;
        for (unsigned int i = 0; i < list.numProcArrayEntries; ++i)
          (*out)[buf[i].pid] +=
              buf[i].usedGpuMemory == kValueNotAvailable ? 0 : buf[i].usedGpuMemory;
        return true;
      }
      return false;
    }
    GetProcsV3Fn fn = mps ? get_mps_procs : get_compute_procs;
    if (fn == nullptr) return false;
    std::vector<nvmlProcessInfo_v2_t> info(16);
    for (int attempt = 0; attempt < 3; ++attempt) {
      unsigned int n = static_cast<unsigned int>(info.size());
      const nvmlReturn_t rc = fn(dev, &n, info.data());
      if (rc == kInsufficientSize) {
        info.resize(n + 8);
        continue;
      }
      if (rc != 0) return false;
      for (unsigned int i = 0; i < n; ++i)
        (*out)[info[i].pid] +=
            info[i].usedGpuMemory == kValueNotAvailable ? 0 : info[i].usedGpuMemory;
      return true;
    }
    return false;
  }
};

std::optional<Nvml> Nvml::open(const std::string& library, std::string* why_not) {
  auto fail = [&](std::string why) -> std::optional<Nvml> {
    if (why_not != nullptr) *why_not = std::move(why);
    return std::nullopt;
  };
  std::unique_ptr<void, DlCloser> handle(dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL));
  if (!handle) {
    const char* err = dlerror();
    return fail("cannot load " + library + " (" + (err ? err : "unknown error") +
                "); GPU metrics are omitted");
  }
  auto sym = [&](const char* name) { return dlsym(handle.get(), name); };
  // The _v2 entry points are what nvml.h maps the plain names to since CUDA 5.5/7.0.
  auto init = reinterpret_cast<InitFn>(sym("nvmlInit_v2"));
  auto shutdown = reinterpret_cast<ShutdownFn>(sym("nvmlShutdown"));
  auto get_count = reinterpret_cast<GetCountFn>(sym("nvmlDeviceGetCount_v2"));
  auto get_handle = reinterpret_cast<GetHandleFn>(sym("nvmlDeviceGetHandleByIndex_v2"));
  auto get_name = reinterpret_cast<GetNameFn>(sym("nvmlDeviceGetName"));
  auto get_util = reinterpret_cast<GetUtilFn>(sym("nvmlDeviceGetUtilizationRates"));
  auto get_mem = reinterpret_cast<GetMemFn>(sym("nvmlDeviceGetMemoryInfo"));
  if (!init || !shutdown || !get_count || !get_handle || !get_util || !get_mem) {
    return fail(library +
                " lacks the NVML functions batchcast needs (driver too old?); GPU "
                "metrics are omitted");
  }
  if (nvmlReturn_t rc = init(); rc != 0) {
    return fail("nvmlInit failed with NVML error " + std::to_string(rc) +
                " (no GPU or driver not loaded); GPU metrics are omitted");
  }
  auto impl = std::make_unique<Impl>();
  impl->shutdown = shutdown;  // from here on ~Impl shuts NVML down
  impl->get_util = get_util;
  impl->get_mem = get_mem;
  impl->get_power = reinterpret_cast<GetPowerFn>(sym("nvmlDeviceGetPowerUsage"));
  impl->get_power_limit = reinterpret_cast<GetPowerFn>(sym("nvmlDeviceGetEnforcedPowerLimit"));
  unsigned int count = 0;
  if (get_count(&count) != 0) count = 0;
  for (unsigned int i = 0; i < count; ++i) {
    nvmlDevice_t dev = nullptr;
    if (get_handle(i, &dev) != 0) break;  // keep indices contiguous: stop at the first failure
    impl->devices.push_back(Impl::Device{dev});
    char name[96] = {};
    if (get_name == nullptr || get_name(dev, name, sizeof name) != 0) name[0] = '\0';
    impl->names.emplace_back(name);
  }
  impl->probe(handle.get());
  // Impl owns the handle: ~Impl's body (nvmlShutdown) runs before its members are destroyed,
  // so the library is unloaded only after NVML is shut down.
  impl->handle = std::move(handle);
  if (impl->devices.empty()) return fail("NVML reports no GPU; GPU metrics are omitted");
  return Nvml(std::move(impl));
}

Nvml::Nvml(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Nvml::Nvml(Nvml&&) noexcept = default;
Nvml& Nvml::operator=(Nvml&&) noexcept = default;
Nvml::~Nvml() = default;

int Nvml::device_count() const { return static_cast<int>(impl_->devices.size()); }
const std::vector<std::string>& Nvml::device_names() const { return impl_->names; }
const NvmlCapabilities& Nvml::capabilities() const { return impl_->caps; }
const std::vector<std::string>& Nvml::missing() const { return impl_->missing; }

std::vector<GpuReading> Nvml::read(double now) {
  std::vector<GpuReading> out(impl_->devices.size());
  for (size_t i = 0; i < out.size(); ++i) {
    Impl::Device& d = impl_->devices[i];
    nvmlDevice_t dev = d.handle;
    GpuReading& r = out[i];
    nvmlUtilization_t util{};
    if (impl_->get_util(dev, &util) == 0) r.utilization_percent = util.gpu;
    nvmlMemory_t mem{};
    if (impl_->get_mem(dev, &mem) == 0) {
      r.memory_used_mb = static_cast<double>(mem.used) / 1e6;
      if (mem.total > 0) r.memory_percent = 100.0 * mem.used / mem.total;
    }
    unsigned int mw = 0, limit_mw = 0;
    if (impl_->get_power != nullptr && impl_->get_power(dev, &mw) == 0) {
      r.power_watts = mw / 1000.0;
      if (impl_->get_power_limit != nullptr && impl_->get_power_limit(dev, &limit_mw) == 0 &&
          limit_mw > 0)
        r.power_percent = 100.0 * mw / limit_mw;
    }
    unsigned long long mj = 0;
    if (d.energy && impl_->get_energy(dev, &mj) == 0) r.energy_mj = static_cast<double>(mj);
    impl_->read_gpm(d, r, now);
  }
  return out;
}

std::vector<GpuProcess> Nvml::processes() {
  std::vector<GpuProcess> out;
  for (size_t g = 0; g < impl_->devices.size(); ++g) {
    Impl::Device& d = impl_->devices[g];
    std::map<unsigned int, GpuProcess> by_pid;
    for (bool mps : {false, true}) {
      std::map<unsigned int, unsigned long long> mem;
      if (!impl_->list_processes(d.handle, mps, &mem)) continue;
      for (auto [pid, bytes] : mem) {
        GpuProcess& p = by_pid[pid];
        p.pid = pid;
        p.gpu = static_cast<int>(g);
        p.memory_mb = p.memory_mb.value_or(0) + static_cast<double>(bytes) / 1e6;
        p.mps = p.mps || mps;
      }
    }
    if (impl_->get_proc_util != nullptr) {
      unsigned int n = 0;
      nvmlReturn_t rc = impl_->get_proc_util(d.handle, nullptr, &n, d.last_util_ts);
      std::vector<nvmlProcessUtilizationSample_t> samples;
      if ((rc == kInsufficientSize || rc == 0) && n > 0) {
        samples.resize(n + 4);
        n = static_cast<unsigned int>(samples.size());
        rc = impl_->get_proc_util(d.handle, samples.data(), &n, d.last_util_ts);
        if (rc != 0) n = 0;
        // Mean over the samples since the last read: NVML keeps one per pid and ~1/6 s.
        std::map<unsigned int, std::pair<double, int>> sm;
        for (unsigned int i = 0; i < n; ++i) {
          auto& [sum, count] = sm[samples[i].pid];
          sum += samples[i].smUtil;
          ++count;
          d.last_util_ts = std::max(d.last_util_ts, samples[i].timeStamp);
        }
        for (auto& [pid, acc] : sm) {
          GpuProcess& p = by_pid[pid];
          p.pid = pid;
          p.gpu = static_cast<int>(g);
          p.sm_percent = acc.first / acc.second;
        }
      } else if (rc == kNotFound) {
        // No sample since the last read: the listed processes had no SM activity.
        for (auto& [pid, p] : by_pid) p.sm_percent = 0.0;
      }
    }
    for (auto& [pid, p] : by_pid) out.push_back(p);
  }
  return out;
}

}  // namespace batchcast::metrics
