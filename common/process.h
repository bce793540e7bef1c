// Process and clock helpers used for liveness checks and metrics. Thread-safe: stateless.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>

namespace batchcast {

// True while `pid` exists and is not a zombie (a killed child that nobody reaped is dead to us).
bool process_alive(pid_t pid);

// Identifies this machine's boot (Linux boot_id), so a peer can tell whether a pid it was given
// lives on the same host and can be checked with process_alive().
std::string host_boot_id();

// Seconds on a monotonic clock.
inline double monotonic_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace batchcast
