#include "client/session.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client/chunk_copy.h"
#include "common/error.h"
#include "common/process.h"
#include "protocol/descriptor_checks.h"
#include "protocol/endpoint.h"

namespace batchcast {

namespace {

// A wait is said after a few seconds (a server that is up answers well within this, and data
// of a live stream comes within it), then every 10 s.
constexpr double kFirstWaitingNoteS = 3.0;
constexpr double kWaitingNotePeriodS = 10.0;

// Says what the consumer waits for: through the user's callback, else at WARNING.
void say_waiting(const std::function<void(const std::string&, double)>& on_waiting,
                 const std::string& what, double waited_s) {
  if (on_waiting)
    on_waiting(what, waited_s);
  else
    spdlog::warn("{}", what);
}

double deadline_from(double timeout_s) {
  return timeout_s > 0 ? monotonic_seconds() + timeout_s : 1e300;
}

// The failure a server of this user recorded before it exited (protocol::failure_record_path),
// if any. Another user's file at that name (planted in /tmp) is not a record.
std::optional<std::string> read_failure_record(const std::string& path) {
  if (path.empty()) return std::nullopt;
  int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  struct stat st {};
  std::string text;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == ::getuid()) {
    char buf[4096];
    ssize_t n;
    while ((n = ::read(fd, buf, sizeof buf)) > 0) text.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  if (text.empty()) return std::nullopt;
  return text;
}

}  // namespace

Session::Session(const ConsumerOptions& options)
    : endpoint_(options.endpoint.empty() ? protocol::default_endpoint() : options.endpoint),
      welcome_(handshake(options)),
      server_local_(welcome_.boot_id == host_boot_id()),
      memory_(SlotMemory::attach(welcome_, options.pin_memory, options.cuda_device)) {
  copier_ = ChunkCopier::create(memory_);
  on_waiting_ = options.on_waiting;
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  last_heard_ = monotonic_seconds();
  thread_ = std::thread([this] { loop(); });
}

protocol::Welcome Session::handshake(const ConsumerOptions& options) {
  socket_.set(zmq::sockopt::linger, 200);  // let a goodbye and final releases go out
  socket_.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(protocol::kMaxMessageBytes));
  socket_.set(zmq::sockopt::rcvhwm, 100000);
  socket_.set(zmq::sockopt::sndhwm, 100000);
  try {
    socket_.connect(endpoint_);
  } catch (const zmq::error_t& e) {
    throw Error("cannot connect to " + endpoint_ + ": " + e.what() +
                "; endpoints look like ipc:///tmp/NAME.sock or tcp://127.0.0.1:PORT");
  }
  protocol::Hello hello;
  hello.pid = static_cast<uint32_t>(::getpid());
  hello.boot_id = host_boot_id();
  hello.name = options.name;
  hello.late_join = options.late_join;
  hello.stall_timeout_s = options.stall_timeout_s > 0 ? options.stall_timeout_s : 0;
  hello.view = options.view;
  hello.order = options.order;
  socket_.send(zmq::buffer(protocol::encode(hello)), zmq::send_flags::none);

  const double start = monotonic_seconds();
  const double deadline = deadline_from(options.timeout_s);
  double next_waiting_note = start + kFirstWaitingNoteS;
  const std::string failure_path = protocol::failure_record_path(endpoint_);
  while (true) {
    zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1, std::chrono::milliseconds(100));
    if (item.revents & ZMQ_POLLIN) {
      zmq::message_t msg;
      (void)socket_.recv(msg, zmq::recv_flags::none);
      auto r = protocol::decode(msg.data(), msg.size());
      if (r.message && std::holds_alternative<protocol::ErrorMessage>(*r.message))
        throw Error("the server at " + endpoint_ + " refused this consumer: " +
                    std::get<protocol::ErrorMessage>(*r.message).message);
      if (!r.message || !std::holds_alternative<protocol::Welcome>(*r.message))
        throw Error("unexpected answer from " + endpoint_ + " (" +
                    (r.message ? "not a welcome" : r.error) + "); is a batchcast server there?");
      auto welcome = std::get<protocol::Welcome>(std::move(*r.message));
      if (!same_host(welcome.boot_id, host_boot_id()))
        throw Error("server at " + endpoint_ +
                    " runs on another host; batchcast shares memory "
                    "only between processes of one machine");
      return welcome;
    }
    if (auto failure = read_failure_record(failure_path))
      throw Error("server failed: " + *failure + " (recorded in " + failure_path +
                  " by the batchcast server at " + endpoint_ +
                  ", which has exited; fix the cause and start it again)");
    const double now = monotonic_seconds();
    if (now > deadline)
      throw TimeoutError("no server yet: no batchcast server answered at " + endpoint_ +
                         " within " + std::to_string(static_cast<int>(options.timeout_s)) +
                         " s; start one with `batchcast serve --endpoint " + endpoint_ + "`");
    if (now >= next_waiting_note) {
      next_waiting_note = now + kWaitingNotePeriodS;
      const std::string what = "waiting for a batchcast server at " + endpoint_ + " (" +
                               std::to_string(static_cast<int>(now - start)) +
                               " s so far): nothing answers there; start one with `batchcast "
                               "serve --endpoint " +
                               endpoint_ + "`";
      say_waiting(options.on_waiting, what, now - start);
    }
  }
}

