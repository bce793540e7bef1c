// SharedSegment: one POSIX shared-memory segment, mapped into this process.
//
// Ownership and lifetime: the process that create()s a segment owns it; the owner's destructor
// unmaps and unlinks it (so a clean exit, SIGINT or SIGTERM handled by the server leaves
// nothing in /dev/shm). open() maps an existing segment without owning it: the mapping stays
// valid after the owner unlinks the name, until the opener is destroyed. Segments are created
// mode 0600, so other users can neither read nor map them. A segment left by a crashed owner is
// removed by remove_stale_segments() at the next server start.
//
// Openers map the segment one of two ways (Access):
// - kCopyOnWrite (consumers): MAP_PRIVATE. Reads see the owner's bytes as the owner writes them;
//   a write gives the writer a private copy of each page it touches, which the owner and every
//   other opener never see. A page copied stays private (and stale) until discard_writes() drops
//   the copies of its range: the next reads there see the owner's bytes again.
// - kReadOnly (a mapping page-locked for DMA: page-locking a private mapping may copy every
//   page, which would freeze this opener's view): MAP_SHARED, PROT_READ; a write kills the process
//   (SIGSEGV), after a message naming the segment and the fix (shm/write_fault.h).
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
}

namespace batchcast {

class SharedSegment {
 public:
  // Creates `name` (a POSIX shm name without the leading '/') of `bytes` bytes, reserving the
  // memory up front so that a full /dev/shm fails here, not with SIGBUS later.
  // Throws Error if the name exists or the memory cannot be had; the message names the fix.
  static SharedSegment create(const std::string& name, size_t bytes);
  enum class Access { kCopyOnWrite, kReadOnly };
  // Maps an existing segment (see Access). Throws Error naming the segment.
  static SharedSegment open(const std::string& name, Access access);
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
  // kCopyOnWrite openers: drops this process's private copies of the pages overlapping
  // [offset, offset + bytes), so that reads there see the owner's bytes again. No pointer into
  // the range may be in use meanwhile (its pages change under it). No-op for other mappings.
  void discard_writes(size_t offset, size_t bytes) const noexcept;

 private:
  SharedSegment(std::string name, std::unique_ptr<boost::interprocess::mapped_region> region,
                bool owner, bool copy_on_write);
  void reset() noexcept;

  std::string name_;
  std::unique_ptr<boost::interprocess::mapped_region> region_;
  bool owner_ = false;
  bool copy_on_write_ = false;
};

}  // namespace batchcast
