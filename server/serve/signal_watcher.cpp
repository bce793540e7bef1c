#include "server/serve/signal_watcher.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "common/error.h"

namespace batchcast {
namespace {

constexpr int kStoppingSignals[] = {SIGINT, SIGTERM, SIGHUP};
constexpr unsigned char kWake = 0;  // not a signal number: stop() writes it to end the watcher

// The handler's only state: the pipe's write end (written once, before the handlers exist).
int g_write_fd = -1;

void record_signal(int signo) {
  const int saved = errno;  // a handler must leave errno as the interrupted code had it
  const auto byte = static_cast<unsigned char>(signo);
  [[maybe_unused]] ssize_t n = ::write(g_write_fd, &byte, 1);  // pipe full: a stop is pending
  errno = saved;
}

}  // namespace

SignalWatcher::SignalWatcher() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0)
    throw Error(std::string("signal watcher: pipe2 failed: ") + std::strerror(errno));
  read_fd_ = fds[0];
  g_write_fd = fds[1];
  struct sigaction sa {};
  sa.sa_handler = record_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int signo : kStoppingSignals) sigaction(signo, &sa, nullptr);
}

SignalWatcher::~SignalWatcher() {
  stop();
  // The write end stays open: a late signal must find a valid descriptor, never a reused one.
  ::close(read_fd_);
}

void SignalWatcher::watch(std::function<void(int)> on_signal) {
  // The watcher itself never takes the signals (its thread starts with them blocked): a handler
  // that a sanitizer defers until the interrupted call returns would otherwise wait for the
  // read() it interrupted, which waits for the byte that handler writes.
  sigset_t stopping, previous;
  sigemptyset(&stopping);
  for (int signo : kStoppingSignals) sigaddset(&stopping, signo);
  pthread_sigmask(SIG_BLOCK, &stopping, &previous);
  thread_ = std::thread([this, on_signal = std::move(on_signal)] {
    pthread_setname_np(pthread_self(), kThreadName);  // for debuggers, top -H and the tests
    unsigned char byte = 0;
    for (;;) {
      ssize_t n = ::read(read_fd_, &byte, 1);
      if (n < 0 && errno == EINTR) continue;
      if (n != 1 || byte == kWake) return;
      on_signal(byte);
    }
  });
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
}

void SignalWatcher::stop() {
  if (!thread_.joinable()) return;
  [[maybe_unused]] ssize_t n = ::write(g_write_fd, &kWake, 1);
  thread_.join();
}

const char* signal_name(int signo) {
  switch (signo) {
    case SIGINT:
      return "SIGINT";
    case SIGTERM:
      return "SIGTERM";
    case SIGHUP:
      return "SIGHUP";
  }
  return "a signal";
}

}  // namespace batchcast
