#include "metrics/system_series.h"

#include "metrics/collocation.h"
#include "metrics/csv.h"

namespace batchcast::metrics {

SystemSeries::SystemSeries(const SystemSeriesOptions& options) {
  std::string why;
  if (options.gpu) {
    nvml_ = Nvml::open(options.nvml_library, &why);
    if (!nvml_) missing_.push_back(why);
  }
  rapl_ = Rapl::open(options.powercap_root, &why);
  if (!rapl_) missing_.push_back(why);
  header_ = {"time_s", "system/cpu_utilization_percentage", "system/system_memory_usage_megabytes",
             "system/system_memory_usage_percentage"};
  if (rapl_) header_.push_back("system/cpu_energy_joules");
  if (nvml_) {
    const NvmlCapabilities& caps = nvml_->capabilities();
    for (const std::string& m : nvml_->missing()) missing_.push_back(m);
    for (int g = 0; g < gpu_count(); ++g) {
      const std::string p = "system/gpu_" + std::to_string(g) + "_";
      for (const char* s :
           {"utilization_percentage", "memory_usage_megabytes", "memory_usage_percentage",
            "power_usage_watts", "power_usage_percentage"})
        header_.push_back(p + s);
      if (caps.energy) header_.push_back(p + "energy_joules");
      if (caps.gpm) {
        for (const char* s : {"sm_active_percentage", "sm_occupancy_percentage",
                              "tensor_active_percentage", "dram_active_percentage"})
          header_.push_back(p + s);
      }
    }
    gpu_stats_.resize(gpu_count());
  }
  collocation_ = detect_collocation(nvml_ ? &*nvml_ : nullptr);
}

void SystemSeries::read(double now) {
  cpu_now_ = read_system_cpu();
  mem_now_ = read_system_memory();
  if (rapl_) cpu_energy_read_ = rapl_->joules();
  gpu_by_pid_.clear();
  if (!nvml_) return;
  gpus_now_ = nvml_->read(now);
  for (const GpuProcess& p : nvml_->processes()) {
    PidGpuUse& u = gpu_by_pid_[static_cast<pid_t>(p.pid)];
    if (p.sm_percent) u.sm_percent = u.sm_percent.value_or(0) + *p.sm_percent;
    if (p.memory_mb) u.memory_mb = u.memory_mb.value_or(0) + *p.memory_mb;
  }
}

std::vector<std::string> SystemSeries::row(double t) {
  std::optional<double> cpu_util, mem_mb, mem_pct;
  if (cpu_now_ && cpu_prev_ && cpu_now_->total > cpu_prev_->total) {
    cpu_util = 100.0 * (cpu_now_->busy - cpu_prev_->busy) /
               static_cast<double>(cpu_now_->total - cpu_prev_->total);
  }
  if (cpu_now_) cpu_prev_ = cpu_now_;
  if (mem_now_) {
    mem_mb = mem_now_->used_mb;
    if (mem_now_->total_mb > 0) mem_pct = mem_now_->used_mb / mem_now_->total_mb * 100.0;
  }
  cpu_util_.add(cpu_util);
  mem_mb_.add(mem_mb);
  cpu_energy_j_ = cpu_energy_read_;
  std::vector<std::string> out{cell(t), cell(cpu_util, 2), cell(mem_mb, 1), cell(mem_pct, 2)};
  if (rapl_) out.push_back(cell(cpu_energy_j_, 3));
  if (!nvml_) return out;
  const NvmlCapabilities& caps = nvml_->capabilities();
  for (size_t g = 0; g < gpus_now_.size() && g < gpu_stats_.size(); ++g) {
    const GpuReading& r = gpus_now_[g];
    Gpu& s = gpu_stats_[g];
    out.insert(out.end(),
               {cell(r.utilization_percent, 1), cell(r.memory_used_mb, 1),
                cell(r.memory_percent, 2), cell(r.power_watts, 2), cell(r.power_percent, 2)});
    s.util.add(r.utilization_percent);
    s.mem.add(r.memory_used_mb);
    s.power.add(r.power_watts);
    if (r.energy_mj) {
      if (!s.energy_first_mj) s.energy_first_mj = r.energy_mj;
      s.energy_last_mj = r.energy_mj;
    }
    if (caps.energy) {
      std::optional<double> j;
      if (s.energy_first_mj) j = (*s.energy_last_mj - *s.energy_first_mj) / 1000.0;
      out.push_back(cell(j));
    }
    if (caps.gpm) {
      out.insert(out.end(), {cell(r.sm_active_percent, 2), cell(r.sm_occupancy_percent, 2),
                             cell(r.tensor_active_percent, 2), cell(r.dram_active_percent, 2)});
      s.sm_active.add(r.sm_active_percent);
      s.sm_occupancy.add(r.sm_occupancy_percent);
      s.tensor.add(r.tensor_active_percent);
      s.dram.add(r.dram_active_percent);
    }
  }
  return out;
}

std::optional<double> SystemSeries::gpu_energy_j() const {
  std::optional<double> sum;
  for (const Gpu& s : gpu_stats_)
    if (s.energy_first_mj)
      sum = sum.value_or(0) + (*s.energy_last_mj - *s.energy_first_mj) / 1000.0;
  return sum;
}

void SystemSeries::add_summary(nlohmann::json* out) const {
  using nlohmann::json;
  json gpus = json::array();
  double util_sum = 0, sm_sum = 0;
  int util_n = 0, sm_n = 0;
  for (size_t g = 0; g < gpu_stats_.size(); ++g) {
    const Gpu& s = gpu_stats_[g];
    json energy =
        s.energy_first_mj ? json((*s.energy_last_mj - *s.energy_first_mj) / 1000.0) : json(nullptr);
    gpus.push_back({{"index", g},
                    {"name", nvml_->device_names()[g]},
                    {"mean_utilization_percentage", s.util.mean()},
                    {"peak_memory_usage_megabytes", s.mem.max()},
                    {"mean_power_usage_watts", s.power.mean()},
                    {"energy_joules", energy},
                    {"mean_sm_active_percentage", s.sm_active.mean()},
                    {"mean_sm_occupancy_percentage", s.sm_occupancy.mean()},
                    {"mean_tensor_active_percentage", s.tensor.mean()},
                    {"mean_dram_active_percentage", s.dram.mean()}});
    if (s.util.n) util_sum += s.util.sum / s.util.n, ++util_n;
    if (s.sm_active.n) sm_sum += s.sm_active.sum / s.sm_active.n, ++sm_n;
  }
  (*out)["system"] = {{"mean_cpu_utilization_percentage", cpu_util_.mean()},
                      {"peak_system_memory_usage_megabytes", mem_mb_.max()}};
  (*out)["gpus"] = gpus;
  (*out)["mean_gpu_utilization_percentage"] = util_n ? json(util_sum / util_n) : json(nullptr);
  (*out)["mean_sm_active_percentage"] = sm_n ? json(sm_sum / sm_n) : json(nullptr);
}

}  // namespace batchcast::metrics
