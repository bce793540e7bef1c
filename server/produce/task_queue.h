// TaskQueue: the work queue of SampleProducer's threads (a worker's samples, the uploader's
// finished chunks). Two lanes: work for a private chunk (regenerated for a consumer catching up or
// decoupled) is popped before any stream work queued ahead of it.
//
// Why: the stream runs several chunks ahead of its readers, so a private chunk queued behind them
// would wait for all of them. A consumer reading private chunks then reads no faster than the
// stream and never catches up; where the producer is the bottleneck (nvJPEG on a GPU the trainers
// keep busy) it stays apart for good and every chunk is made twice. Its chunks first, it reads at
// its own pace, the stream's readers get what is left meanwhile, and it merges back when it
// reaches the stream (StreamState::try_rejoin). A consumer that is slower than the stream asks for
// few chunks (its credits), so the stream loses little to it.
//
// Thread-safety: every call from any thread. Ownership: a plain value; close() ends pop() for
// every thread once the queue is empty.
#pragma once

#include <condition_variable>
#include <deque>
#include <mutex>
#include <utility>

namespace batchcast {

template <typename Task>
class TaskQueue {
 public:
  // `first`: work of a private chunk.
  void push(Task t, bool first) {
    {
      std::lock_guard lk(mu_);
      (first ? first_ : rest_).push_back(std::move(t));
    }
    cv_.notify_one();
  }
  // The oldest private work, else the oldest other; false once closed and empty.
  bool pop(Task* t) {
    std::unique_lock lk(mu_);
    cv_.wait(lk, [&] { return closed_ || !first_.empty() || !rest_.empty(); });
    auto& lane = first_.empty() ? rest_ : first_;
    if (lane.empty()) return false;
    *t = std::move(lane.front());
    lane.pop_front();
    return true;
  }
  void close() {
    {
      std::lock_guard lk(mu_);
      closed_ = true;
    }
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> first_, rest_;
  bool closed_ = false;
};

}  // namespace batchcast
