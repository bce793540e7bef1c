// ServeRun: `batchcast serve` for a validated ServeConfig. It builds the sample source, the
// core (pool, ring, socket), the GPU stage where the pool is on a GPU, the metrics collector and
// the producer, and serves until its last epoch was served to every consumer, the stream
// failed, or stop(). serve() runs one under the signal watcher (signal_watcher.h): the program.
// The Python bindings run one in the producer process of batchcast.DataLoader(share=) when the
// trainer's torchvision pipeline has a native plan (python/batchcast/_torchvision_plan.py).
//
// Thread-safety: wait() on one thread; stop() and the counters from any thread.
// Ownership and lifetime: everything it builds lives within the object. The pool segment and
// the ipc socket file are removed by the destructor, whichever way serving ended.
#pragma once

#include <atomic>
#include <memory>
#include <thread>

#include "server/serve/serve_config.h"

namespace batchcast {

class ChunkStage;
class MetricsCollector;
class MetricsSource;
class SampleSource;
class SampleProducer;
class StreamHost;
class StreamPlan;
class ViewSet;

class ServeRun {
 public:
  // Binds the endpoint and starts producing. Throws Error when the server cannot start
  // (dataset, endpoint, GPU).
  explicit ServeRun(const ServeConfig& config);
  ~ServeRun();  // stop(), then joins the producer and removes the pool and socket
  ServeRun(const ServeRun&) = delete;
  ServeRun& operator=(const ServeRun&) = delete;

  // Blocks until the stream is done (every epoch served), failed, or stop() was called; logs a
  // status line every --status-interval seconds, keeps answering with the error for
  // --fail-linger seconds after a failure, and keeps a finished GPU pool until its consumers
  // left (stop() ends those waits too). 0: done or stopped; 1: the stream failed.
  int wait();
  // Ends serving: wait() returns and consumers get "server gone". Idempotent.
  void stop();

  const StreamHost& core() const { return *core_; }

 private:
  ServeConfig config_;
  // An image stream's views (read by the source, the stage and the core's event loop: outlives
  // them); null for synthetic samples, which have view 0 only.
  std::unique_ptr<ViewSet> views_;
  std::unique_ptr<SampleSource> source_;
  std::unique_ptr<StreamPlan> plan_;
  std::unique_ptr<StreamHost> core_;
  std::unique_ptr<ChunkStage> stage_;  // destroyed before the stream host whose arena it borrows
  std::shared_ptr<MetricsSource> metrics_source_;  // the collector's view of core_
  std::unique_ptr<MetricsCollector> collector_;
  std::unique_ptr<SampleProducer> producer_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> produced_{false};
  bool produce_ok_ = false;  // written by producing_ before produced_ is set
  std::thread producing_;
};

// The program's `serve`: one ServeRun (with every_rank, one per rank) until its end or
// SIGINT/SIGTERM/SIGHUP (a clean stop). Call it once per process from the main thread (it
// installs the signal handlers). Returns ServeRun::wait()'s code (the worst of them).
int serve(const ServeConfig& config);

}  // namespace batchcast
