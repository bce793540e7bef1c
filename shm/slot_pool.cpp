#include "shm/slot_pool.h"

#include <dirent.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "common/error.h"
#include "common/process.h"

namespace batchcast {
namespace {

// Slots start and end on page boundaries, so that a consumer can re-map one alone.
uint64_t slot_alignment() {
  return std::max<uint64_t>(4096, static_cast<uint64_t>(::sysconf(_SC_PAGESIZE)));
}

uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

std::string user_prefix() { return "batchcast." + std::to_string(::getuid()) + "."; }

}  // namespace

size_t SlotPool::layout_bytes(uint32_t slot_count, uint64_t slot_bytes, uint64_t* slots_offset,
                              bool host_slots) {
  uint64_t offset = align_up(sizeof(PoolHeader) + slot_count * sizeof(uint64_t), slot_alignment());
  if (slots_offset) *slots_offset = offset;
  return offset + (host_slots ? slot_count * slot_bytes : 0);
}

void SlotPool::release_slot_memory(uint32_t slot) {
  if (!host_slots()) return;
  // The whole pages inside the slot only: a page it shares with a neighbour stays.
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t start = reinterpret_cast<uintptr_t>(slot_data(slot));
  const uintptr_t begin = (start + page - 1) / page * page;
  const uintptr_t end = (start + slot_bytes()) / page * page;
  if (end > begin && ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_REMOVE) != 0)
    throw Error("cannot release slot " + std::to_string(slot) + " of /dev/shm/" + segment_name() +
                ": " + std::strerror(errno));
}

SlotPool SlotPool::create(const std::string& segment_name, uint32_t slot_count,
                          uint64_t slot_bytes, bool host_slots) {
  if (slot_count == 0 || slot_bytes == 0) throw Error("a pool needs at least one non-empty slot");
  slot_bytes = align_up(slot_bytes, slot_alignment());
  uint64_t slots_offset = 0;
  size_t bytes = layout_bytes(slot_count, slot_bytes, &slots_offset, host_slots);
  SlotPool pool(SharedSegment::create(segment_name, bytes));
  auto* h = reinterpret_cast<PoolHeader*>(pool.segment_.data());
  h->magic = PoolHeader::kMagic;
  h->version = PoolHeader::kVersion;
  h->owner_pid = static_cast<uint32_t>(::getpid());
  h->slot_count = slot_count;
  h->flags = host_slots ? 0 : PoolHeader::kDeviceSlots;
  h->slot_bytes = slot_bytes;
  h->slots_offset = slots_offset;
  for (uint32_t i = 0; i < slot_count; ++i) pool.set_slot_seq(i, kNoChunk);
  return pool;
}

SlotPool SlotPool::attach(const std::string& segment_name, uint32_t slot_count, uint64_t slot_bytes,
                          uint64_t slots_offset, OnWrite on_write) {
  SlotPool pool(SharedSegment::open(segment_name));
  const auto* h = pool.header();
  auto mismatch = [&](const std::string& what) {
    return Error("shared segment " + segment_name + " does not match the server's welcome (" +
                 what + "); is an older batchcast server still running on this endpoint?");
  };
  if (pool.segment_.size() < sizeof(PoolHeader)) throw mismatch("too small");
  if (h->magic != PoolHeader::kMagic || h->version != PoolHeader::kVersion)
    throw mismatch("bad magic or version");
  if (h->slot_count != slot_count || h->slot_bytes != slot_bytes ||
      h->slots_offset != slots_offset)
    throw mismatch("geometry");
  if (layout_bytes(slot_count, slot_bytes, nullptr, pool.host_slots()) > pool.segment_.size())
    throw mismatch("segment shorter than its slots");
  if (pool.host_slots()) {
    // The server aligned them to the page size, the same on this machine.
    if (slots_offset % slot_alignment() != 0 || slot_bytes % slot_alignment() != 0)
      throw mismatch("slots not aligned to the page size");
    pool.writes_ = SlotWrites(pool.segment_.data() + slots_offset, slot_bytes, slot_count,
                              pool.segment_.fd(), slots_offset, segment_name, on_write);
  }
  return pool;
}

std::string segment_name_for(const std::string& endpoint) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a: stable across runs and builds
  for (unsigned char c : endpoint) h = (h ^ c) * 1099511628211ull;
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(h));
  return user_prefix() + hex;
}

int remove_stale_segments() {
  int removed = 0;
  DIR* dir = ::opendir("/dev/shm");
  if (!dir) return 0;
  const std::string prefix = user_prefix();
  while (dirent* e = ::readdir(dir)) {
    std::string name = e->d_name;
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    PoolHeader h{};
    std::ifstream f("/dev/shm/" + name, std::ios::binary);
    if (!f.read(reinterpret_cast<char*>(&h), sizeof(h))) continue;  // still being created
    if (h.magic != PoolHeader::kMagic) continue;
    if (!process_alive(static_cast<pid_t>(h.owner_pid)) && SharedSegment::remove(name)) ++removed;
  }
  ::closedir(dir);
  return removed;
}

}  // namespace batchcast
