// StreamHost: the producer side of the transport, the I/O shell around StreamState. It owns the
// batch pool (SlotPool), a ZeroMQ ROUTER socket, the event-loop thread and the clock, and feeds
// StreamState (which holds the stream semantics of docs/stream.md: ordering, reuse, late
// join, stall policy, liveness, End) with every message, producer call and tick under its mutex.
//
// Producers (the native pipeline, the Python Producer, the synthetic source) talk to it through
// acquire() / publish(): acquire() blocks until a slot may be (re)filled and hands it out with
// the next stream sequence number; publish() may be called in any order, and chunks are
// published to consumers in sequence order. A producer that can fill any chunk again (options.
// regenerates) also serves acquire_private(): chunks asked for by consumers catching up on
// positions the ring no longer holds, until every consumer got End.
//
// Threads: one internal event-loop thread owns the socket and does all I/O. Every public method
// is thread-safe. Lifetime: the constructor removes stale segments of dead servers, creates the
// pool (mode 0600) and binds the endpoint (an ipc socket file is made 0600); the destructor
// stops the loop, closes the socket (removing the ipc file) and unlinks the pool.
// Failure record (ipc endpoints): a failed stream's message is also written, 0600, to
// protocol::failure_record_path(), so that a consumer arriving after this process exited still
// learns why; it outlives the process on purpose and the next server binding the endpoint
// removes it.
// Views (stream_state.h, docs/views.md): the pool above is view 0's; serve_view() (or a
// consumer's Hello.view that options.find_view maps to a new view) creates a further pool with the
// same slot count, laid out for that view's tensors (segment "<pool>.v<K>", removed with the core).
// A lease carries the slot of every view that existed when it was acquired (a private chunk's
// only in its consumer's view; FillLease::views). A GPU pool's view
// has its own arenas on the same GPUs (a header segment "<pool>.v<K>" as for view 0).
// GPU pools (cuda_devices set, CUDA builds only): the slots are an ArenaSet, one arena per GPU
// listed (the first is where producers write; shm/arena_set.h), created before the endpoint is
// bound and freed after the loop stops; the shared segment keeps the header and sequence words;
// FillLease::data is then device memory on the first GPU.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "protocol/messages.h"
#include "server/stream/stream_state.h"
#include "shm/slot_memory.h"

namespace zmq {
class context_t;
class socket_t;
}  // namespace zmq

