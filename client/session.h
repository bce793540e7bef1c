// Session: the connection behind a Consumer.
//
// The constructor does the handshake on the caller's thread (Hello, then Welcome within
// timeout_s) and maps the pool (SlotMemory). Then an I/O thread owns the DEALER socket: it
// receives descriptors, heartbeats, End and errors, and sends the credits, releases and
// heartbeats other threads queue (woken through an eventfd). A private chunk (regenerated for
// this consumer alone), and the rows a relaxed consumer takes of a chunk (a descriptor's take),
// are copied out of their slot as they arrive and the slot released at once, whether or not
// anyone reads them yet (client/chunk_copy.h says why); the queue then holds the copy's
// descriptor (the taken rows compacted). Rows that cannot be copied (out of memory) end the
// session's data: pop() raises Error saying why once the chunks before them are read. A seek()
// drops what was sent for the old cursor until the server answers it. It heartbeats every
// heartbeat_interval_s and watches the server: by pid on the same host, by silence past the
// heartbeat timeout otherwise; pop() then throws ServerGoneError instead of waiting forever.
//
// Releases of GPU slots may wait for device work still reading them: release() takes fences,
// and the I/O thread sends the Release only once every fence has passed; free_copy() likewise
// keeps a private chunk's copy until its readers are done.
// Ownership and lifetime: shared by the Consumer and every ChunkRef, so the socket and the
// mapping outlive the Consumer while batches still view the pool. Destruction (nothing is held
// any more) sends the releases still queued and Goodbye if goodbye() was not called, then
// keeps the thread until the server's End (its answer to Goodbye): chunks it sent before it
// read the Goodbye are released as they arrive, instead of staying held until this process
// exits. It waits at most the heartbeat timeout, and not at all for a server that is gone.
// Thread-safety: pop() from one thread at a time; release(), free_copy(), post() and the
// counters from any.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "client/consumer.h"
#include "protocol/messages.h"
#include "shm/slot_memory.h"

namespace batchcast {

// Something a slot's release waits for (GPU pools: device work still reading the slot).
class ReleaseFence {
 public:
  virtual ~ReleaseFence() = default;
  // True once passed; never blocks (the I/O thread polls it). Called on the session's I/O
  // thread only. Never throws.
  virtual bool passed() noexcept = 0;
};

class ChunkCopy;
class ChunkCopier;

// A descriptor popped from the session, with the copy of its rows if it was copied on arrival
// (a private chunk, or rows taken: `desc` then describes the copy).
struct ReceivedChunk {
  protocol::ChunkDescriptor desc;
  std::shared_ptr<ChunkCopy> copy;  // its slot was released on arrival
};

class Session {
 public:
  // Throws TimeoutError when no server answers within options.timeout_s, Error when the
  // server at the endpoint recorded a failure and exited, or for any other failure. Reports
  // waits (here and in pop()) through options.on_waiting (client/consumer.h says when).
  explicit Session(const ConsumerOptions& options);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Blocks for the next descriptor. nullopt once End was received and the queue is empty.
  // Throws Error (the server's message, or rows to take that could not be copied),
  // ServerGoneError, TimeoutError (after timeout_s, unless timeout_s <= 0), or
  // PositionUnavailableError (the server's answer to the last seek()).
  std::optional<ReceivedChunk> pop(double timeout_s, double* waited);
  void post(protocol::Message message);
  // Asks the server to move this consumer's cursor. Descriptors queued or in flight until the
  // server's SeekReply were sent for the old cursor: they are released unread (their credits
  // given back), so the next pop() returns the sought position's chunk.
  void seek(protocol::Seek target);
  // Sends the Release for a chunk once every fence in `after` has passed (at once if none).
  void release(protocol::Release release, std::vector<std::shared_ptr<ReleaseFence>> after);
  // Frees a private chunk's copy once every fence in `after` (its readers' work) has passed.
  void free_copy(std::shared_ptr<ChunkCopy> copy, std::vector<std::shared_ptr<ReleaseFence>> after);
  void goodbye();