Session::~Session() {
  bool left;
  {
    std::lock_guard lk(mu_);
    left = leaving_;
  }
  if (!left) goodbye();  // the Consumer's constructor failed after the handshake
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
  }
  wake();
  if (thread_.joinable()) thread_.join();
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

void Session::wake() {
  uint64_t one = 1;
  [[maybe_unused]] auto n = ::write(wake_fd_, &one, sizeof(one));
}

void Session::post(protocol::Message message) {
  {
    std::lock_guard lk(mu_);
    outbox_.push_back(std::move(message));
  }
  wake();
}

void Session::release(protocol::Release release, std::vector<std::shared_ptr<ReleaseFence>> after) {
  if (after.empty()) return post(release);
  {
    std::lock_guard lk(mu_);
    pending_.push_back({release, nullptr, std::move(after)});
  }
  wake();
}

void Session::free_copy(std::shared_ptr<ChunkCopy> copy,
                        std::vector<std::shared_ptr<ReleaseFence>> after) {
  if (after.empty()) return;  // nothing reads it any more: freed here
  {
    std::lock_guard lk(mu_);
    pending_.push_back({std::nullopt, std::move(copy), std::move(after)});
  }
  wake();
}

void Session::seek(protocol::Seek target) {
  {
    std::lock_guard lk(mu_);
    for (const auto& r : queue_) let_go(r.desc, r.copy != nullptr, true);
    queue_.clear();
    position_error_.clear();
    ++seeks_unanswered_;
    outbox_.push_back(target);
  }
  wake();
}

void Session::let_go(const protocol::ChunkDescriptor& d, bool copied, bool credit_back) {
  if (!copied) outbox_.push_back(protocol::Release{d.seq, d.slot});
  if (credit_back) outbox_.push_back(protocol::Credit{1});
}

void Session::goodbye() {
  {
    // Chunks delivered but never read are released now, and any arriving later too: the
    // server keeps a leaving consumer (and its slots) until it has released every chunk.
    std::lock_guard lk(mu_);
    for (const auto& r : queue_) let_go(r.desc, r.copy != nullptr, false);
    queue_.clear();
    leaving_ = true;
  }
  post(protocol::Heartbeat{samples.load(), wait_s.load(), {}});  // final counters for the metrics
  post(protocol::Goodbye{});
}

std::optional<ReceivedChunk> Session::pop(double timeout_s, double* waited) {
  std::unique_lock lk(mu_);
  double start = monotonic_seconds();
  double deadline = deadline_from(timeout_s);
  double next_note = start + kFirstWaitingNoteS;
  // What the server says holds our data back, else the producer (it has not filled the next
  // chunk: a slow or blocked producer, an epoch being regenerated).
  auto waiting_for = [&] {
    return waiting_for_.empty() ? "the server's producer to fill the next chunk" : waiting_for_;
  };
  while (true) {
    // A refused seek comes before any chunk: those that follow its reply were sent from the
    // old cursor (the reply and a descriptor can arrive together, while this thread waits).
    if (!position_error_.empty()) {
      std::string message = std::move(position_error_);
      position_error_.clear();
      throw PositionUnavailableError(message + " (batchcast server at " + endpoint_ + ")");
    }
    if (!queue_.empty()) break;
    if (!copy_error_.empty()) throw Error(copy_error_);
    if (!server_error_.empty())
      throw Error("server failed: " + server_error_ + " (reported by the batchcast server at " +
                  endpoint_ + ")");
    if (ended_) break;
    if (gone_) throw ServerGoneError(gone_reason_);
    const double now = monotonic_seconds();
    if (now > deadline)
      throw TimeoutError("no data from the batchcast server at " + endpoint_ + " within " +
                         std::to_string(static_cast<int>(timeout_s)) +
                         " s; it is alive and waits for " + waiting_for());
    if (now >= next_note) {
      next_note = now + kWaitingNotePeriodS;
      const std::string what = "waiting " + std::to_string(static_cast<int>(now - start)) +
                               " s for data from the batchcast server at " + endpoint_ +
                               ": it waits for " + waiting_for();
      lk.unlock();  // the callback may take the GIL, which a thread releasing a batch holds
      say_waiting(on_waiting_, what, now - start);
      lk.lock();
      continue;
    }
    ready_.wait_for(lk, std::chrono::milliseconds(100));
  }
  *waited = monotonic_seconds() - start;
  if (queue_.empty()) return std::nullopt;
  auto d = std::move(queue_.front());
  queue_.pop_front();
  return d;
}

