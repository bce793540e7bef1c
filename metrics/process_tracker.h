// ProcessTracker: a MetricsCollector that watches the calling process (and, through the
// collector's tree walk, its live children such as DataLoader workers) under one role, with
// counters the process feeds itself. It is what a training process that runs its own DataLoader
// uses to record a baseline in the same format as the server's collector (Python:
// batchcast.tools.metrics.track()).
//
// Thread-safety: add_samples()/add_wait() are lock-free (atomics) and may be called from any
// thread at any rate; start()/stop()/summary() as MetricsCollector. Lifetime: owns its collector;
// the destructor stops it.
#pragma once

#include <atomic>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "metrics/collector.h"

namespace batchcast {

class ProcessTracker {
 public:
  // `role`: "trainer" (default in Python) or "consumer"/"server"; `id`: free text, default "" =
  // the pid. `since_start`: count this process's CPU from its start (a server's start-up is
  // its cost) instead of from the first tick (a trainer's own start-up is not data loading).
  // Throws batchcast::Error as MetricsCollector's constructor.
  ProcessTracker(CollectorOptions options, std::string role, std::string id = "",
                 bool since_start = false);

  void add_samples(uint64_t n) { samples_.fetch_add(n, std::memory_order_relaxed); }
  void add_wait(double seconds);

  void start() { collector_.start(); }
  void stop() { collector_.stop(); }
  nlohmann::json summary() const { return collector_.summary(); }
  uint64_t samples() const { return samples_.load(std::memory_order_relaxed); }
  double wait_s() const;
  const MetricsCollector& collector() const { return collector_; }

 private:
  MetricsSnapshot snapshot() const;

  std::string role_, id_;
  pid_t pid_;
  bool since_start_;
  std::atomic<uint64_t> samples_{0};
  std::atomic<uint64_t> wait_ns_{0};  // integer so that fetch_add is lock-free
  MetricsCollector collector_;        // last: its thread reads the members above
};

}  // namespace batchcast
