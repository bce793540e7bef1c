// Consumer: the C++ consumer library. Connects to a batchcast server, maps its pool once and
// yields batches of the consumer's own batch size as views into shared memory.
//
// Stream semantics (docs/stream.md): batches are b consecutive samples of one epoch, never
// spanning two; next() returns nullptr at every epoch end (and at once, forever, after the
// server's last epoch); the last batch of an epoch is short unless drop_last. A batch inside
// one chunk is a zero-copy view; one spanning chunks, or any batch while max_held zero-copy
// batches are alive, is a private copy, and so is every batch of a chunk the server regenerated
// for this consumer alone (catching up after a seek or a late join: the chunk is copied as it
// arrives and its slot released at once, docs/stream.md). Host views are copy-on-write: a
// write changes only this process's pages (shm/slot_memory.h), except in a pool page-locked for
// pin_memory, which is read-only (a write faults, after a message, shm/write_fault.h); CUDA
// views are writable (CUDA IPC has no read-only mapping) and a write changes every consumer's
// batch: clone before modifying those.
//
// Lifetime: a Batch keeps its slot (and the mapping) alive until it is destroyed, even after
// the Consumer is gone; the slot is released to the server then. Destroying the Consumer tells
// the server it wants no more chunks (Goodbye). Constructing and closing one also removes this
// user's pool segments whose server died (shm/slot_pool.h, remove_stale_segments).
// Errors, each message opening with words that say which case it is:
//   "no server yet: ..."  TimeoutError from the constructor: nothing answered within timeout_s;
//   "server gone: ..."    ServerGoneError from next(): the server answered, then died (pid check
//                         on one host) or went silent (heartbeats otherwise);
//   "server failed: REASON ..."  Error from next() (the server's error message), or from the
//                         constructor when the server recorded a failure and exited (ipc
//                         endpoints: protocol::failure_record_path);
// TimeoutError ("no data ...") from next() when a live server sends nothing in timeout_s (never
// with timeout_s <= 0: then only a dead or silent server ends the wait, as ServerGoneError),
// and PositionUnavailableError ("position unavailable: ...") from the next() after a seek()
// the server refused.
// Nothing waits in silence: while no server answers (the constructor), or while next() waits for
// data, after 3 s and every 10 s it calls options.on_waiting with what it waits for: no server
// at the endpoint; min_consumers not met (n of m); a named consumer holding the stream back (as
// the server's heartbeats say); else the server's producer (spdlog warning when it is empty).
// The TimeoutError of next() names the same.
// Thread-safety: one thread at a time may call next(); Batches may be destroyed on any thread.
//
// GPU pools (server --device cuda:K, CUDA builds): the server's arena and its per-slot events are
// opened once at the welcome, on the GPU found by UUID (a pool on several GPUs has one arena per
// GPU: the consumer opens the one on options.cuda_device); tensors are device pointers
// (TensorView::device == kCuda). Before work on a stream reads a batch, Batch::use_on_stream()
// makes that stream wait for the producer's event (no host blocking, no device-wide sync). When
// the batch is destroyed an event is recorded on that stream and the slot's Release is sent by
// the I/O thread only once the event has completed, so no slot is rewritten while a kernel still
// reads it. Copies (batches spanning chunks, or beyond max_held) are device-to-device on the
// consumer's own copy stream. A consumer on a GPU the pool is not on gets a clear Error (no
// peer copy): options.cuda_device must be one of the pool's GPUs or -1.
// Host pools with pin_memory (CUDA builds): the mapping is page-locked once at the welcome, so
// views (Batch::pinned) can be copied to a GPU asynchronously; after use_on_stream(stream) the
// slot is released only once that stream's work up to the batch's destruction has completed.
//
// Inside (client/README.md): a Session talks to the server, a Rebatcher decides which rows form
// each batch, an Assembler (host or CUDA) builds it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "client/rebatcher.h"
#include "protocol/messages.h"

