// Helpers of the collector tests (test_collector_*.cpp): forked children that burn CPU on cue and
// report their own getrusage, run directories removed when the test program ends, the CSV and
// summary readers, and a clock the test moves (ManualTicks) for ticks without a sampler thread.
//
// Contract: test-only; not thread-safe (call from the test's main thread). A Child owns its
// process and pipes and reaps the child on destruction.
#pragma once

#include <gtest/gtest.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "metrics/collector.h"
#include "metrics/process_tracker.h"

namespace batchcast::testing {

namespace fs = std::filesystem;
using nlohmann::json;

inline double rusage_s(int who) {
  rusage ru{};
  getrusage(who, &ru);
  return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + ru.ru_stime.tv_sec +
         ru.ru_stime.tv_usec * 1e-6;
}

// Spins until this process has used `seconds` more CPU (its own clock, not the wall's).
inline void burn_cpu(double seconds) {
  const double until = rusage_s(RUSAGE_SELF) + seconds;
  volatile uint64_t x = 0;
  while (rusage_s(RUSAGE_SELF) < until)
    for (int i = 0; i < 200000; ++i) x = x + i;
}

inline void write_all(int fd, const void* p, size_t n) {
  ASSERT_EQ(::write(fd, p, n), static_cast<ssize_t>(n));
}
inline double read_double(int fd) {
  double v = -1;
  if (::read(fd, &v, sizeof v) != sizeof v) return -1;
  return v;
}
inline void send_double(int fd, double v) {
  if (::write(fd, &v, sizeof v) != sizeof v) _exit(3);
}
// Blocks until the other side writes a byte (returns true) or closes (false).
inline bool wait_byte(int fd) {
  char c;
  return ::read(fd, &c, 1) == 1;
}

// A forked child running `body(in, out)`: `in` reads what the test sends, `out` writes back.
struct Child {
  pid_t pid = -1;
  int to_child = -1, from_child = -1;

  explicit Child(const std::function<void(int, int)>& body) {
    int down[2], up[2];
    if (pipe(down) != 0 || pipe(up) != 0) std::abort();
    pid = fork();
    if (pid == 0) {
      ::close(down[1]);
      ::close(up[0]);
      body(down[0], up[1]);
      _exit(0);
    }
    ::close(down[0]);
    ::close(up[1]);
    to_child = down[1];
    from_child = up[0];
  }
  void go() { write_all(to_child, "g", 1); }
  double result() { return read_double(from_child); }
  // Closes the command pipe (the child's last wait_byte returns) and reaps it.
  void finish() {
    if (pid <= 0) return;
    ::close(to_child);
    ::close(from_child);
    int status = 0;
    waitpid(pid, &status, 0);
    pid = -1;
  }
  ~Child() { finish(); }
};

// Run directories under /tmp, removed when the test program ends.
class TempDirs : public ::testing::Environment {
 public:
  void TearDown() override {
    for (const auto& d : dirs) fs::remove_all(d);
  }
  std::vector<fs::path> dirs;
};
inline TempDirs* const g_temp_dirs =
    static_cast<TempDirs*>(::testing::AddGlobalTestEnvironment(new TempDirs));

inline fs::path fresh_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("bc_metrics_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(d);
  g_temp_dirs->dirs.push_back(d);
  return d;
}

inline std::vector<std::vector<std::string>> read_csv(const fs::path& p) {
  std::ifstream in(p);
  std::vector<std::vector<std::string>> rows;
  std::string line;
  while (std::getline(in, line)) {
    std::vector<std::string> cells;
    std::stringstream ss(line);
    std::string c;
    while (std::getline(ss, c, ',')) cells.push_back(c);
    if (!line.empty() && line.back() == ',') cells.push_back("");
    rows.push_back(cells);
  }
  return rows;
}

inline json read_json(const fs::path& p) {
  std::ifstream in(p);
  return json::parse(in);
}

inline MetricsSnapshot one_process(const std::string& role, pid_t pid) {
  MetricsSnapshot s;
  s.processes.push_back({role, "p" + std::to_string(pid), pid, 0, 0});
  return s;
}

inline CollectorOptions fast_options(const fs::path& dir) {
  CollectorOptions o;
  o.dir = dir.string();
  o.interval_s = 0.2;
  return o;
}

// Ticks taken by the test (no sampler thread) on a clock the test moves: advance() then tick().
struct ManualTicks {
  double now = 100.0;
  CollectorEnv env(std::function<metrics::ProcessTable()> scan = {}) {
    return CollectorEnv{[this] { return now; }, std::move(scan), false};
  }
};

inline std::vector<std::string> header_of(const fs::path& p) { return read_csv(p).at(0); }

}  // namespace batchcast::testing
