// ProcessAccount: what the collector knows about one watched process (key: role, id, pid) over a
// run: CPU core-seconds, run-queue wait, RSS, GPU use and the owner's counters, each cumulative
// from the first tick that listed it (or from the process's start when the owner says so), and
// the cells of its processes.csv rows.
//
// Contract: a value type updated once per tick by the collector's sampler and read by summary();
// not thread-safe (the collector guards it with its data lock). It owns nothing outside itself.
#pragma once

#include <sys/types.h>

#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "metrics/collector.h"
#include "metrics/proc_stats.h"
#include "metrics/series_stat.h"

namespace batchcast::metrics {

// GPU use of one pid at one tick (summed over GPUs), from NVML's process lists.
struct PidGpuUse {
  std::optional<double> sm_percent;
  std::optional<double> memory_mb;
};

class ProcessAccount {
 public:
  // The processes.csv header, in the order of update()'s cells.
  static const std::vector<std::string>& csv_header();

  // Records one tick at `t` (seconds since the collector started) for `p`. `usage` is its tree
  // now (nullopt: not in /proc); run-queue wait is read here for the tree's members. A rate cell
  // stays empty over a span shorter than `rates.min_span`, and a CPU rate also where the CPU
  // that arrived in the span is more than `rates.cores` could have spent in it (CPU the ticks
  // never saw running, such as a process reaped between them, is a total, not a rate). Returns
  // the processes.csv row.
  struct RateLimits {
    double min_span = 0;  // seconds
    double cores = 1;     // the machine's online CPUs
  };
  std::vector<std::string> update(double t, const MetricsSnapshot::Process& p,
                                  const std::optional<TreeUsage>& usage,
                                  const std::map<pid_t, PidGpuUse>& gpu, const RateLimits& rates);

  const std::string& role() const { return role_; }
  double cpu_s() const { return cpu_rel_; }
  double run_wait_s() const { return wait_total(); }
  uint64_t samples() const { return samples_; }
  double wait_s() const { return wait_; }
  double tree_rss_mb_now() const { return last_tree_rss_mb_; }
  nlohmann::json to_json() const;

 private:
  double wait_total() const;

  std::string role_, id_;
  pid_t pid_ = 0;
  bool seen_ = false;
  double first_t_ = 0, last_t_ = 0;
  // CPU: core-seconds, clamped to never decrease (see README: a descendant read just after its
  // parent reaped it can make one reading dip).
  bool cpu_seen_ = false;
  bool cpu_exact_ = false;  // cpu_rel_ is the owner's exact total (wait4), not a /proc reading
  uint64_t starttime_ = 0;
  double cpu_base_ = 0, cpu_carried_ = 0, cpu_rel_ = 0, prev_cpu_t_ = 0;
  // Run-queue wait: the last reading of each member pid (kept after it exits, so the wait of a
  // finished worker is not lost), minus the sum at first sight.
  std::map<pid_t, double> run_wait_by_pid_;
  double run_wait_carried_ = 0, run_wait_base_ = 0;
  Stat rss_mb_, tree_rss_mb_, gpu_sm_, gpu_mem_;
  double last_tree_rss_mb_ = 0;
  int max_procs_ = 0;
  uint64_t samples_base_ = 0, samples_ = 0;
  double wait_base_ = 0, wait_ = 0;
};

}  // namespace batchcast::metrics
