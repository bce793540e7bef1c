#include "server/serve/ring_size.h"

#include <sys/statvfs.h>

#include <algorithm>
#include <fstream>
#include <string>

namespace batchcast {

HostMemory read_host_memory() {
  HostMemory host;
  std::ifstream meminfo("/proc/meminfo");
  std::string key, unit;
  uint64_t kib = 0;
  while (meminfo >> key >> kib) {
    std::getline(meminfo, unit);
    if (key == "MemAvailable:") {
      host.available = kib * 1024;
      break;
    }
  }
  struct statvfs fs {};
  if (::statvfs("/dev/shm", &fs) == 0) host.shm_free = uint64_t{fs.f_bavail} * fs.f_frsize;
  return host;
}

uint64_t default_ring_memory(const HostMemory& host) {
  uint64_t budget = kMaxRingMemory;
  if (host.available) budget = std::min(budget, host.available / 16);
  if (host.shm_free) budget = std::min(budget, host.shm_free / 4);
  return budget;
}

uint64_t default_cache_memory(const HostMemory& host) {
  uint64_t budget = 0;
  if (host.available) budget = host.available / 2;
  if (host.shm_free) budget = budget ? std::min(budget, host.shm_free / 2) : host.shm_free / 2;
  return budget ? budget : uint64_t{1} << 30;
}

uint32_t ring_slots_for(uint64_t budget, uint64_t bytes_per_slot, uint64_t epoch_chunks) {
  uint64_t slots = bytes_per_slot ? budget / bytes_per_slot : kMaxRingSlots;
  slots = std::clamp<uint64_t>(slots, kMinRingSlots, kMaxRingSlots);
  if (epoch_chunks) slots = std::min(slots, epoch_chunks + kRingLeadChunks);
  return static_cast<uint32_t>(slots);
}

}  // namespace batchcast
