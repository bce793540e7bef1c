// BlockingWorker: runs the bindings' blocking native calls (Consumer::next, StreamHost::acquire)
// on a dedicated thread while the calling Python thread waits in 50 ms slices with the GIL
// released, checking for signals between slices. So Ctrl-C interrupts a blocked call within a
// slice, and the native call itself is never abandoned half-way (Consumer::next keeps partial
// batch state on its stack): an interrupted call stays in flight and the next run() collects
// its result instead of starting another.
//
// Contract: jobs must not touch Python objects and must own (shared_ptr) everything they use,
// because a worker destroyed while a job runs is detached and finishes on its own.
// Thread-safety: run() from one Python thread at a time (callers hold the GIL).
#pragma once

#include <pybind11/pybind11.h>

#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

namespace batchcast::python {

class BlockingWorker {
 public:
  BlockingWorker() : state_(std::make_shared<State>()) {
    thread_ = std::thread([s = state_] { loop(*s); });
  }
  ~BlockingWorker() {
    {
      std::lock_guard lk(state_->mu);
      state_->quit = true;
    }
    state_->cv.notify_all();
    if (in_flight_) {
      thread_.detach();  // it ends after its job; the job owns what it uses
    } else {
      pybind11::gil_scoped_release nogil;
      thread_.join();
    }
  }
  BlockingWorker(const BlockingWorker&) = delete;
  BlockingWorker& operator=(const BlockingWorker&) = delete;

  // True while an interrupted job still runs.
  bool in_flight() const { return in_flight_; }

  // Runs `job` (or, if an interrupted job is still in flight, waits for that one instead) and
  // rethrows its exception. On a pending signal whose handler raised: calls `on_interrupt`
  // (GIL held) if given, and if it returns true waits for the job to end first; then throws
  // error_already_set (e.g. KeyboardInterrupt).
  void run(std::function<void()> job, const std::function<bool()>& on_interrupt = {}) {
    if (!in_flight_) {
      {
        std::lock_guard lk(state_->mu);
        state_->job = std::move(job);
        state_->done = false;
      }
      state_->cv.notify_all();
      in_flight_ = true;
    }
    while (!wait_slice()) {
      if (PyErr_CheckSignals() != 0) {
        if (on_interrupt && on_interrupt()) {
          while (!wait_slice()) {
          }
          collect(/*rethrow=*/false);
        }
        throw pybind11::error_already_set();
      }
    }
    collect(/*rethrow=*/true);
  }

 private:
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    std::function<void()> job;
    bool done = false;
    bool quit = false;
    std::exception_ptr error;
  };

  static void loop(State& s) {
    std::unique_lock lk(s.mu);
    while (true) {
      s.cv.wait(lk, [&] { return s.quit || s.job; });
      if (!s.job) return;  // quit with nothing to do
      auto job = std::move(s.job);
      s.job = nullptr;
      lk.unlock();
      std::exception_ptr error;
      try {
        job();
      } catch (...) {
        error = std::current_exception();
      }
      job = nullptr;  // drop its captures here, not under the lock
      lk.lock();
      s.error = error;
      s.done = true;
      s.cv.notify_all();
      if (s.quit) return;
    }
  }

  // Waits up to 50 ms for the job with the GIL released; true once it is done.
  bool wait_slice() {
    pybind11::gil_scoped_release nogil;
    std::unique_lock lk(state_->mu);
    return state_->cv.wait_for(lk, std::chrono::milliseconds(50), [&] { return state_->done; });
  }

  void collect(bool rethrow) {
    std::exception_ptr error;
    {
      std::lock_guard lk(state_->mu);
      error = std::exchange(state_->error, nullptr);
      state_->done = false;
    }
    in_flight_ = false;
    if (error && rethrow) std::rethrow_exception(error);
  }

  std::shared_ptr<State> state_;
  std::thread thread_;
  bool in_flight_ = false;
};

}  // namespace batchcast::python