namespace batchcast {

struct StreamHostOptions {
  // Where consumers connect. ipc://PATH (local; socket file made 0600) or tcp://HOST:PORT
  // (a wildcard host binds 127.0.0.1 unless allow_remote).
  std::string endpoint = "";  // empty: protocol::default_endpoint()
  bool allow_remote = false;  // let tcp://*:PORT listen on every interface
  // Pool geometry: K slots of slot_bytes each. More slots = more lag allowed between consumers
  // and more retained chunks for late joiners, at slot_bytes each.
  uint32_t ring_slots = 8;
  // Bytes the pools of all the stream's views may take together on a ring sized by memory: a
  // view added later shrinks the ring to fit (StreamState::shrink_ring, at least min_ring_slots
  // slots). 0: a fixed ring; views get ring_slots slots each.
  uint64_t ring_budget = 0;
  uint32_t min_ring_slots = 8;  // the fewest usable slots a view added later leaves the ring
  // Chunks the producer may fill ahead of every reader (StreamRules::lead_chunks); 0: the ring.
  uint32_t lead_chunks = 0;
  uint64_t slot_bytes = 0;     // required
  uint32_t chunk_size = 0;     // the chunk size, announced to consumers as their default batch size
  uint64_t epoch_samples = 0;  // samples per epoch (0: unknown until the producer says)
  uint64_t epochs = 0;         // announced; 0 = unbounded
  uint64_t first_epoch = 0;
  // The stream starts (descriptors flow) once this many consumers have attached, so that they
  // all see it from its first chunk.
  uint32_t min_consumers = 1;
  // decouple: a consumer that holds the stream back for stall_timeout_s reads regenerated
  // chunks instead (as wait without regeneration); wait: never skip data; skip: one idle this
  // long is left behind, what it misses counted.
  StallPolicy stall_policy = StallPolicy::kDecouple;
  double stall_timeout_s = kDefaultStallTimeoutS;
  double heartbeat_interval_s = 0.25;
  // Remote consumers silent this long are dropped; consumers use it to declare a silent server
  // gone. Local consumers are checked by pid every 0.2 s instead (a SIGSTOPped one is alive).
  double heartbeat_timeout_s = 2.0;
  // The producer can fill chunk (epoch, index) again, byte for byte, and serves
  // acquire_private(); chunks then hold chunk_size samples (an epoch's last one fewer).
  bool regenerates = false;
  // The order of consumers that leave it to the server (docs/stream.md, "Order"); relaxed needs
  // a producer that decodes chosen samples (the native one), else consumers read exact.
  protocol::Order default_order = protocol::Order::kExact;
  // Relaxed order needs these from a producer that regenerates: the dataset's size, the samples
  // epoch e visits (its plan), a seed for each relaxed reader's own order (StreamRules).
  uint64_t dataset_size = 0;
  std::function<std::vector<uint64_t>(uint64_t epoch)> epoch_shard;
  uint64_t seed = 0;
  // Empty: a host pool. Else the GPUs (this process's indices) that each hold the whole pool;
  // producers write on the first.
  std::vector<int> cuda_devices;
  // A consumer's Hello.view -> its view: an index below view_count(), or view_count() with the
  // new view's slot bytes and tensors (the host then adds it), or an error refusing the consumer.
  // Called on the event loop under the core's lock. Empty: only Hello.view "" (view 0) is served.
  struct ViewAnswer {
    uint32_t view = 0;
    uint64_t slot_bytes = 0;       // a new view: its slots' size
    StreamState::ViewSpecs specs;  // a new view: its tensors in its slot
    std::string error;
  };
  std::function<ViewAnswer(const std::string& view)> find_view;
};

// A slot handed to a producer to fill.
struct FillLease {
  uint64_t seq = 0;
  uint32_t slot = 0;
  uint8_t* data = nullptr;  // host memory, or device memory in a GPU pool
  uint64_t capacity = 0;
  // One entry per view that existed at acquire: the slot to fill in that view's pool, or null
  // where this chunk is not filled. A stream chunk fills every view (views[0] == data); a
  // private chunk only its consumer's view, the only one it is ever read in. A producer without
  // views (view 0 alone) writes `data`; views[0] is then never null.
  std::vector<uint8_t*> views;
  // acquire_private(): the chunk of the stream to fill again (its position is the producer's
  // to state in publish()).
  std::optional<ChunkAddress> regenerate;
  // acquire_private(): a chunk for relaxed readers (protocol::is_relaxed_seq), the dataset index
  // of each row to decode; publish() it with these samples and any position of that many.
  std::vector<uint64_t> samples;
};

class StreamHost {
 public:
  explicit StreamHost(StreamHostOptions options);
  ~StreamHost();
  StreamHost(const StreamHost&) = delete;
  StreamHost& operator=(const StreamHost&) = delete;

  // Blocks until a slot may take the next chunk; nullopt once stop() or fail() was called, or
  // the stream finished without it (finished(): its relaxed readers read every epoch).
  std::optional<FillLease> acquire();
  // Blocks until a consumer catching up needs a chunk regenerated, or relaxed readers a chunk of
  // the samples they need (FillLease::samples), and a slot may take it, or
  // timeout_s passed (negative: forever); nullopt then, or once stop() or fail() was called,
  // or every consumer got End after finish().
  std::optional<FillLease> acquire_private(double timeout_s);
  // True (and the chunk takes its stream number without a slot) when no attached consumer
  // wants the stream's next chunk, at `position`: the producer then skips decoding it.
  bool skip_unwanted(const protocol::ChunkPosition& position);
  // Hands a filled slot back; published to consumers in sequence order. `samples`: the dataset
  // index of each row, which relaxed readers take rows by (none: exact readers only).
  void publish(const FillLease& lease, const protocol::ChunkPosition& position,
               std::vector<protocol::TensorSpec> tensors, std::vector<uint64_t> samples = {});
  // No chunk follows the ones acquired so far; consumers get End after them.
  void finish();
  // The stream failed: every consumer (and any that joins later) gets `message` as an error.
  void fail(const std::string& message);
  // True once finish() was called, min_consumers attached, and every consumer was sent End (or
  // left). Waits up to timeout_s (negative: forever) or until stop().
  bool wait_finished(double timeout_s);
  bool failed() const;  // fail() was called, or an invalid chunk failed the stream
  // finish() was called, or the stream finished itself: every consumer read in relaxed order
  // and has read its last epoch (StreamState::finished).
  bool finished() const;
  // Stops the loop and wakes every waiter (SIGINT/SIGTERM/SIGHUP path). Idempotent.
  void stop();

