// serve(): runs `batchcast serve` for a validated ServeConfig until its last epoch was served
// to every consumer, or until SIGINT/SIGTERM/SIGHUP (signal_watcher.h). It builds the sample
// source, the core (pool, ring, socket), the GPU stage where the pool is on a GPU, the metrics
// collector, and the producer; logs a status line every --status-interval seconds.
//
// Blocking; call it once per process from the main thread (it installs the signal handlers).
// Everything it builds lives within the call: the pool segment and ipc socket file are removed
// before it returns, whichever way it ends.
#pragma once

#include "server/serve_config.h"

namespace batchcast {

// 0: served to the end, or stopped by a signal. 1: the stream failed (the error was logged and
// sent to the consumers). Throws Error when the server cannot start (dataset, endpoint, GPU).
int serve(const ServeConfig& config);

}  // namespace batchcast
