#include "shm/shared_segment.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/interprocess/mapped_region.hpp>
#include <boost/interprocess/shared_memory_object.hpp>

#include <cstring>

#include "common/error.h"

namespace batchcast {
// Boost.Interprocess opens and maps the segment; the two raw calls on its descriptor make the
// mode exact whatever the umask (fchmod) and reserve the memory up front (posix_fallocate).
SharedSegment SharedSegment::create(const std::string& name, size_t bytes) {
  namespace bip = boost::interprocess;
  bip::permissions owner_only(0600);
  try {
    auto shm = std::make_unique<bip::shared_memory_object>(bip::create_only, name.c_str(),
                                                           bip::read_write, owner_only);
    int fd = shm->get_mapping_handle().handle;
    ::fchmod(fd, 0600);
    int err = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
    if (err != 0) {
      bip::shared_memory_object::remove(name.c_str());
      throw Error("cannot reserve " + std::to_string(bytes >> 20) +
                  " MiB in /dev/shm for segment " + name + ": " + std::strerror(err) +
                  "; free space in /dev/shm or use a smaller --ring/--batch-size");
    }
    auto region = std::make_unique<bip::mapped_region>(*shm, bip::read_write, 0, bytes);
    return SharedSegment(name, std::move(shm), std::move(region), /*owner=*/true);
  } catch (const bip::interprocess_exception& e) {
    if (e.get_error_code() == bip::already_exists_error)
      throw Error("shared segment /dev/shm/" + name +
                  " already exists: another batchcast server is using this endpoint (stop it or "
                  "pick another --endpoint)");
    bip::shared_memory_object::remove(name.c_str());
    throw Error("cannot create shared segment /dev/shm/" + name + ": " + e.what());
  }
}

SharedSegment SharedSegment::open(const std::string& name) {
  namespace bip = boost::interprocess;
  try {
    auto shm =
        std::make_unique<bip::shared_memory_object>(bip::open_only, name.c_str(), bip::read_only);
    bip::offset_t bytes = 0;
    if (!shm->get_size(bytes) || bytes == 0)
      throw Error("shared segment " + name + " is empty (server still starting?)");
    // read_only: MAP_SHARED, PROT_READ.
    auto region = std::make_unique<bip::mapped_region>(*shm, bip::read_only);
    return SharedSegment(name, std::move(shm), std::move(region), /*owner=*/false);
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
                             std::unique_ptr<boost::interprocess::shared_memory_object> file,
                             std::unique_ptr<boost::interprocess::mapped_region> region, bool owner)
    : name_(std::move(name)), file_(std::move(file)), region_(std::move(region)), owner_(owner) {}

SharedSegment::SharedSegment(SharedSegment&& o) noexcept
    : name_(std::move(o.name_)),
      file_(std::move(o.file_)),
      region_(std::move(o.region_)),
      owner_(o.owner_) {
  o.owner_ = false;
}

SharedSegment& SharedSegment::operator=(SharedSegment&& o) noexcept {
  if (this != &o) {
    reset();
    name_ = std::move(o.name_);
    file_ = std::move(o.file_);
    region_ = std::move(o.region_);
    owner_ = o.owner_;
    o.owner_ = false;
  }
  return *this;
}

SharedSegment::~SharedSegment() { reset(); }

uint8_t* SharedSegment::data() const {
  return region_ ? static_cast<uint8_t*>(region_->get_address()) : nullptr;
}

size_t SharedSegment::size() const { return region_ ? region_->get_size() : 0; }

int SharedSegment::fd() const { return file_ ? file_->get_mapping_handle().handle : -1; }

void SharedSegment::reset() noexcept {
  region_.reset();
  file_.reset();
  if (owner_) boost::interprocess::shared_memory_object::remove(name_.c_str());
  owner_ = false;
}

}  // namespace batchcast
