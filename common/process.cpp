#include "common/process.h"

#include <signal.h>
#include <sys/stat.h>

#include <cerrno>
#include <fstream>
#include <sstream>

namespace batchcast {

bool process_alive(pid_t pid) {
  if (pid <= 0) return false;
  if (kill(pid, 0) != 0 && errno == ESRCH) return false;
  // kill() succeeds on zombies; /proc/<pid>/stat's third field says 'Z' for them.
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  if (!stat) return errno != ENOENT;
  std::string line;
  std::getline(stat, line);
  auto close = line.rfind(')');
  if (close == std::string::npos || close + 2 >= line.size()) return true;
  char state = line[close + 2];
  return state != 'Z' && state != 'X';
}

std::string host_boot_id() {
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(f, id);
  struct stat ns {};
  if (::stat("/proc/self/ns/pid", &ns) == 0) id += "/" + std::to_string(ns.st_ino);
  return id;
}

bool same_host(const std::string& a, const std::string& b) {
  if (a.empty() || b.empty()) return false;
  return a.substr(0, a.find('/')) == b.substr(0, b.find('/'));
}

}  // namespace batchcast