namespace batchcast {

struct ConsumerOptions {
  std::string endpoint;     // empty: protocol::default_endpoint()
  uint32_t batch_size = 0;  // samples per batch; 0: the server's batch size
  bool drop_last = false;   // drop each epoch's short last batch, as torch's DataLoader does
  double timeout_s = 60.0;  // longest wait for the server's welcome or for data; <= 0: forever
  uint32_t prefetch = 2;    // chunk descriptors asked for ahead: hides the round trip
  // Zero-copy batches alive at once before further ones become private copies, so a user who
  // keeps every batch cannot pin the whole ring and stall the server. Lowered to what the
  // server's ring leaves (its slots minus the chunks one batch spans) when that is smaller.
  uint32_t max_held = 2;
  protocol::LateJoin late_join = protocol::LateJoin::kReplay;
  std::string name;  // shown in the server's log and metrics
  // GPU pools: the CUDA device (this process's index) the consumer computes on; -1: the
  // current device if the pool is on it, else the pool's first GPU this process sees. A GPU the
  // pool is not on is refused with an Error naming the pool's GPUs (serve --device lists them).
  int cuda_device = -1;
  // Host pools, CUDA builds: page-lock the pool's mapping once so batches copy to cuda_device
  // (-1: the current device) asynchronously; a batch's slot is then released only after the
  // work on its stream (Batch::use_on_stream) has completed. Failing to pin is logged once and
  // leaves batches pageable (Batch::pinned says which).
  bool pin_memory = false;
  // Seconds this consumer may hold the stream back before the server frees the others from it
  // (stall policy decouple: it then reads what it missed as private chunks); 0: the
  // server's --stall-timeout.
  double stall_timeout_s = 0;
  // The view it reads (docs/views.md): a view text over the server's transform, e.g.
  // "size=160,crop=center"; empty: the server's own. A view the server cannot make is refused
  // with an Error naming the field.
  std::string view;
  // The order it reads each epoch in (docs/stream.md, "Order"): kExact the stream's, kRelaxed
  // its shard once in the server's choice of order (each chunk's rows copied on arrival, its
  // batches copies: client/chunk_copy.h), kServer the server's default (serve --order).
  protocol::Order order = protocol::Order::kServer;
  // Called with what it waits for, on the waiting thread, holding no lock (see Errors above).
  std::function<void(const std::string& what, double waited_s)> on_waiting;
};

// One tensor of a batch: a strided view (element strides) of memory owned by its Batch.
struct TensorView {
  std::string name;
  DType dtype = DType::kUInt8;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
  void* data = nullptr;
  protocol::DeviceKind device = protocol::DeviceKind::kCpu;
  uint32_t device_index = 0;
};

class Session;
struct ChunkRef;
class Assembler;
class BatchDeviceState;

class Batch {
 public:
  ~Batch();
  Batch(const Batch&) = delete;
  Batch& operator=(const Batch&) = delete;

  uint64_t epoch = 0;
  uint64_t sample_start = 0;  // position of its first sample inside the epoch
  uint32_t size = 0;
  // Relaxed order: the dataset index of each of its samples (what a resume keeps of the epoch's
  // samples had); empty in exact order, where the position says which samples it holds.
  std::vector<uint32_t> samples;
  bool copied = false;  // private memory, no view of a shared slot (counted in stats().copies)
  // A host view of page-locked memory (ConsumerOptions::pin_memory): copy it to the GPU
  // asynchronously after use_on_stream(stream), on that stream.
  bool pinned = false;
  std::vector<TensorView> tensors;

  // CUDA batches: work enqueued on `stream` from now on waits (on the device) until the server
  // has written this batch; the slot is released only after the work enqueued on the stream of
  // the last call, up to the batch's destruction, has completed. `stream` is a cudaStream_t as
  // an integer: 0 or 1 = the legacy default stream, 2 = the per-thread default stream. Call it
  // before reading the tensors on the device. Pinned host batches: the slot is released only
  // after that stream's work up to the batch's destruction. No-op for other host batches.
  void use_on_stream(uintptr_t stream);

