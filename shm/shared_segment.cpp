#include "shm/shared_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/interprocess/mapped_region.hpp>
#include <boost/interprocess/shared_memory_object.hpp>

#include <algorithm>
#include <cstring>

#include "common/error.h"
#include "shm/write_fault.h"

namespace batchcast {
// Boost.Interprocess opens and maps the segment; the two raw calls on its descriptor make the
// mode exact whatever the umask (fchmod) and reserve the memory up front (posix_fallocate).
SharedSegment SharedSegment::create(const std::string& name, size_t bytes) {
  namespace bip = boost::interprocess;
  bip::permissions owner_only(0600);
  try {
    bip::shared_memory_object shm(bip::create_only, name.c_str(), bip::read_write, owner_only);
    int fd = shm.get_mapping_handle().handle;
    ::fchmod(fd, 0600);
    int err = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
    if (err != 0) {
      bip::shared_memory_object::remove(name.c_str());
      throw Error("cannot reserve " + std::to_string(bytes >> 20) +
                  " MiB in /dev/shm for segment " + name + ": " + std::strerror(err) +
                  "; free space in /dev/shm or use a smaller --ring/--batch-size");
    }
    auto region = std::make_unique<bip::mapped_region>(shm, bip::read_write, 0, bytes);
    return SharedSegment(name, std::move(region), /*owner=*/true, /*copy_on_write=*/false);
  } catch (const bip::interprocess_exception& e) {
    if (e.get_error_code() == bip::already_exists_error)
      throw Error("shared segment /dev/shm/" + name +
                  " already exists: another batchcast server is using this endpoint (stop it or "
                  "pick another --endpoint)");
    bip::shared_memory_object::remove(name.c_str());
    throw Error("cannot create shared segment /dev/shm/" + name + ": " + e.what());
  }
}

SharedSegment SharedSegment::open(const std::string& name, Access access) {
  namespace bip = boost::interprocess;
  try {
    bip::shared_memory_object shm(bip::open_only, name.c_str(), bip::read_only);
    bip::offset_t bytes = 0;
    if (!shm.get_size(bytes) || bytes == 0)
      throw Error("shared segment " + name + " is empty (server still starting?)");
    const bool cow = access == Access::kCopyOnWrite;
    // copy_on_write: MAP_PRIVATE, PROT_READ | PROT_WRITE over the read-only descriptor.
    auto region =
        std::make_unique<bip::mapped_region>(shm, cow ? bip::copy_on_write : bip::read_only);
    if (!cow) watch_writes(region->get_address(), region->get_size(), name);
    return SharedSegment(name, std::move(region), /*owner=*/false, cow);
  } catch (const bip::interprocess_exception& e) {
    if (e.get_error_code() == bip::security_error)
      throw Error("cannot open shared segment /dev/shm/" + name +
                  ": permission denied; is another user's server using this endpoint?");
    if (e.get_error_code() == bip::not_found_error)
      throw Error("cannot open shared segment /dev/shm/" + name +
                  ": it does not exist (the server removed it: did it exit?)");
    throw Error("cannot open shared segment /dev/shm/" + name + ": " + e.what());
  }
}

bool SharedSegment::remove(const std::string& name) {
  return boost::interprocess::shared_memory_object::remove(name.c_str());
}

SharedSegment::SharedSegment(std::string name,
                             std::unique_ptr<boost::interprocess::mapped_region> region, bool owner,
                             bool copy_on_write)
    : name_(std::move(name)),
      region_(std::move(region)),
      owner_(owner),
      copy_on_write_(copy_on_write) {}

SharedSegment::SharedSegment(SharedSegment&& o) noexcept
    : name_(std::move(o.name_)),
      region_(std::move(o.region_)),
      owner_(o.owner_),
      copy_on_write_(o.copy_on_write_) {
  o.owner_ = false;
}

SharedSegment& SharedSegment::operator=(SharedSegment&& o) noexcept {
  if (this != &o) {
    reset();
    name_ = std::move(o.name_);
    region_ = std::move(o.region_);
    owner_ = o.owner_;
    copy_on_write_ = o.copy_on_write_;
    o.owner_ = false;
  }
  return *this;
}

SharedSegment::~SharedSegment() { reset(); }

uint8_t* SharedSegment::data() const {
  return region_ ? static_cast<uint8_t*>(region_->get_address()) : nullptr;
}

size_t SharedSegment::size() const { return region_ ? region_->get_size() : 0; }

void SharedSegment::discard_writes(size_t offset, size_t bytes) const noexcept {
  if (!region_ || !copy_on_write_ || offset >= size()) return;
  // On a private file mapping (shmem included) MADV_DONTNEED frees the private copies; the next
  // access faults the file's current page back in. Pages never written only lose their page
  // table entries (read faults map them again, several at a time).
  const auto page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t begin = offset / page * page;
  const size_t end = std::min(size(), offset + bytes);
  (void)::madvise(data() + begin, end - begin, MADV_DONTNEED);
}

void SharedSegment::reset() noexcept {
  if (region_ && !owner_ && !copy_on_write_) unwatch_writes(region_->get_address());
  region_.reset();
  if (owner_) boost::interprocess::shared_memory_object::remove(name_.c_str());
  owner_ = false;
}

}  // namespace batchcast
