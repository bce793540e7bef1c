// Helpers of the hardening tests (soak, permissions, faults): the per-epoch "exactly once" check,
// the server's command line, and what the tests read from /proc about the server and their
// children (RSS, open fds, zombies).
#pragma once

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tests/cpp/support/probe_output.h"
#include "tests/cpp/support/processes.h"

namespace batchcast::testing {

// Checks one probe's epochs against a dataset of n samples. Every epoch: no sample twice. Every
// epoch it saw end (E line) from its start: all n samples. A first epoch joined late may be
// partial; then `skipped` (reported by the consumer) must account for the missing samples.
// Returns "" when fine, else what is wrong.
inline std::string check_epochs(const ProbeRun& run, int64_t n, bool drop_last = false,
                                uint64_t batch = 0) {
  auto epochs = run.per_epoch();
  uint64_t missing_in_first = 0;
  bool first = true, first_ended = false;
  for (const auto& [e, order] : epochs) {
    std::set<int64_t> seen;
    for (auto i : order) {
      if (i < 0 || i >= n)
        return "epoch " + std::to_string(e) + ": sample " + std::to_string(i) +
               " outside the dataset";
      if (!seen.insert(i).second)
        return "epoch " + std::to_string(e) + ": sample " + std::to_string(i) + " twice";
    }
    if (first) first_ended = run.ended_epochs.count(e) > 0;
    if (run.ended_epochs.count(e)) {
      uint64_t expect = drop_last && batch ? (n / batch) * batch : n;
      if (seen.size() != expect) {
        if (!first)
          return "epoch " + std::to_string(e) + " ended with " + std::to_string(seen.size()) +
                 " of " + std::to_string(expect) + " samples";
        missing_in_first = expect - seen.size();
      }
    }
    first = false;
  }
  // The skip count covers the partial first epoch (wait policy: nothing else is ever skipped).
  if (run.finished && first_ended && run.skipped != missing_in_first && !drop_last)
    return "consumer reported " + std::to_string(run.skipped) +
           " skipped samples, its first epoch missed " + std::to_string(missing_in_first);
  return "";
}

// /proc/<pid>/status field in kB (VmRSS, VmHWM...), or -1.
inline long proc_status_kb(pid_t pid, const std::string& field) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(f, line);)
    if (line.rfind(field + ":", 0) == 0) return std::stol(line.substr(field.size() + 1));
  return -1;
}

inline int open_fds(pid_t pid) {
  int n = 0;
  if (DIR* d = ::opendir(("/proc/" + std::to_string(pid) + "/fd").c_str())) {
    while (dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
    ::closedir(d);
  }
  return n;
}

// Zombie processes whose parent is one of `parents`.
inline std::vector<pid_t> zombies_of(const std::set<pid_t>& parents) {
  std::vector<pid_t> z;
  if (DIR* d = ::opendir("/proc")) {
    while (dirent* e = ::readdir(d)) {
      if (!std::isdigit(static_cast<unsigned char>(e->d_name[0]))) continue;
      std::ifstream f(std::string("/proc/") + e->d_name + "/stat");
      std::string stat;
      std::getline(f, stat);
      auto close = stat.rfind(')');
      if (close == std::string::npos) continue;
      std::istringstream rest(stat.substr(close + 2));
      char state;
      pid_t ppid;
      if (rest >> state >> ppid && state == 'Z' && parents.count(ppid))
        z.push_back(std::stoi(e->d_name));
    }
    ::closedir(d);
  }
  return z;
}

// The command line of `batchcast serve` on `ep` without status lines, plus `extra`.
inline std::vector<std::string> serve_args(const std::string& ep, std::vector<std::string> extra) {
  std::vector<std::string> a = {batchcast_bin(),     "serve", "--endpoint", ep,
                                "--status-interval", "0"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

inline bool file_exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }
inline std::string ipc_path(const std::string& endpoint) { return endpoint.substr(6); }

}  // namespace batchcast::testing
