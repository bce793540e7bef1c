// Test support: a `batchcast serve` child process that answers for the names it owns on this
// host, its /dev/shm segment and its ipc socket file.
//
// On destruction: a server still running (its test failed or stopped early) is SIGKILLed and
// its segment and socket file are removed, so a failed test leaves nothing behind; a server that
// exited by itself must have removed both (a non-fatal failure names the leak), and they are
// removed anyway. A server the test killed on purpose is cleaned up without a leak check.
// Not thread-safe: owned by one test. Needs slot_pool.h's segment_name_for() (batchcast_shm).
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "shm/slot_pool.h"
#include "tests/cpp/support/processes.h"

namespace batchcast::testing {

class ServerProcess {
 public:
  // `endpoint` must be an ipc:// endpoint (the socket file is checked).
  ServerProcess(std::string endpoint, const std::vector<std::string>& extra)
      : endpoint_(std::move(endpoint)), process_(args(endpoint_, extra)) {}
  ~ServerProcess() {
    int code = process_.wait(0);
    if (code == -1) {
      process_.signal(SIGKILL);
      process_.wait(30);
    }
    bool check = code >= 0 && code < 128;  // exited by itself
    if (check) {
      EXPECT_FALSE(segment_exists()) << "the server of " << endpoint_ << " left its segment";
      EXPECT_FALSE(socket_exists()) << "the server of " << endpoint_ << " left its socket file";
    }
    ::shm_unlink(("/" + segment_name_for(endpoint_)).c_str());
    ::unlink(socket_path().c_str());
  }
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  ChildProcess& process() { return process_; }
  int wait(double timeout_s) { return process_.wait(timeout_s); }
  void signal(int sig) { process_.signal(sig); }
  std::string err() const { return process_.err(); }
  bool segment_exists() const {
    return ::access(("/dev/shm/" + segment_name_for(endpoint_)).c_str(), F_OK) == 0;
  }
  bool socket_exists() const { return ::access(socket_path().c_str(), F_OK) == 0; }

 private:
  static std::vector<std::string> args(const std::string& endpoint,
                                       const std::vector<std::string>& extra) {
    std::vector<std::string> a = {batchcast_bin(),     "serve", "--endpoint", endpoint,
                                  "--status-interval", "0"};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
  std::string socket_path() const { return endpoint_.substr(6); }

  std::string endpoint_;
  ChildProcess process_;
};

}  // namespace batchcast::testing
