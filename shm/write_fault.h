// Write-fault reporting for read-only mappings of the batch pool.
//
// Consumers map the pool copy-on-write, except a consumer that page-locks its host pool for
// copies to a GPU (pin_memory): page-locking a private mapping may copy its pages, so that one maps
// the pool read-only, and a training script that modifies such a batch in place (x.add_(1)) dies
// of SIGSEGV (the alternative is corrupting the batch for every other consumer). The process
// first prints what happened and the fix:
// "write into read-only shared memory /dev/shm/NAME (a zero-copy batch) ... .clone() it first".
//
// Contract: watch_writes() records [begin, begin + bytes) under `name` and, the first time it is
// called, installs a SIGSEGV handler (SA_SIGINFO | SA_ONSTACK) that chains to the handler that was
// there before (Python's faulthandler, a sanitizer's, or the default action, which still ends the
// process with its usual status and core dump). Faults outside watched ranges only chain.
// unwatch_writes() forgets the range (call it before unmapping). Thread-safe and lock-free: the
// handler reads a fixed table of atomics; at most kMaxWatchedRanges ranges are watched at once
// (more are simply not reported). Used by SharedSegment::open (Access::kReadOnly).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace batchcast {

constexpr int kMaxWatchedRanges = 64;

void watch_writes(const void* begin, size_t bytes, const std::string& name) noexcept;
void unwatch_writes(const void* begin) noexcept;

}  // namespace batchcast
