#include "metrics/proc_stats.h"

#include <dirent.h>
#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>

namespace batchcast::metrics {
namespace {

// Reads a whole small /proc file into buf (NUL-terminated); returns bytes read or -1.
ssize_t read_small_file(const char* path, char* buf, size_t cap) {
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  size_t len = 0;
  while (len + 1 < cap) {
    ssize_t n = ::read(fd, buf + len, cap - 1 - len);
    if (n < 0) {
      ::close(fd);
      return -1;
    }
    if (n == 0) break;
    len += static_cast<size_t>(n);
  }
  ::close(fd);
  buf[len] = '\0';
  return static_cast<ssize_t>(len);
}

// sysconf is a libc call each time; these never change while we run.
double ticks_per_second() {
  static const double hz = static_cast<double>(sysconf(_SC_CLK_TCK));
  return hz;
}
int64_t page_size() {
  static const int64_t size = sysconf(_SC_PAGESIZE);
  return size;
}

}  // namespace

std::optional<ProcStat> parse_proc_stat(const char* text, size_t len) {
  // Field 2 (comm) is in parentheses and may itself contain spaces and ')': the fields we want
  // start after the *last* ')'.
  const char* end = text + len;
  const char* close = nullptr;
  for (const char* p = text; p < end; ++p)
    if (*p == ')') close = p;
  if (close == nullptr || close + 2 >= end) return std::nullopt;
  ProcStat st;
  st.pid = static_cast<pid_t>(std::strtol(text, nullptr, 10));
  const char* p = close + 2;
  st.state = *p++;
  // Fields 4.. (ppid) up to 24 (rss), numbered as in proc(5).
  uint64_t f[25] = {};
  for (int field = 4; field <= 24; ++field) {
    while (p < end && *p == ' ') ++p;
    if (p >= end) return std::nullopt;
    char* next = nullptr;
    // Signed parse: cutime/cstime and a few others are "long" in proc(5).
    f[field] = static_cast<uint64_t>(std::strtoll(p, &next, 10));
    if (next == p) return std::nullopt;
    p = next;
  }
  const double hz = ticks_per_second();
  st.ppid = static_cast<pid_t>(f[4]);
  st.utime_s = static_cast<double>(f[14]) / hz;
  st.stime_s = static_cast<double>(f[15]) / hz;
  st.cutime_s = static_cast<double>(static_cast<int64_t>(f[16])) / hz;
  st.cstime_s = static_cast<double>(static_cast<int64_t>(f[17])) / hz;
  st.starttime = f[22];
  st.rss_bytes = static_cast<int64_t>(f[24]) * page_size();
  return st;
}

std::optional<ProcStat> read_proc_stat(pid_t pid) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  char buf[1024];
  ssize_t n = read_small_file(path, buf, sizeof buf);
  if (n <= 0) return std::nullopt;
  return parse_proc_stat(buf, static_cast<size_t>(n));
}

ProcessTable ProcessTable::scan() {
  std::vector<ProcStat> stats;
  DIR* dir = ::opendir("/proc");
  if (dir == nullptr) return ProcessTable(std::move(stats));
  stats.reserve(512);
  while (dirent* entry = ::readdir(dir)) {
    const char* name = entry->d_name;
    if (name[0] < '0' || name[0] > '9') continue;
    pid_t pid = static_cast<pid_t>(std::strtol(name, nullptr, 10));
    if (auto st = read_proc_stat(pid)) stats.push_back(*st);
  }
  ::closedir(dir);
  return ProcessTable(std::move(stats));
}

ProcessTable::ProcessTable(std::vector<ProcStat> stats) : stats_(std::move(stats)) {
  by_pid_.reserve(stats_.size());
  by_parent_.reserve(stats_.size());
  for (size_t i = 0; i < stats_.size(); ++i) {
    by_pid_.emplace(stats_[i].pid, i);
    by_parent_.emplace(stats_[i].ppid, i);
  }
}

