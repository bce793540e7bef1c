// Session: the connection behind a Consumer.
//
// The constructor does the handshake on the caller's thread (Hello, then Welcome within
// timeout_s) and maps the pool (SlotMemory). Then an I/O thread owns the DEALER socket: it
// receives descriptors, heartbeats, End and errors, and sends the credits, releases and
// heartbeats other threads queue (woken through an eventfd). A seek() drops what was sent for
// the old cursor until the server answers it. It heartbeats every
// heartbeat_interval_s and watches the server: by pid on the same host, by silence past the
// heartbeat timeout otherwise; pop() then throws ServerGoneError instead of waiting forever.
//
// Releases of GPU slots may wait for device work still reading them: release() takes fences,
// and the I/O thread sends the Release only once every fence has passed.
// Ownership and lifetime: shared by the Consumer and every ChunkRef, so the socket and the
// mapping outlive the Consumer while batches still view the pool. Destruction stops the thread
// after sending Goodbye and the releases still queued.
// Thread-safety: pop() from one thread at a time; release(), post() and the counters from any.
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
  // True once passed; wait: block until it has (the session is going away). Called on the
  // session's I/O thread only. Never throws.
  virtual bool passed(bool wait) noexcept = 0;
};

class Session {
 public:
  // Throws TimeoutError when no server answers within options.timeout_s, Error when the
  // server at the endpoint recorded a failure and exited, or for any other failure. Reports
  // the wait through options.on_waiting (client/consumer.h says when).
  explicit Session(const ConsumerOptions& options);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Blocks for the next descriptor. nullopt once End was received and the queue is empty.
  // Throws Error (the server's message), ServerGoneError, TimeoutError (after timeout_s, unless
  // timeout_s <= 0), or PositionUnavailableError (the server's answer to the last seek()).
  std::optional<protocol::BatchDescriptor> pop(double timeout_s, double* waited);
  void post(protocol::Message message);
  // Asks the server to move this consumer's cursor. Descriptors queued or in flight until the
  // server's SeekReply were sent for the old cursor: they are released unread (their credits
  // given back), so the next pop() returns the sought position's chunk.
  void seek(protocol::Seek target);
  // Sends the Release for a chunk once every fence in `after` has passed (at once if none).
  void release(protocol::Release release, std::vector<std::shared_ptr<ReleaseFence>> after);
  void goodbye();

  const protocol::Welcome& welcome() const { return welcome_; }
  const SlotMemory& memory() const { return memory_; }
  const std::string& endpoint() const { return endpoint_; }

  std::atomic<uint32_t> held{0};  // zero-copy batches alive
  std::atomic<uint64_t> samples{0};
  std::atomic<uint64_t> dropped{0};
  std::atomic<double> wait_s{0};

 private:
  struct PendingRelease {
    protocol::Release release;
    std::vector<std::shared_ptr<ReleaseFence>> after;
  };

  protocol::Welcome handshake(const ConsumerOptions& options);  // on the caller's thread
  void loop();
  void on_message(const void* data, size_t size, double now);
  bool server_gone(double now);
  void wake();
  // With mu_ held: gives back a chunk that is never handed out (dropped, sent before a seek,
  // arriving while leaving); `credit_back` asks for another in its place.
  void let_go(const protocol::BatchDescriptor& d, bool credit_back);

  std::string endpoint_;
  zmq::context_t context_{1};
  zmq::socket_t socket_{context_, zmq::socket_type::dealer};
  protocol::Welcome welcome_;
  bool server_local_;  // the server's pid can be checked
  SlotMemory memory_;
  int wake_fd_ = -1;

  std::mutex mu_;
  std::condition_variable ready_;
  std::deque<protocol::BatchDescriptor> queue_;
  std::vector<protocol::Message> outbox_;
  std::vector<PendingRelease> pending_;  // taken by the I/O thread
  bool ended_ = false;
  uint32_t seeks_unanswered_ = 0;  // descriptors arriving meanwhile are stale
  std::string position_error_;     // the last seek was refused; pop() raises it once
  bool gone_ = false;
  bool stopping_ = false;
  bool leaving_ = false;  // goodbye() was posted: chunks that arrive are released at once
  std::string gone_reason_;
  std::string server_error_;
  double last_heard_ = 0;
  std::thread thread_;
};

// One received chunk, shared by the batches viewing it; the last owner releases its slot.
struct ChunkRef {
  std::shared_ptr<Session> session;
  protocol::BatchDescriptor desc;
  const uint8_t* base = nullptr;  // the slot's memory (host or device)

  ChunkRef(std::shared_ptr<Session> s, protocol::BatchDescriptor d);
  ~ChunkRef();
  ChunkRef(const ChunkRef&) = delete;
  ChunkRef& operator=(const ChunkRef&) = delete;
  // The slot is released only once `fence` has passed too.
  void add_fence(std::shared_ptr<ReleaseFence> fence);

 private:
  std::mutex mu_;
  std::vector<std::shared_ptr<ReleaseFence>> fences_;
};

}  // namespace batchcast
