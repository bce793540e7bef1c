// SharedSegment: one POSIX shared-memory segment, mapped into this process.
//
// Ownership and lifetime: the process that create()s a segment owns it; the owner's destructor
// unmaps and unlinks it (so a clean exit, SIGINT or SIGTERM handled by the server leaves
// nothing in /dev/shm). open() maps an existing segment without owning it: the mapping stays
// valid after the owner unlinks the name, until the opener is destroyed. Segments are created
// mode 0600, so other users can neither read nor map them. A segment left by a crashed owner is
// removed by remove_stale_segments() at the next server start.
//
// Openers (consumers) map it shared and read-only: reads see the owner's bytes as the owner
// writes them, at no cost beyond the owner's own pages. They keep its descriptor open (fd()), so
// that ranges of the mapping can be re-mapped from it: shm/write_fault.h re-maps a slot
// copy-on-write when the consumer writes into it, and shared again once it is done with it.
//
// Thread-safety: the object is move-only and not synchronised; the memory it maps is shared and
// its users synchronise through the pool header (shm/slot_pool.h) and the protocol.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace boost::interprocess {
class mapped_region;
class shared_memory_object;
}

namespace batchcast {

class SharedSegment {
 public:
  // Creates `name` (a POSIX shm name without the leading '/') of `bytes` bytes, reserving the
  // memory up front so that a full /dev/shm fails here, not with SIGBUS later.
  // Throws Error if the name exists or the memory cannot be had; the message names the fix.
  static SharedSegment create(const std::string& name, size_t bytes);
  // Maps an existing segment shared and read-only. Throws Error naming the segment.
  static SharedSegment open(const std::string& name);
  // Unlinks `name`; false if it did not exist.
  static bool remove(const std::string& name);

  SharedSegment(SharedSegment&&) noexcept;
  SharedSegment& operator=(SharedSegment&&) noexcept;
  SharedSegment(const SharedSegment&) = delete;
  SharedSegment& operator=(const SharedSegment&) = delete;
  ~SharedSegment();

  uint8_t* data() const;
  size_t size() const;
  const std::string& name() const { return name_; }
  bool owner() const { return owner_; }
  // The segment's descriptor (read-only for openers), open as long as this object.
  int fd() const;

 private:
  SharedSegment(std::string name, std::unique_ptr<boost::interprocess::shared_memory_object> file,
                std::unique_ptr<boost::interprocess::mapped_region> region, bool owner);
  void reset() noexcept;

  std::string name_;
  std::unique_ptr<boost::interprocess::shared_memory_object> file_;
  std::unique_ptr<boost::interprocess::mapped_region> region_;
  bool owner_ = false;
};

}  // namespace batchcast
