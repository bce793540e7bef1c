// Process and clock helpers used for liveness checks and metrics. Thread-safe: stateless.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>

namespace batchcast {

// True while `pid` exists and is not a zombie (a killed child that nobody reaped is dead to us).
bool process_alive(pid_t pid);

// "<boot_id>/<pid namespace>": identifies this machine's boot (Linux boot_id) and this
// process's pid namespace. Peers with the same boot share memory (same_host); peers with the
// same whole id can also check each other's pids with process_alive(). Containers that share
// /dev/shm but not their pid namespace are on one host yet must use heartbeats.
std::string host_boot_id();
bool same_host(const std::string& boot_id_a, const std::string& boot_id_b);

// Seconds on a monotonic clock.
inline double monotonic_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace batchcast