bool Session::server_gone(double now) {
  if (server_local_) return !process_alive(static_cast<pid_t>(welcome_.server_pid));
  return now - last_heard_ > welcome_.heartbeat_timeout_s;
}

void Session::on_message(const void* data, size_t size, double now) {
  auto r = protocol::decode(data, size);
  if (!r.message) {
    dropped++;
    return;
  }
  last_heard_ = now;
  if (auto* d = std::get_if<protocol::ChunkDescriptor>(&*r.message))
    return on_descriptor(std::move(*d));
  std::lock_guard lk(mu_);
  if (std::holds_alternative<protocol::End>(*r.message)) {
    ended_ = true;
  } else if (auto* reply = std::get_if<protocol::SeekReply>(&*r.message)) {
    if (seeks_unanswered_ && --seeks_unanswered_ == 0 && !reply->available)
      position_error_ = reply->message;
  } else if (auto* e = std::get_if<protocol::ErrorMessage>(&*r.message)) {
    server_error_ = e->message;
  } else if (auto* hb = std::get_if<protocol::Heartbeat>(&*r.message)) {
    waiting_for_ = hb->waiting_for;
  } else {
    dropped++;
  }
  ready_.notify_all();
}

void Session::on_descriptor(protocol::ChunkDescriptor d) {
  {
    std::lock_guard lk(mu_);
    if (seeks_unanswered_) return let_go(d, false, true);  // sent for the cursor before the seek
    auto invalid = protocol::validate_descriptor(d, welcome_.slot_count, welcome_.slot_bytes);
    if (invalid.empty() && memory_.pool().slot_seq(d.slot) != d.seq)
      invalid = "slot " + std::to_string(d.slot) + " does not hold chunk " + std::to_string(d.seq);
    if (!invalid.empty()) {
      dropped++;
      spdlog::warn("dropped a descriptor from {}: {}", endpoint_, invalid);
      return let_go(d, false, false);
    }
    // After a failed copy of taken rows nothing is handed out: pop() raises why.
    if (leaving_ || !copy_error_.empty()) return let_go(d, false, false);
    if (!protocol::is_private_seq(d.seq) && d.take.empty()) {
      queue_.push_back({std::move(d), nullptr});
      ready_.notify_all();
      return;
    }
  }
  // A private chunk, or the rows this consumer takes of a chunk: copied now and the slot
  // released, however long it waits to be read (client/chunk_copy.h). Outside the lock, so that
  // pop(), seek() and releases do not wait for the copy.
  ReceivedChunk received{std::move(d), nullptr};
  try {
    auto copied = copier_->copy(received.desc);
    received.copy = std::move(copied.copy);
    received.desc = std::move(copied.desc);  // the same chunk number and slot
    release({received.desc.seq, received.desc.slot}, std::move(copied.release_after));
  } catch (const std::exception& e) {
    if (!received.desc.take.empty()) {  // its tensors are the slot's chunk, not this reader's
      std::lock_guard lk(mu_);
      copy_error_ = "could not copy the rows this consumer takes out of slot " +
                    std::to_string(received.desc.slot) + " (" + e.what() +
                    "); free memory (GPU memory for a pool on a GPU), or read in exact order";
      let_go(received.desc, false, false);
      ready_.notify_all();
      return;
    }
    if (!copy_failed_)
      spdlog::warn(
          "could not copy a private chunk out of its slot ({}); such chunks stay in their "
          "slots until read, which can stall several consumers catching up at once",
          e.what());
    copy_failed_ = true;
  }
  std::lock_guard lk(mu_);
  // A seek (or Goodbye) while it was copied: it was sent for the old cursor.
  if (seeks_unanswered_) return let_go(received.desc, received.copy != nullptr, true);
  if (leaving_) return let_go(received.desc, received.copy != nullptr, false);
  queue_.push_back(std::move(received));
  ready_.notify_all();
}

