// The built-in radT-style metrics collector: one sampler thread that, every `interval_s`, asks
// its owner for a MetricsSnapshot (which processes to watch, cumulative counters), reads /proc,
// NVML and RAPL, and appends one row per process to CSV time series in a run directory; stop()
// writes summary.json (also refreshed every few ticks, so a killed run still leaves one).
// metrics/README.md documents the files and columns.
//
// CPU accounting for a watched pid: utime+stime of the process (all threads) + cutime+cstime
// (children it has reaped) + the same for each of its live descendants (e.g. DataLoader
// workers), found by walking the ppid tree of /proc/*/stat. A descendant that is itself watched
// is charged to itself only. Figures are deltas from the first tick at which the collector saw
// the process, so CPU and samples cover the same span, unless the owner asks for counting from
// the process's start (Process::since_start: `batchcast track` for its command, a server for
// itself). A CPU rate is never given over a span where more CPU arrived than the machine's
// cores could spend in it. Run-queue wait (schedstat), GPU SM % and GPU memory are summed over the same tree.
//
// Thread-safety: start(), stop() and summary() may be called from any thread, concurrently.
// The `source` callback is called on the ticking thread only (the sampler thread, or the caller
// of start(), tick() and stop() without one; once per tick, first at start(), last at stop()),
// never while an internal lock is held, so it may take other locks (e.g. the Python GIL). Lifetime:
// the collector owns its thread, its files and the NVML handle; the destructor stops it. `source`
// must stay callable until stop() returns.
//
// The seam (CollectorEnv), as StreamState's injected clock: the clock that stamps rows, the
// /proc process scan, and who drives the ticks. Production uses the defaults (the monotonic
// clock, /proc, a sampler thread); tests drive ticks with tick() on a clock of their own.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "metrics/proc_stats.h"

namespace batchcast {

// What the owner reports at each tick. A process's samples and wait_s are counted whole: the
// owner reports them from zero (the start of what it wants counted), so what a process consumed
// before the collector first listed it is not lost. CPU is counted from first sight (or from the
// process's start, since_start).
struct MetricsSnapshot {
  double producer_blocked_s = 0;  // producer time blocked on a full ring, up to now
  int64_t ring_used = 0;          // ring slots holding data now
  int64_t ring_size = 0;          // ring slots in all (0: no ring, e.g. a trainer's own tracker)
  // Samples the producer decoded up to now (the stream's, regenerated and relaxed readers'
  // chunks), beside what the consumers consumed; none where the owner does not know.
  std::optional<uint64_t> samples_decoded;
  // The decoded cache's counters up to now (server/produce/decoded_cache.h); none without a cache.
  struct Cache {
    uint64_t hits = 0;      // samples made from a cached image
    uint64_t misses = 0;    // samples decoded from their file
    uint64_t images = 0;    // images cached
    uint64_t bytes = 0;     // bytes they take
    uint64_t capacity = 0;  // the cache's budget in bytes
  };
  std::optional<Cache> cache;
  struct Process {
    std::string role;      // "server", "consumer" or "trainer" (others are counted in "all" only)
    std::string id;        // the owner's name for it (consumer id); may be empty
    pid_t pid = 0;         // on this host; a pid not found in /proc gets empty CPU/RSS cells
    uint64_t samples = 0;  // samples consumed (consumers/trainers)
    double wait_s = 0;     // time spent waiting for data (consumers/trainers)
    // Count CPU, run-queue wait and the counters from the process's start (zero) instead of
    // from first sight: for a process the owner launched itself, so nothing it did before the
    // first tick is lost.
    bool since_start = false;
    // With since_start: exact CPU core-seconds since the start, when the owner knows them (the
    // rusage of wait4() once the process has exited: it and every descendant it reaped). It
    // replaces the /proc reading: nothing after the last tick is lost, and descendants that
    // outlived the process (still running, so not in the kernel's total) are not counted here.
    std::optional<double> exact_cpu_s = std::nullopt;
  };
  // Keep a process listed until it has finished: the collector reads its CPU only while it is.
  std::vector<Process> processes;
  // Why the counts are not final yet ("" when they are: every process counted has finished).
  // At stop(), a reason marks summary.json "complete": false and is written as
  // "incomplete_reason" (e.g. consumers still reading when the server was stopped).
  std::string incomplete;
};

struct CollectorOptions {
  // Run directory for the CSVs and summary.json. Required. Created (with parents) if missing;
  // existing files of the same names are overwritten, so use one directory per run.
  std::string dir;
  // Seconds between ticks. Default 1 s, as radT and MLflow system metrics: fine enough for
  // epochs of minutes, and one tick costs a few ms of CPU. Must be > 0.
  double interval_s = 1.0;
  // Name shown in summary.json and in reports. Default "": the last component of `dir`.
  std::string run_name;
  // Read GPU utilisation, memory and power through NVML. Default true: the library is loaded
  // only if present, so the only reason to turn this off is to skip NVML's start-up cost.
  bool gpu = true;
  // What to dlopen for NVML. Default the driver's soname, which the NVIDIA driver installs in
  // the loader path; a path here serves unusual installs and tests (a fake NVML).
  std::string nvml_library = "libnvidia-ml.so.1";
  // Where RAPL's powercap zones are (CPU energy). Default the kernel's; tests pass a fake tree.
  std::string powercap_root = "/sys/class/powercap";
  // Rewrite summary.json (marked "complete": false) every this many ticks, so a run that is
  // killed still has totals. Default 10: a small JSON file every 10 s. 0 = only at stop().
  int summary_every_ticks = 10;
};

// What the collector reads of the world besides the owner's snapshot and the system series.
struct CollectorEnv {
  // Seconds on a monotonic clock; rows are stamped with now() minus its value at start().
  std::function<double()> now;  // empty: common/process.h monotonic_seconds
  // The machine's processes at this tick (CPU and RSS of each watched tree).
  std::function<metrics::ProcessTable()> scan_processes;  // empty: ProcessTable::scan
  // True: a sampler thread ticks every interval_s. False: no thread; start() and stop() take
  // their ticks on the caller's thread, and the owner takes the others with tick().
  bool sampler_thread = true;
};

class MetricsCollector {
 public:
  // Creates `dir`, opens the CSV files and writes their headers, and loads NVML. Throws
  // batchcast::Error naming the directory or file (and what to do) if it cannot.
  MetricsCollector(CollectorOptions options, std::function<MetricsSnapshot()> source,
                   CollectorEnv env = {});
  ~MetricsCollector();  // stop(), errors logged
  MetricsCollector(const MetricsCollector&) = delete;
  MetricsCollector& operator=(const MetricsCollector&) = delete;

  // Starts the sampler thread and returns once the first tick (t = 0, the baseline) is taken.
  // No-op while running; throws batchcast::Error after stop() (a run cannot be resumed).
  void start();
  // Takes a final tick, joins the thread, writes summary.json. Idempotent; no-op before start().
  // Throws batchcast::Error if summary.json (or a CSV) could not be written.
  void stop();
  // Takes one tick now, on the caller's thread. Only without a sampler thread
  // (CollectorEnv::sampler_thread false) and while running; throws batchcast::Error otherwise.
  void tick();
  // The totals summary.json holds (current ones while running). See metrics/README.md.
  nlohmann::json summary() const;
  // True when NVML was loaded and reports at least one GPU.
  bool has_gpu() const;
  // The collocation mode detected at construction (metrics/collocation.h).
  const std::string& collocation() const;
  const CollectorOptions& options() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace batchcast