  const protocol::Welcome& welcome() const { return welcome_; }
  const SlotMemory& memory() const { return memory_; }
  const std::string& endpoint() const { return endpoint_; }

  std::atomic<uint32_t> held{0};  // zero-copy batches alive
  std::atomic<uint64_t> samples{0};
  std::atomic<uint64_t> dropped{0};
  std::atomic<double> wait_s{0};

 private:
  // How long a leaving session waits, past its heartbeat timeout, for GPU work still reading
  // slots before it leaves them held (the server frees them when this process exits).
  static constexpr double kFenceGrace_s = 30.0;
  // What waits for fences: a slot's Release, or a private chunk's copy to be freed.
  struct Pending {
    std::optional<protocol::Release> release;
    std::shared_ptr<ChunkCopy> copy;
    std::vector<std::shared_ptr<ReleaseFence>> after;
  };

  protocol::Welcome handshake(const ConsumerOptions& options);  // on the caller's thread
  void loop();
  void on_message(const void* data, size_t size, double now);
  // A valid descriptor that arrived (I/O thread): queued, private chunks copied first.
  void on_descriptor(protocol::ChunkDescriptor d);
  bool server_gone(double now);
  void wake();
  // With mu_ held: gives back a chunk that is never handed out (dropped, sent before a seek,
  // arriving while leaving): its slot, unless it was copied and released on arrival;
  // `credit_back` asks for another in its place.
  void let_go(const protocol::ChunkDescriptor& d, bool copied, bool credit_back);

  std::string endpoint_;
  zmq::context_t context_{1};
  zmq::socket_t socket_{context_, zmq::socket_type::dealer};
  protocol::Welcome welcome_;
  bool server_local_;  // the server's pid can be checked
  SlotMemory memory_;
  std::unique_ptr<ChunkCopier> copier_;  // used by the I/O thread only
  bool copy_failed_ = false;             // logged once; I/O thread only
  int wake_fd_ = -1;

  std::mutex mu_;
  std::condition_variable ready_;
  std::deque<ReceivedChunk> queue_;
  std::vector<protocol::Message> outbox_;
  std::vector<Pending> pending_;  // taken by the I/O thread
  bool ended_ = false;
  uint32_t seeks_unanswered_ = 0;  // descriptors arriving meanwhile are stale
  std::string position_error_;     // the last seek was refused; pop() raises it once
  bool gone_ = false;
  bool stopping_ = false;
  bool leaving_ = false;  // goodbye() was posted: chunks that arrive are released at once
  std::string gone_reason_;
  std::string server_error_;
  std::string copy_error_;   // rows to take could not be copied out: pop() raises it
  std::string waiting_for_;  // the server's last heartbeat: what holds our data back
  std::function<void(const std::string&, double)> on_waiting_;
  double last_heard_ = 0;
  std::thread thread_;
};

// One received chunk, shared by the batches viewing it; the last owner releases its slot (or,
// for a private chunk, frees its copy).
struct ChunkRef {
  std::shared_ptr<Session> session;
  protocol::ChunkDescriptor desc;
  std::shared_ptr<ChunkCopy> copy;  // chunks copied on arrival (ReceivedChunk): their rows
  const uint8_t* base = nullptr;    // the rows' memory (host or device): the slot's, or the copy's

  ChunkRef(std::shared_ptr<Session> s, ReceivedChunk received);
  ~ChunkRef();
  ChunkRef(const ChunkRef&) = delete;
  ChunkRef& operator=(const ChunkRef&) = delete;
  // The slot is released (the copy freed) only once `fence` has passed too.
  void add_fence(std::shared_ptr<ReleaseFence> fence);

 private:
  std::mutex mu_;
  std::vector<std::shared_ptr<ReleaseFence>> fences_;
};

}  // namespace batchcast
