#include "metrics/nvml.h"

#include <dlfcn.h>

namespace batchcast::metrics {
namespace {

// The subset of nvml.h that we call, declared here because the header is not installed on
// machines without CUDA. These layouts are part of NVML's stable ABI.
using nvmlReturn_t = int;  // NVML_SUCCESS == 0
using nvmlDevice_t = struct nvmlDevice_st*;
struct nvmlUtilization_t {
  unsigned int gpu;
  unsigned int memory;
};
struct nvmlMemory_t {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};
using InitFn = nvmlReturn_t (*)();
using ShutdownFn = nvmlReturn_t (*)();
using GetCountFn = nvmlReturn_t (*)(unsigned int*);
using GetHandleFn = nvmlReturn_t (*)(unsigned int, nvmlDevice_t*);
using GetNameFn = nvmlReturn_t (*)(nvmlDevice_t, char*, unsigned int);
using GetUtilFn = nvmlReturn_t (*)(nvmlDevice_t, nvmlUtilization_t*);
using GetMemFn = nvmlReturn_t (*)(nvmlDevice_t, nvmlMemory_t*);
using GetPowerFn = nvmlReturn_t (*)(nvmlDevice_t, unsigned int*);  // milliwatts

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
  GetPowerFn get_power = nullptr;        // optional symbol
  GetPowerFn get_power_limit = nullptr;  // optional symbol (enforced limit)
  std::vector<nvmlDevice_t> devices;
  std::vector<std::string> names;

  ~Impl() {
    if (shutdown != nullptr) shutdown();
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
    impl->devices.push_back(dev);
    char name[96] = {};
    if (get_name == nullptr || get_name(dev, name, sizeof name) != 0) name[0] = '\0';
    impl->names.emplace_back(name);
  }
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

std::vector<GpuReading> Nvml::read() const {
  std::vector<GpuReading> out(impl_->devices.size());
  for (size_t i = 0; i < out.size(); ++i) {
    nvmlDevice_t dev = impl_->devices[i];
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
  }
  return out;
}

}  // namespace batchcast::metrics
