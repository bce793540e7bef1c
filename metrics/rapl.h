// CPU package energy from Linux RAPL (powercap): /sys/class/powercap/intel-rapl:N/energy_uj of
// each top-level package zone (subzones such as intel-rapl:0:0 are parts of a package and would
// count twice), summed, with each counter's wraparound at max_energy_range_uj undone.
//
// Contract: Rapl::open() returns an empty optional (with the reason in `why_not`) when no zone
// is readable: recent kernels make energy_uj readable by root only, and VMs have no RAPL; that is
// an expected outcome, so the caller omits CPU energy and says so once. A Rapl is a value owned
// by one thread (the collector's sampler); it is not thread-safe. Nothing here needs root.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace batchcast::metrics {

class Rapl {
 public:
  // `root`: the powercap class directory (tests pass a fake tree).
  static std::optional<Rapl> open(const std::string& root, std::string* why_not);

  // Joules used by all packages since open(). Call at least once per wrap period of a counter
  // (minutes at full power on current CPUs; the sampler calls every tick). A zone that became
  // unreadable keeps its last value.
  double joules();

 private:
  struct Zone {
    std::string energy_path;
    uint64_t max_uj = 0;    // the counter wraps to 0 after this value
    uint64_t last_uj = 0;   // last raw reading
    uint64_t total_uj = 0;  // accumulated since open()
  };
  std::vector<Zone> zones_;
};

}  // namespace batchcast::metrics