 private:
  friend class Consumer;
  friend class HostAssembler;
  friend class CudaAssembler;
  friend class PinnedHostAssembler;
  Batch() = default;
  std::vector<std::shared_ptr<ChunkRef>> chunks_;  // zero-copy: the chunk it views
  std::vector<std::unique_ptr<uint8_t[]>> owned_;  // host copies
  std::shared_ptr<Session> session_;               // counts it against max_held
  std::unique_ptr<BatchDeviceState> device_;       // GPU pools only (client/assembler.h)
};

struct ConsumerStats {
  uint64_t batches = 0;
  uint64_t samples = 0;
  uint64_t skipped = 0;  // samples missed: late join into a partial epoch, or left behind (skip)
  uint64_t copies = 0;   // batches that are private copies (Batch::copied)
  double wait_s = 0;     // time next() waited for data
  uint64_t dropped_messages = 0;
};

class Consumer {
 public:
  explicit Consumer(ConsumerOptions options);
  ~Consumer();
  Consumer(const Consumer&) = delete;
  Consumer& operator=(const Consumer&) = delete;

  // The next batch of the current epoch; nullptr at its end (the next call starts the next).
  std::shared_ptr<Batch> next();
  // True once the server's last chunk was consumed: every further next() returns nullptr.
  bool finished() const { return rebatcher_.finished(); }
  // Epoch of the batches being yielded (the last one started).
  uint64_t epoch() const { return rebatcher_.epoch(); }
  // Moves to sample `sample` of epoch `epoch`, for the next iteration: the next next() starts
  // there and yields the rest of that epoch (then the epochs after it). What was in flight for
  // the old position is released unread. To leave an epoch early (break), seek to
  // (position().first + 1, 0): nothing of the rest is drained. Positions the server no longer
  // holds are regenerated where its producer can; else next() throws PositionUnavailableError
  // and the consumer goes on at the stream's newest chunk unless it seeks again
  // (docs/stream.md, "Positions").
  // Relaxed order (order() kRelaxed): a position inside an epoch resumes it after the samples
  // had there, `had` (a bit per dataset index, as many as `sample`: Batch::samples of the
  // batches yielded): the rest of its shard follows. The server refuses a set that is not that
  // many samples of this consumer's shard (PositionUnavailableError, naming the fault).
  void seek(uint64_t epoch, uint64_t sample = 0, std::vector<uint64_t> had = {});
  // (epoch, sample in epoch) of the next sample next() will yield, as Rebatcher::position()
  // says; the pending seek's target once seek() was called. Resuming a consumer at this
  // position (seek) continues exactly where this one stopped.
  std::pair<uint64_t, uint64_t> position() const;
  uint32_t batch_size() const { return rebatcher_.batch_size(); }
  // The order the server serves this consumer in (kExact or kRelaxed; options.order asks).
  protocol::Order order() const;
  // Batches per whole epoch; nullopt while the server does not know the epoch's length.
  std::optional<uint64_t> batches_per_epoch() const;
  ConsumerStats stats() const;
  const protocol::Welcome& welcome() const;
  // GPU pools: the GPU (this process's index) its batches are on; -1 for host pools.
  int cuda_device() const;
  // Tells the server this consumer wants no more chunks. Batches already out stay valid.
  void close();

 private:
  std::shared_ptr<ChunkRef> pop_chunk();
  std::shared_ptr<Batch> take_batch(const BatchSpan& span);

  ConsumerOptions options_;
  std::shared_ptr<Session> session_;
  Rebatcher rebatcher_;
  std::unique_ptr<Assembler> assembler_;
  std::shared_ptr<ChunkRef> chunk_;  // the chunk the rebatcher cuts (the last one received)
  struct PendingSeek {
    protocol::Seek target;
    std::vector<uint64_t> had;
  };
  std::optional<PendingSeek> pending_seek_;  // applied by the next next()
  std::vector<uint32_t> samples_;            // Batch::samples of the batch being cut
  ConsumerStats stats_;
};

}  // namespace batchcast
