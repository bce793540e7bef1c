// SignalWatcher: turns SIGINT, SIGTERM and SIGHUP into one call of a stop callback on a thread
// of its own, so that `batchcast serve` stops cleanly (pool segment and ipc socket file removed)
// whether it is interrupted at a terminal, stopped by a supervisor or loses its terminal.
//
// Why a handler and not sigwait(): libraries such as NVML and the CUDA driver start threads of
// their own with the signals unblocked, so a signal may land on any thread. The handler only
// writes the signal number into a pipe (async-signal-safe); the watcher thread reads it and
// calls the callback outside signal context.
//
// Thread-safety and lifetime: one SignalWatcher per process (the handler reaches it through a
// process-wide pipe). Construct it before starting threads; watch() once; stop() joins the
// watcher and must be called (the destructor does) before whatever the callback touches is
// destroyed. The handlers stay installed after destruction and then only record nothing.
#pragma once

#include <functional>
#include <thread>

namespace batchcast {

class SignalWatcher {
 public:
  // Installs the handlers. Throws Error if the pipe cannot be made.
  SignalWatcher();
  ~SignalWatcher();
  SignalWatcher(const SignalWatcher&) = delete;
  SignalWatcher& operator=(const SignalWatcher&) = delete;

  // Starts the watcher thread: on_signal(signo) runs on it for each stopping signal received.
  void watch(std::function<void(int)> on_signal);
  // Joins the watcher thread (idempotent): no on_signal call runs after it returns.
  void stop();

 private:
  int read_fd_ = -1;
  std::thread thread_;
};

// The name of the watcher's thread (/proc/<pid>/task/<tid>/comm).
inline constexpr const char* kThreadName = "batchcast-sig";

// "SIGINT", "SIGTERM", "SIGHUP": the name of a signal SignalWatcher reports, for log lines.
const char* signal_name(int signo);

}  // namespace batchcast
