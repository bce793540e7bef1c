#include "metrics/process_tracker.h"

#include <unistd.h>

#include <cmath>

namespace batchcast {

ProcessTracker::ProcessTracker(CollectorOptions options, std::string role, std::string id,
                               bool since_start)
    : role_(std::move(role)),
      id_(std::move(id)),
      pid_(::getpid()),
      since_start_(since_start),
      collector_(std::move(options), [this] { return snapshot(); }) {
  if (id_.empty()) id_ = std::to_string(pid_);
}

void ProcessTracker::add_wait(double seconds) {
  if (!(seconds > 0)) return;  // negative or NaN from a clock hiccup: ignore
  wait_ns_.fetch_add(static_cast<uint64_t>(std::llround(seconds * 1e9)), std::memory_order_relaxed);
}

double ProcessTracker::wait_s() const {
  return static_cast<double>(wait_ns_.load(std::memory_order_relaxed)) * 1e-9;
}

MetricsSnapshot ProcessTracker::snapshot() const {
  MetricsSnapshot s;
  MetricsSnapshot::Process p;
  p.role = role_;
  p.id = id_;
  p.pid = pid_;
  p.samples = samples();
  p.wait_s = wait_s();
  p.since_start = since_start_;
  s.processes.push_back(std::move(p));
  return s;
}

}  // namespace batchcast