  // The view a consumer asking for `view` (a view text) reads, made now if new, exactly as a
  // consumer's Hello makes it (options.find_view, then its pool), under the same lock, so that
  // views served up front and consumers attaching meanwhile agree. Chunks acquired from now on
  // carry it. Throws Error naming why it cannot be served.
  uint32_t serve_view(const std::string& view);
  // View `view`'s pool (0: memory()); lives as long as the host.
  const SlotMemory& view_memory(uint32_t view) const;

  // StreamState::waited_chunk() as of the event loop's last pass or the last publish():
  // lock-free, for a producer deciding sample by sample (server/produce/decode_split.h).
  std::optional<uint64_t> waited_chunk() const {
    const uint64_t seq = waited_chunk_.load(std::memory_order_relaxed);
    return seq == kNoChunk ? std::nullopt : std::optional<uint64_t>(seq);
  }
  // StreamState::samples_sent() as of the same moment, lock-free too.
  uint64_t samples_sent() const { return samples_sent_.load(std::memory_order_relaxed); }
  void set_epoch_samples(uint64_t samples);
  bool regenerates() const { return options_.regenerates; }
  StreamStats stats() const;
  const std::string& endpoint() const { return endpoint_; }
  const SlotMemory& memory() const { return memory_; }
  uint64_t consumers_now() const;
  uint64_t consumers_reading() const;  // StreamState::consumers_reading
  uint64_t consumers_ever() const;

 private:
  void loop();
  void receive_all(double now);  // drains the socket into the state
  bool send(const std::string& identity, const protocol::Message& message);
  void wake();
  // The stream has just failed (once): records `message` for later consumers, wakes producers.
  void stream_failed(const std::string& message);
  // What a consumer of `memory` (view 0's: memory_) is told about the pool.
  protocol::Welcome welcome(const SlotMemory& memory) const;
  // Under mu_: options.find_view's answer for `view`, its pool made if it is new.
  StreamState::ViewChoice choose_view_locked(const std::string& view);
  uint32_t add_view_locked(uint64_t slot_bytes, StreamState::ViewSpecs specs);  // under mu_
  FillLease lease(const StreamState::Fill& fill);  // under mu_; resets the slot's seq words
  void note_for_producers();  // under mu_: the state's waited chunk and samples sent, lock-free
  // Under mu_: frees the host memory of the slots the ring retired once their chunks went.
  void release_retired_slots(double now);
  SlotPool& view_pool(uint32_t view) {             // under mu_
    return view == 0 ? memory_.pool() : view_memory_[view - 1]->pool();
  }

  StreamHostOptions options_;
  std::string ipc_path_;  // declared before endpoint_: resolve_endpoint() fills it
  std::string endpoint_;
  std::string failure_path_;  // protocol::failure_record_path(endpoint_)
  std::string boot_id_;
  SlotMemory memory_;  // the pool: host slots, or a header segment + a GPU arena
  std::unique_ptr<zmq::context_t> context_;
  std::unique_ptr<zmq::socket_t> router_;
  int wake_fd_ = -1;

  mutable std::mutex mu_;
  std::condition_variable slot_freed_;
  std::condition_variable finished_cv_;
  // Under mu_. Built once the pool (and GPU arena) exist: its Welcome names them.
  std::optional<StreamState> state_;
  // Under mu_: the pools of views 1, 2, ... (unique_ptr: a slot pointer handed out stays valid).
  std::vector<std::unique_ptr<SlotMemory>> view_memory_;
  std::string views_closed_;  // under mu_: why no view is added any more (a view's pool failed)
  std::atomic<bool> stopping_{false};
  static constexpr uint64_t kNoChunk = ~uint64_t{0};
  std::atomic<uint64_t> waited_chunk_{kNoChunk};  // written under mu_ (note_for_producers)
  std::atomic<uint64_t> samples_sent_{0};          // likewise
  std::thread loop_thread_;
};

}  // namespace batchcast
