// SystemSeries: the machine-wide part of a collector's tick, the row of system.csv: CPU and
// memory of the machine, per GPU utilisation, memory, power, energy and (Hopper) GPM activity,
// CPU package energy from RAPL, and the per-pid GPU use that process rows need. Column names
// follow MLflow's system metrics ("system/..."); metrics/README.md lists them.
//
// A metric this machine cannot give has no column (not an empty one) and is named once in
// missing() (the collector logs it once per process and writes it into summary.json).
//
// Contract: owned by one collector. read() runs on its sampler thread without the collector's
// data lock and touches only what row() folds in; row(), add_summary() and the energy getters
// run under that lock. Not thread-safe by itself. It owns the NVML handle.
#pragma once

#include <sys/types.h>

#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "metrics/nvml.h"
#include "metrics/proc_stats.h"
#include "metrics/process_account.h"
#include "metrics/rapl.h"
#include "metrics/series_stat.h"

namespace batchcast::metrics {

struct SystemSeriesOptions {
  bool gpu = true;
  std::string nvml_library;
  std::string powercap_root = "/sys/class/powercap";
};

class SystemSeries {
 public:
  explicit SystemSeries(const SystemSeriesOptions& options);

  const std::vector<std::string>& csv_header() const { return header_; }
  int gpu_count() const { return nvml_ ? nvml_->device_count() : 0; }
  const std::vector<std::string>& missing() const { return missing_; }
  const std::string& collocation() const { return collocation_; }

  // Reads the machine (no lock needed): call first in a tick. `now`: the collector's clock.
  void read(double now);
  // GPU use per pid from the last read(), summed over GPUs.
  const std::map<pid_t, PidGpuUse>& gpu_by_pid() const { return gpu_by_pid_; }
  // Folds the last read() into the statistics and returns the system.csv row at `t`.
  std::vector<std::string> row(double t);

  // Energy since the first tick, joules (nullopt: not measurable here).
  std::optional<double> gpu_energy_j() const;
  std::optional<double> cpu_energy_j() const { return cpu_energy_j_; }
  // "system", "gpus", "mean_gpu_utilization_percentage", "mean_sm_active_percentage".
  void add_summary(nlohmann::json* out) const;

 private:
  std::optional<Nvml> nvml_;
  std::optional<Rapl> rapl_;
  std::vector<std::string> header_, missing_;
  std::string collocation_;
  // The last read().
  std::optional<SystemCpuTimes> cpu_now_, cpu_prev_;
  std::optional<SystemMemory> mem_now_;
  std::vector<GpuReading> gpus_now_;
  std::map<pid_t, PidGpuUse> gpu_by_pid_;
  std::optional<double> cpu_energy_read_;
  // Folded in by row(), under the collector's lock, as everything add_summary() reads.
  std::optional<double> cpu_energy_j_;
  // Per GPU: statistics and the energy counter at the first tick.
  struct Gpu {
    Stat util, mem, power, sm_active, sm_occupancy, tensor, dram;
    std::optional<double> energy_first_mj, energy_last_mj;
  };
  std::vector<Gpu> gpu_stats_;
  Stat cpu_util_, mem_mb_;
};

}  // namespace batchcast::metrics
