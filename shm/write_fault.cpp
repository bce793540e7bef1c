#include "shm/write_fault.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <mutex>

namespace batchcast {
namespace {

struct WatchedRange {
  std::atomic<uintptr_t> begin{0};  // 0: free; kClaimed: being filled in
  std::atomic<uintptr_t> end{0};
  char message[320] = {};  // written before `begin` is published, read by the handler
  size_t length = 0;
};

constexpr uintptr_t kClaimed = 1;
WatchedRange g_ranges[kMaxWatchedRanges];
struct sigaction g_previous {};
std::once_flag g_installed;

void write_all(const char* text, size_t length) noexcept {
  while (length > 0) {
    ssize_t n = ::write(STDERR_FILENO, text, length);
    if (n <= 0) return;
    text += n;
    length -= static_cast<size_t>(n);
  }
}

void on_segv(int sig, siginfo_t* info, void* context) {
  const auto address = reinterpret_cast<uintptr_t>(info ? info->si_addr : nullptr);
  for (auto& r : g_ranges) {
    uintptr_t begin = r.begin.load(std::memory_order_acquire);
    if (begin > kClaimed && address >= begin && address < r.end.load(std::memory_order_relaxed)) {
      write_all(r.message, r.length);
      break;
    }
  }
  // Chain: what would have happened without us.
  if (g_previous.sa_flags & SA_SIGINFO) {
    if (g_previous.sa_sigaction) return g_previous.sa_sigaction(sig, info, context);
  } else if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN) {
    return g_previous.sa_handler(sig);
  }
  // Default action: returning re-executes the faulting write, which now kills the process.
  ::signal(sig, SIG_DFL);
}

void install() {
  struct sigaction sa {};
  sa.sa_sigaction = on_segv;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  ::sigaction(SIGSEGV, &sa, &g_previous);
}

}  // namespace

void watch_writes(const void* begin, size_t bytes, const std::string& name) noexcept {
  if (begin == nullptr || bytes == 0) return;
  std::call_once(g_installed, install);
  for (auto& r : g_ranges) {
    uintptr_t expected = 0;
    // Claim a free entry with a placeholder so that no other thread takes it.
    if (!r.begin.compare_exchange_strong(expected, kClaimed, std::memory_order_acq_rel)) continue;
    int n = std::snprintf(r.message, sizeof(r.message),
                          "\nbatchcast: write into read-only shared memory /dev/shm/%s (a "
                          "zero-copy batch). Batches are read-only views of the server's pool, "
                          "shared with the other consumers: .clone() a tensor before modifying "
                          "it in place.\n",
                          name.c_str());
    r.length = n < 0 ? 0 : std::min(static_cast<size_t>(n), sizeof(r.message) - 1);
    r.end.store(reinterpret_cast<uintptr_t>(begin) + bytes, std::memory_order_relaxed);
    r.begin.store(reinterpret_cast<uintptr_t>(begin), std::memory_order_release);
    return;
  }
}

void unwatch_writes(const void* begin) noexcept {
  for (auto& r : g_ranges) {
    uintptr_t expected = reinterpret_cast<uintptr_t>(begin);
    if (r.begin.compare_exchange_strong(expected, 0, std::memory_order_acq_rel)) return;
  }
}

}  // namespace batchcast
