#include "metrics/collocation.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "metrics/nvml.h"

namespace batchcast::metrics {

std::string classify_collocation(const CollocationEvidence& e) {
  if (!e.gpu) return "none";
  if (e.mig_enabled) return "mig";
  if (e.mps_daemon || e.mps_clients) return "mps";
  return "time-slicing";
}

std::string mps_pipe_directory() {
  const char* dir = std::getenv("CUDA_MPS_PIPE_DIRECTORY");
  return dir != nullptr && *dir != '\0' ? dir : "/tmp/nvidia-mps";
}

bool mps_control_live(const std::string& pipe_dir) {
  const std::string path = pipe_dir + "/control";
  sockaddr_un addr{};
  if (path.size() >= sizeof addr.sun_path) return false;
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  for (int type : {SOCK_STREAM, SOCK_SEQPACKET}) {
    const int fd = ::socket(AF_UNIX, type | SOCK_CLOEXEC, 0);
    if (fd < 0) return false;
    const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
    const int err = errno;
    ::close(fd);
    if (ok) return true;
    if (err != EPROTOTYPE) return false;  // only a socket of the other type is worth a retry
  }
  return false;
}

std::string detect_collocation(Nvml* nvml) {
  CollocationEvidence e;
  e.gpu = nvml != nullptr && nvml->device_count() > 0;
  if (e.gpu) {
    e.mig_enabled = nvml->capabilities().mig_enabled;
    for (const GpuProcess& p : nvml->processes()) e.mps_clients = e.mps_clients || p.mps;
  }
  e.mps_daemon = mps_control_live(mps_pipe_directory());
  return classify_collocation(e);
}

}  // namespace batchcast::metrics
