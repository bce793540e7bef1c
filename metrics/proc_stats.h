// Readers of Linux /proc for the metrics collector: per-process CPU times and RSS, the parent
// tree (so a process is charged for its live descendants, e.g. DataLoader workers), run-queue
// wait (schedstat), system CPU and system memory.
//
// Contract: plain functions and value types; thread-safe (no shared state). A process that
// vanishes between listing /proc and reading its stat file is simply absent from the result:
// processes come and go, so that is an expected outcome, never an error. Everything is read
// with open/read on a stack buffer (no iostreams) because a tick reads every /proc/<pid>/stat
// on the machine and the sampler must stay under 1% of a core.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace batchcast::metrics {

// The fields of /proc/<pid>/stat that the collector uses (proc(5)); times are in seconds.
struct ProcStat {
  pid_t pid = 0;
  pid_t ppid = 0;
  char state = '?';
  double utime_s = 0, stime_s = 0;    // this process, all its threads (live and exited)
  double cutime_s = 0, cstime_s = 0;  // its children that it has waited for (reaped)
  uint64_t starttime = 0;             // clock ticks after boot; tells a reused pid apart
  int64_t rss_bytes = 0;

  // utime+stime+cutime+cstime: what this process and its reaped children have used.
  double cpu_s() const { return utime_s + stime_s + cutime_s + cstime_s; }
};

// Parses the text of a /proc/<pid>/stat file (exposed for tests). nullopt if malformed.
std::optional<ProcStat> parse_proc_stat(const char* text, size_t len);

// Reads /proc/<pid>/stat; nullopt if the process does not exist (or is unreadable).
std::optional<ProcStat> read_proc_stat(pid_t pid);

// What one process and its live descendants use at one instant.
struct TreeUsage {
  double cpu_s = 0;            // sum of ProcStat::cpu_s() over the process and its descendants
  int64_t rss_bytes = 0;       // the process alone
  int64_t tree_rss_bytes = 0;  // the process plus its descendants (shared pages count twice)
  int procs = 0;               // processes summed (1 + live descendants)
  uint64_t starttime = 0;      // of the root process
  std::vector<pid_t> members;  // the root and the descendants summed (for per-pid readings)
};

// A snapshot of every process on the machine, indexed by pid and by parent.
class ProcessTable {
 public:
  // Scans /proc once (all numeric entries).
  static ProcessTable scan();
  // For tests and callers that already have the stats.
  explicit ProcessTable(std::vector<ProcStat> stats);
  ProcessTable() = default;

  // Usage of `root` and its live descendants. Descendants listed in `stop_at` (other tracked
  // processes) and their subtrees are left out so that no CPU second is charged twice.
  // nullopt if `root` is not in the table (gone, or on another host).
  std::optional<TreeUsage> tree_usage(pid_t root, const std::unordered_set<pid_t>& stop_at) const;

  size_t size() const { return stats_.size(); }

 private:
  std::vector<ProcStat> stats_;
  std::unordered_map<pid_t, size_t> by_pid_;
  std::unordered_multimap<pid_t, size_t> by_parent_;
};

// Run-queue wait of one task: the second field of a schedstat file (nanoseconds spent runnable
// but waiting for a CPU), in seconds. nullopt if malformed. Exposed for tests.
std::optional<double> parse_schedstat_wait(const char* text);

// Run-queue wait of a process: the sum over its live threads (/proc/<pid>/task/*/schedstat;
// /proc/<pid>/schedstat alone is the main thread). Threads that have exited are not counted:
// the kernel keeps no per-process total. nullopt if the process is gone or schedstat is absent
// (a kernel without CONFIG_SCHED_INFO).
std::optional<double> read_run_queue_wait(pid_t pid);

// Aggregate CPU time of the machine from the first line of /proc/stat, in clock ticks.
struct SystemCpuTimes {
  uint64_t busy = 0;   // total - idle - iowait
  uint64_t total = 0;  // every column
};
std::optional<SystemCpuTimes> read_system_cpu();

// /proc/meminfo: used = MemTotal - MemAvailable, as MLflow (psutil) reports it.
struct SystemMemory {
  double total_mb = 0;
  double used_mb = 0;
};
std::optional<SystemMemory> read_system_memory();

// CPU time of the calling thread (CLOCK_THREAD_CPUTIME_ID), seconds: the sampler's own cost.
double thread_cpu_seconds();

}  // namespace batchcast::metrics
