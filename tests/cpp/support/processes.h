// Test support: real child processes (the batchcast server, probe consumers) with their output
// in temporary files, plus the checks every transport test ends with.
// ChildProcess owns its child: the destructor SIGKILLs and reaps it if it still runs.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace batchcast::testing {

inline std::string build_path(const std::string& relative) {
  return std::string(BATCHCAST_BUILD_DIR) + "/" + relative;
}
inline std::string batchcast_bin() { return build_path("server/batchcast"); }
inline std::string probe_bin() { return build_path("tests/cpp/support/probe_consumer"); }

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// A unique ipc endpoint per test and call.
inline std::string unique_endpoint(const std::string& tag) {
  static int n = 0;
  return "ipc:///tmp/bctest-" + std::to_string(::getpid()) + "-" + tag + "-" + std::to_string(n++) +
         ".sock";
}

class ChildProcess {
 public:
  explicit ChildProcess(std::vector<std::string> args) {
    static int n = 0;
    out_path_ = "/tmp/bctest-out-" + std::to_string(::getpid()) + "-" + std::to_string(n++);
    pid_ = ::fork();
    if (pid_ == 0) {
      int out = ::open((out_path_ + ".out").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      int err = ::open((out_path_ + ".err").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      ::dup2(out, 1);
      ::dup2(err, 2);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
  }
  ~ChildProcess() {
    if (running()) {
      ::kill(pid_, SIGKILL);
      wait(5);
    }
    ::unlink((out_path_ + ".out").c_str());
    ::unlink((out_path_ + ".err").c_str());
  }
  ChildProcess(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  bool running() {
    if (exited_) return false;
    int status;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      exited_ = true;
      status_ = status;
    }
    return !exited_;
  }
  // Waits up to timeout_s; returns the exit code, 128+signal, or -1 if still running.
  int wait(double timeout_s) {
    if (!poll_until(timeout_s, [&] { return !running(); })) return -1;
    return WIFEXITED(status_) ? WEXITSTATUS(status_) : 128 + WTERMSIG(status_);
  }
  // Waits up to timeout_s until the child is stopped (SIGSTOP); false if it exited or ran on.
  bool wait_stopped(double timeout_s) {
    bool stopped = false;
    poll_until(timeout_s, [&] {
      if (exited_) return true;  // reaped already: it will not stop
      int status;
      if (::waitpid(pid_, &status, WNOHANG | WUNTRACED) != pid_) return false;
      stopped = WIFSTOPPED(status);
      if (!stopped) {
        exited_ = true;
        status_ = status;
      }
      return true;
    });
    return stopped;
  }
  void signal(int sig) { ::kill(pid_, sig); }
  std::string out() const { return slurp(out_path_ + ".out"); }
  std::string err() const { return slurp(out_path_ + ".err"); }
  std::vector<std::string> out_lines() const {
    std::vector<std::string> lines;
    std::istringstream in(out());
    for (std::string l; std::getline(in, l);) lines.push_back(l);
    return lines;
  }
  // Waits until stdout has at least `n` lines starting with `prefix`.
  bool wait_for_lines(const std::string& prefix, size_t n, double timeout_s) {
    return poll_until(timeout_s, [&] {
      size_t count = 0;
      for (const auto& l : out_lines()) count += l.rfind(prefix, 0) == 0;
      return count >= n;
    });
  }
  // Waits until stderr contains `text`.
  bool wait_for_err(const std::string& text, double timeout_s) {
    return poll_until(timeout_s, [&] { return err().find(text) != std::string::npos; });
  }

 private:
  // Checks `done` every 20 ms until it holds (true) or timeout_s has passed (false).
  template <typename Done>
  static bool poll_until(double timeout_s, Done done) {
    const double end = now_s() + timeout_s;
    while (!done()) {
      if (now_s() > end) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return true;
  }
  static std::string slurp(const std::string& path) {
    std::ifstream f(path);
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
  }
  pid_t pid_ = -1;
  bool exited_ = false;
  int status_ = 0;
  std::string out_path_;
};

}  // namespace batchcast::testing
