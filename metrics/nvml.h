// GPU readings through NVML, loaded at run time with dlopen so that batchcast builds and runs on
// machines without the NVIDIA driver (no NVML headers or link-time dependency: the few function
// pointer types used are declared in nvml.cpp).
//
// Contract: Nvml::open() returns an empty optional when the library is missing or nvmlInit
// fails (a machine without GPUs is an expected outcome, not an error) and says why through
// `why_not`. Optional readings (energy, GPM, per-process use) are probed once at open():
// capabilities() says which ones this driver and these GPUs give, and missing() names the
// others with the reason, for the caller to say once. An Nvml owns the dlopen handle and the NVML
// initialisation (RAII: nvmlShutdown and dlclose in the destructor); it is movable, not copyable.
// read() may be called from one thread at a time (the collector's sampler thread); NVML itself is
// thread-safe.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace batchcast::metrics {

// One GPU at one instant; a field NVML could not give is nullopt (e.g. power on some boards).
struct GpuReading {
  std::optional<double> utilization_percent;  // nvmlDeviceGetUtilizationRates().gpu
  std::optional<double> memory_used_mb;       // 10^6 bytes, as MLflow
  std::optional<double> memory_percent;       // used / total * 100
  std::optional<double> power_watts;          // nvmlDeviceGetPowerUsage / 1000
  std::optional<double> power_percent;        // power / enforced power limit * 100
  // nvmlDeviceGetTotalEnergyConsumption: millijoules since the driver loaded (Volta and later).
  std::optional<double> energy_mj;
  // GPM (Hopper and later), over the span since the previous read() (>= 100 ms apart, as GPM
  // requires; a read() sooner than that repeats these fields as nullopt). Percentages, the
  // quantities DCGM calls SMACT, SMOCC, TENSOR_ACTIVE and DRAM_ACTIVE.
  std::optional<double> sm_active_percent;
  std::optional<double> sm_occupancy_percent;
  std::optional<double> tensor_active_percent;
  std::optional<double> dram_active_percent;
};

// One process using a GPU, merged over the compute and MPS lists and the utilisation samples.
struct GpuProcess {
  unsigned int pid = 0;
  int gpu = 0;                       // NVML device index
  std::optional<double> memory_mb;   // used GPU memory, 10^6 bytes (not under MIG/WSL)
  std::optional<double> sm_percent;  // mean SM utilisation over samples since last read
  bool mps = false;                  // listed as an MPS client
};

// What the probed driver and devices give, any GPU counting.
struct NvmlCapabilities {
  bool energy = false;
  bool gpm = false;
  bool process_utilization = false;
  bool process_list = false;
  bool mig_enabled = false;  // MIG mode is on for some GPU
};

class Nvml {
 public:
  // `library`: the soname or path to dlopen (normally "libnvidia-ml.so.1").
  static std::optional<Nvml> open(const std::string& library, std::string* why_not);

  Nvml(Nvml&&) noexcept;
  Nvml& operator=(Nvml&&) noexcept;
  ~Nvml();

  int device_count() const;
  const std::vector<std::string>& device_names() const;
  const NvmlCapabilities& capabilities() const;
  // One sentence per optional reading this machine cannot give, with the reason.
  const std::vector<std::string>& missing() const;
  // One reading per device, index i = NVML device i. Not const: GPM keeps the previous sample
  // and process utilisation the last timestamp seen. `now`: seconds on the caller's monotonic
  // clock, which spaces the GPM samples.
  std::vector<GpuReading> read(double now);
  // Processes on any GPU now (empty without the process-list entry points).
  std::vector<GpuProcess> processes();

 private:
  struct Impl;
  explicit Nvml(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace batchcast::metrics
