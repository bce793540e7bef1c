// SignalWatcher: a stopping signal sent to the process reaches the callback, and the watcher's
// own thread never takes one (a handler deferred until the read() it interrupted returns, as
// under TSan, would wait for the byte it writes itself: the server would never stop).
#include "server/serve/signal_watcher.h"

#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace batchcast {
namespace {

// The tid of this process's thread named `name`, waiting for it to name itself (at most 30 s).
std::string thread_named(const std::string& name) {
  for (int attempt = 0; attempt < 3000; ++attempt) {
    DIR* dir = ::opendir("/proc/self/task");
    std::string found;
    while (dirent* e = dir ? ::readdir(dir) : nullptr) {
      if (e->d_name[0] == '.') continue;
      std::ifstream comm(std::string("/proc/self/task/") + e->d_name + "/comm");
      std::string line;
      if (std::getline(comm, line) && line == name) found = e->d_name;
    }
    if (dir) ::closedir(dir);
    if (!found.empty()) return found;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return "";
}

// The blocked-signal mask of a thread of this process (SigBlk of its status file).
uint64_t blocked_mask(const std::string& tid) {
  std::ifstream status("/proc/self/task/" + tid + "/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("SigBlk:", 0) == 0) return std::stoull(line.substr(7), nullptr, 16);
  ADD_FAILURE() << "no SigBlk line for thread " << tid;
  return 0;
}

uint64_t bit(int signo) { return uint64_t{1} << (signo - 1); }

TEST(SignalWatcher, ASignalToTheProcessReachesTheCallbackOnce) {
  SignalWatcher watcher;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int> seen;
  watcher.watch([&](int signo) {
    std::lock_guard<std::mutex> lock(mu);
    seen.push_back(signo);
    cv.notify_all();
  });
  ASSERT_EQ(::kill(::getpid(), SIGTERM), 0);
  std::unique_lock<std::mutex> lock(mu);
  ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(30), [&] { return !seen.empty(); }));
  EXPECT_EQ(seen, std::vector<int>{SIGTERM});
  EXPECT_STREQ(signal_name(seen[0]), "SIGTERM");
}

TEST(SignalWatcher, ItsThreadBlocksTheStoppingSignalsAndTheCallersMaskIsUnchanged) {
  SignalWatcher watcher;
  watcher.watch([](int) {});
  const std::string tid = thread_named(kThreadName);
  ASSERT_FALSE(tid.empty()) << "no thread named " << kThreadName;
  const uint64_t stopping = bit(SIGINT) | bit(SIGTERM) | bit(SIGHUP);
  EXPECT_EQ(blocked_mask(tid) & stopping, stopping);
  sigset_t mine;
  ASSERT_EQ(::pthread_sigmask(SIG_BLOCK, nullptr, &mine), 0);
  for (int signo : {SIGINT, SIGTERM, SIGHUP}) EXPECT_FALSE(sigismember(&mine, signo)) << signo;
}

}  // namespace
}  // namespace batchcast