void Session::loop() {
  zmq::pollitem_t items[] = {{socket_.handle(), 0, ZMQ_POLLIN, 0},
                             {nullptr, wake_fd_, ZMQ_POLLIN, 0}};
  double next_heartbeat = 0, next_check = 0;
  bool stopping = false;
  double stop_by = 0;
  std::vector<Pending> waiting;  // releases and copies whose fences have not all passed
  while (true) {
    // A release waiting on the GPU: poll its fences often.
    zmq::poll(items, 2, std::chrono::milliseconds(waiting.empty() ? 50 : 1));
    if (items[1].revents & ZMQ_POLLIN) {
      uint64_t v;
      [[maybe_unused]] auto n = ::read(wake_fd_, &v, sizeof(v));
    }
    double now = monotonic_seconds();
    zmq::message_t msg;
    while (socket_.recv(msg, zmq::recv_flags::dontwait)) on_message(msg.data(), msg.size(), now);
    std::vector<protocol::Message> out;
    {
      std::lock_guard lk(mu_);
      out.swap(outbox_);
      stopping = stopping_;
      for (auto& p : pending_) waiting.push_back(std::move(p));
      pending_.clear();
    }
    for (auto it = waiting.begin(); it != waiting.end();) {
      bool passed = true;
      for (const auto& f : it->after) {
        if (!f->passed()) {
          passed = false;
          break;
        }
      }
      if (!passed) {
        ++it;
        continue;
      }
      if (it->release) out.push_back(*it->release);
      it = waiting.erase(it);  // and a copy waiting for its readers is freed
    }
    if (now >= next_heartbeat) {
      out.push_back(protocol::Heartbeat{samples.load(), wait_s.load(), {}});
      next_heartbeat = now + welcome_.heartbeat_interval_s;
    }
    for (const auto& m : out)
      socket_.send(zmq::buffer(protocol::encode(m)), zmq::send_flags::dontwait);
    if (stopping) {
      // Chunks the server sent before it read our Goodbye may still be on their way: each is
      // released as it arrives (leaving_), until the End it answers Goodbye with says nothing
      // follows. Leaving at once kept their slots held until this process exited. Releases
      // still waiting for this process's GPU work are waited for too (the server keeps a
      // leaving consumer's slots until released), polled rather than blocked on, so that
      // device work that never completes (a hung GPU) delays leaving by kFenceGrace_s at most.
      // A server that is gone, or silent for its heartbeat timeout, is not waited for.
      if (!stop_by) stop_by = now + welcome_.heartbeat_timeout_s;
      std::lock_guard lk(mu_);
      if (gone_ || server_gone(now)) break;
      if (waiting.empty() && (ended_ || now >= stop_by)) break;
      if (now >= stop_by + kFenceGrace_s) {
        spdlog::warn(
            "leaving the batchcast server at {} with {} release(s) still waiting for this "
            "process's GPU work after {:.0f} s: the server keeps those slots until this process "
            "exits",
            endpoint_, waiting.size(), welcome_.heartbeat_timeout_s + kFenceGrace_s);
        break;
      }
    }
    if (now >= next_check) {
      next_check = now + 0.2;
      std::lock_guard lk(mu_);
      if (!ended_ && !gone_ && server_gone(now)) {
        gone_ = true;
        gone_reason_ = "server gone: the batchcast server at " + endpoint_ + " (pid " +
                       std::to_string(welcome_.server_pid) + ") is gone: it " +
                       (server_local_ ? "exited or was killed" : "stopped answering heartbeats") +
                       " before the end of the stream";
        ready_.notify_all();
      }
    }
  }
}

ChunkRef::ChunkRef(std::shared_ptr<Session> s, ReceivedChunk received)
    : session(std::move(s)),
      desc(std::move(received.desc)),
      copy(std::move(received.copy)),
      base(copy ? copy->data() : session->memory().slot_data(desc.slot)) {}

ChunkRef::~ChunkRef() {
  if (copy) {
    session->free_copy(std::move(copy), std::move(fences_));
    return;
  }
  // Nothing views the slot any more: what this process wrote into it goes before the server
  // may refill it (shm/slot_memory.h).
  session->memory().discard_writes(desc.slot);
  session->release({desc.seq, desc.slot}, std::move(fences_));
}

void ChunkRef::add_fence(std::shared_ptr<ReleaseFence> fence) {
  std::lock_guard lk(mu_);
  fences_.push_back(std::move(fence));
}

}  // namespace batchcast
