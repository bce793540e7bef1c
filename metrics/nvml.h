// GPU readings through NVML, loaded at run time with dlopen so that batchcast builds and runs on
// machines without the NVIDIA driver (no NVML headers or link-time dependency: the few function
// pointer types used are declared in nvml.cpp).
//
// Contract: Nvml::open() returns an empty optional when the library is missing or nvmlInit
// fails (a machine without GPUs is an expected outcome, not an error) and says why through
// `why_not`. An Nvml owns the dlopen handle and the NVML initialisation (RAII: nvmlShutdown and
// dlclose in the destructor); it is movable, not copyable. read() may be called from one thread
// at a time (the collector's sampler thread); NVML itself is thread-safe.
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
  // One reading per device, index i = NVML device i.
  std::vector<GpuReading> read() const;

 private:
  struct Impl;
  explicit Nvml(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace batchcast::metrics
