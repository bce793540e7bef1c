#include "metrics/process_account.h"

#include <algorithm>

#include "metrics/csv.h"

namespace batchcast::metrics {
namespace {

double per(double num, double den) { return den > 0 ? num / den : 0.0; }

}  // namespace

const std::vector<std::string>& ProcessAccount::csv_header() {
  static const std::vector<std::string> header{"time_s",
                                               "role",
                                               "id",
                                               "pid",
                                               "cpu_s",
                                               "cpu_percent",
                                               "rss_mb",
                                               "tree_rss_mb",
                                               "procs",
                                               "samples",
                                               "samples_per_s",
                                               "wait_s",
                                               "run_queue_wait_s",
                                               "gpu_sm_percent",
                                               "gpu_memory_mb"};
  return header;
}

double ProcessAccount::wait_total() const {
  double sum = run_wait_carried_;
  for (const auto& [pid, w] : run_wait_by_pid_) sum += w;
  return std::max(0.0, sum - run_wait_base_);
}

std::vector<std::string> ProcessAccount::update(double t, const MetricsSnapshot::Process& p,
                                                const std::optional<TreeUsage>& usage,
                                                const std::map<pid_t, PidGpuUse>& gpu,
                                                const RateLimits& rates) {
  const double min_span = rates.min_span;
  const bool fresh = !seen_;
  if (fresh) {
    seen_ = true;
    role_ = p.role;
    id_ = p.id;
    pid_ = p.pid;
    first_t_ = t;
  }
  const double prev_t = last_t_;
  last_t_ = t;
  // Counters: a counter that went backwards (owner restarted it) is rebased.
  if (p.samples < samples_base_ + samples_) samples_base_ = p.samples - samples_;
  const uint64_t prev_samples = samples_;
  samples_ = p.samples - samples_base_;
  if (p.wait_s < wait_base_ + wait_) wait_base_ = p.wait_s - wait_;
  wait_ = p.wait_s - wait_base_;

  std::optional<double> cpu_s, cpu_pct, rss, tree_rss, run_wait, sm, gmem;
  int procs = 0;
  const double prev_cpu = cpu_rel_;
  if (usage) {
    if (!cpu_seen_) {
      cpu_seen_ = true;
      starttime_ = usage->starttime;
      cpu_base_ = p.since_start ? 0.0 : usage->cpu_s;
      prev_cpu_t_ = t;
    } else if (usage->starttime != starttime_) {  // the pid now names another process
      cpu_carried_ = cpu_rel_;
      starttime_ = usage->starttime;
      cpu_base_ = usage->cpu_s;
    }
    cpu_rel_ = std::max(cpu_rel_, cpu_carried_ + usage->cpu_s - cpu_base_);
    for (pid_t m : usage->members) {
      if (auto w = read_run_queue_wait(m)) {
        double& last = run_wait_by_pid_[m];
        if (*w < last) run_wait_carried_ += last;  // a reused pid: keep what the old one waited
        last = *w;
      }
      if (auto g = gpu.find(m); g != gpu.end()) {
        if (g->second.sm_percent) sm = sm.value_or(0) + *g->second.sm_percent;
        if (g->second.memory_mb) gmem = gmem.value_or(0) + *g->second.memory_mb;
      }
    }
    if (fresh && !p.since_start) run_wait_base_ = wait_total();
    run_wait = wait_total();
    rss = usage->rss_bytes / 1e6;
    tree_rss = usage->tree_rss_bytes / 1e6;
    rss_mb_.add(rss);
    tree_rss_mb_.add(tree_rss);
    gpu_sm_.add(sm);
    gpu_mem_.add(gmem);
    max_procs_ = std::max(max_procs_, usage->procs);
    procs = usage->procs;
  }
  last_tree_rss_mb_ = tree_rss.value_or(0);
  if (p.since_start && p.exact_cpu_s) {
    // The kernel's total for the process and the descendants it reaped: it replaces the /proc
    // readings, which may have included descendants that left the tree still running (they
    // are not part of this total, and are accounted where they ran).
    cpu_seen_ = true;
    cpu_exact_ = true;
    cpu_rel_ = *p.exact_cpu_s;
  }
  if (cpu_seen_) {
    cpu_s = cpu_rel_;
    const double span = t - prev_cpu_t_, delta = cpu_rel_ - prev_cpu;
    // /proc counts each process's CPU in clock ticks: allow one per process summed.
    const double quantum = 0.01 * std::max(1, procs);
    if (!fresh && span >= min_span && delta >= 0 && delta <= rates.cores * span + quantum)
      cpu_pct = delta / span * 100.0;
    if (usage || p.exact_cpu_s) prev_cpu_t_ = t;
  }
  std::optional<double> sps;
  if (!fresh && t - prev_t >= min_span) sps = (samples_ - prev_samples) / (t - prev_t);
  return {cell(t),
          p.role,
          p.id,
          std::to_string(p.pid),
          cell(cpu_s),
          cell(cpu_pct, 1),
          cell(rss, 1),
          cell(tree_rss, 1),
          usage ? std::to_string(procs) : "",
          std::to_string(samples_),
          cell(sps, 2),
          cell(wait_),
          cell(run_wait),
          cell(sm, 1),
          cell(gmem, 1)};
}

nlohmann::json ProcessAccount::to_json() const {
  using nlohmann::json;
  const double span = last_t_ - first_t_;
  return {{"role", role_},
          {"id", id_},
          {"pid", pid_},
          {"first_s", first_t_},
          {"last_s", last_t_},
          {"cpu_core_s", cpu_seen_ ? json(cpu_rel_) : json(nullptr)},
          {"cpu_exact", cpu_exact_},
          {"mean_cpu_percent", cpu_seen_ ? json(per(cpu_rel_, span) * 100) : json(nullptr)},
          {"run_queue_wait_s", cpu_seen_ ? json(wait_total()) : json(nullptr)},
          {"peak_rss_mb", rss_mb_.max()},
          {"peak_tree_rss_mb", tree_rss_mb_.max()},
          {"max_procs", max_procs_},
          {"mean_gpu_sm_percent", gpu_sm_.mean()},
          {"peak_gpu_memory_mb", gpu_mem_.max()},
          {"samples", samples_},
          {"samples_per_s", per(static_cast<double>(samples_), span)},
          {"wait_s", wait_},
          {"cpu_core_s_per_sample",
           samples_ ? json(cpu_rel_ / static_cast<double>(samples_)) : json(nullptr)}};
}

}  // namespace batchcast::metrics