std::optional<TreeUsage> ProcessTable::tree_usage(pid_t root,
                                                  const std::unordered_set<pid_t>& stop_at) const {
  auto it = by_pid_.find(root);
  if (it == by_pid_.end()) return std::nullopt;
  const ProcStat& r = stats_[it->second];
  TreeUsage u;
  u.starttime = r.starttime;
  u.rss_bytes = r.rss_bytes;
  std::deque<size_t> todo{it->second};
  std::unordered_set<pid_t> seen{root};  // guards against a malformed (cyclic) table
  while (!todo.empty()) {
    const ProcStat& st = stats_[todo.front()];
    todo.pop_front();
    u.cpu_s += st.cpu_s();
    u.tree_rss_bytes += st.rss_bytes;
    ++u.procs;
    u.members.push_back(st.pid);
    auto [b, e] = by_parent_.equal_range(st.pid);
    for (auto c = b; c != e; ++c) {
      pid_t child = stats_[c->second].pid;
      if (stop_at.count(child) || !seen.insert(child).second) continue;
      todo.push_back(c->second);
    }
  }
  return u;
}

std::optional<double> parse_schedstat_wait(const char* text) {
  char* next = nullptr;
  std::strtoull(text, &next, 10);  // on-CPU time, already in stat
  if (next == text) return std::nullopt;
  const char* p = next;
  const unsigned long long wait_ns = std::strtoull(p, &next, 10);
  if (next == p) return std::nullopt;
  return static_cast<double>(wait_ns) * 1e-9;
}

std::optional<double> read_run_queue_wait(pid_t pid) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/task", static_cast<int>(pid));
  DIR* dir = ::opendir(path);
  if (dir == nullptr) return std::nullopt;
  std::optional<double> sum;
  while (dirent* entry = ::readdir(dir)) {
    const char* name = entry->d_name;
    if (name[0] < '0' || name[0] > '9') continue;
    char file[320];
    std::snprintf(file, sizeof file, "/proc/%d/task/%s/schedstat", static_cast<int>(pid), name);
    char buf[128];
    if (read_small_file(file, buf, sizeof buf) <= 0) continue;  // thread exited meanwhile
    if (auto w = parse_schedstat_wait(buf)) sum = sum.value_or(0) + *w;
  }
  ::closedir(dir);
  return sum;
}

std::optional<SystemCpuTimes> read_system_cpu() {
  char buf[4096];
  ssize_t n = read_small_file("/proc/stat", buf, sizeof buf);
  if (n <= 0 || std::strncmp(buf, "cpu ", 4) != 0) return std::nullopt;
  // cpu  user nice system idle iowait irq softirq steal guest guest_nice; guest time is already
  // inside user/nice, so only the first eight columns are summed.
  const char* p = buf + 4;
  uint64_t v[8] = {};
  for (int i = 0; i < 8; ++i) {
    char* next = nullptr;
    v[i] = std::strtoull(p, &next, 10);
    if (next == p) break;
    p = next;
  }
  SystemCpuTimes t;
  for (uint64_t x : v) t.total += x;
  t.busy = t.total - v[3] - v[4];
  return t;
}

std::optional<SystemMemory> read_system_memory() {
  char buf[8192];
  ssize_t n = read_small_file("/proc/meminfo", buf, sizeof buf);
  if (n <= 0) return std::nullopt;
  auto field_kb = [&](const char* key) -> double {
    const char* p = std::strstr(buf, key);
    if (p == nullptr) return -1;
    return std::strtod(p + std::strlen(key), nullptr);
  };
  double total = field_kb("MemTotal:"), avail = field_kb("MemAvailable:");
  if (total < 0 || avail < 0) return std::nullopt;
  // MLflow's megabytes are 10^6 bytes.
  return SystemMemory{total * 1024 / 1e6, (total - avail) * 1024 / 1e6};
}

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

}  // namespace batchcast::metrics
