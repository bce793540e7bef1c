#include "server/server_core.h"

#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zmq.hpp>

#include "common/error.h"
#include "common/process.h"

namespace batchcast {
namespace {

using protocol::BatchDescriptor;
using protocol::Message;

// Rewrites a wildcard tcp host to loopback unless remote consumers were allowed.
std::string resolve_endpoint(const std::string& endpoint, bool allow_remote, std::string* ipc_path) {
  std::string ep = endpoint.empty() ? protocol::default_endpoint() : endpoint;
  if (ep.rfind("ipc://", 0) == 0) {
    *ipc_path = ep.substr(6);
    if (ipc_path->empty()) throw Error("endpoint " + ep + " has no path; use ipc:///tmp/NAME.sock");
    return ep;
  }
  if (ep.rfind("tcp://", 0) == 0) {
    auto colon = ep.rfind(':');
    if (colon == std::string::npos || colon < 6)
      throw Error("endpoint " + ep + " has no port; use tcp://127.0.0.1:PORT");
    std::string host = ep.substr(6, colon - 6);
    if ((host == "*" || host == "0.0.0.0" || host.empty()) && !allow_remote) {
      spdlog::info("binding {} on loopback only (pass allow_remote / --listen-all for every interface)", ep);
      host = "127.0.0.1";
    }
    return "tcp://" + host + ep.substr(colon);
  }
  throw Error("endpoint " + ep + ": unsupported scheme; use ipc://PATH or tcp://HOST:PORT");
}

SlotPool create_pool(const ServerOptions& o, const std::string& endpoint) {
  if (o.slot_bytes == 0) throw Error("server needs slot_bytes > 0");
  if (o.ring_slots < 2) throw Error("ring needs at least 2 slots (got " + std::to_string(o.ring_slots) + ")");
  bool device = o.device == protocol::DeviceKind::kCuda;
  if (device && o.ring_slots > protocol::kMaxCudaSlots)
    throw Error("a GPU pool has at most " + std::to_string(protocol::kMaxCudaSlots) +
                " slots (got --ring " + std::to_string(o.ring_slots) + ")");
#ifndef BATCHCAST_HAVE_CUDA
  if (device)
    throw Error("--device cuda: this build has no CUDA support (use --device cpu, or rebuild with "
                "nvcc: see scripts/README.md)");
#endif
  if (int n = remove_stale_segments())
    spdlog::info("removed {} stale shared segment(s) left by dead batchcast servers", n);
  std::string name = segment_name_for(endpoint);
  if (endpoint.find(":*") != std::string::npos) name += "." + std::to_string(::getpid());
  return SlotPool::create(name, o.ring_slots, o.slot_bytes, /*host_slots=*/!device);
}

}  // namespace

ServerCore::ServerCore(ServerOptions options)
    : options_(std::move(options)),
      endpoint_(resolve_endpoint(options_.endpoint, options_.allow_remote, &ipc_path_)),
      boot_id_(host_boot_id()),
      pool_(create_pool(options_, endpoint_)),
      ring_(options_.ring_slots) {
#ifdef BATCHCAST_HAVE_CUDA
  if (options_.device == protocol::DeviceKind::kCuda)
    arena_ = std::make_unique<DeviceArena>(DeviceArena::create(
        static_cast<int>(options_.device_index), pool_.slot_count(), pool_.slot_bytes()));
#endif
  context_ = std::make_unique<zmq::context_t>(1);
  router_ = std::make_unique<zmq::socket_t>(*context_, zmq::socket_type::router);
  router_->set(zmq::sockopt::linger, 0);
  router_->set(zmq::sockopt::sndhwm, 100000);
  router_->set(zmq::sockopt::rcvhwm, 100000);
  router_->set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(protocol::kMaxMessageBytes));
  // The ipc socket file is born owner-only: umask 077 around bind (process-wide, but only for
  // the microseconds of the bind), then chmod to be exact whatever the umask was.
  mode_t old_umask = ::umask(077);
  try {
    router_->bind(endpoint_);
  } catch (const zmq::error_t& e) {
    ::umask(old_umask);
    throw Error("cannot bind " + endpoint_ + ": " + e.what() +
                (e.num() == EADDRINUSE ? " (another process listens there; pick another endpoint)" : ""));
  }
  ::umask(old_umask);
  if (!ipc_path_.empty()) ::chmod(ipc_path_.c_str(), 0600);
  endpoint_ = router_->get(zmq::sockopt::last_endpoint);
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) throw Error("eventfd failed");
  counters_.ring_slots = options_.ring_slots;
  spdlog::info("serving on {} ({} slots x {} MiB in {})", endpoint_, options_.ring_slots,
               pool_.slot_bytes() >> 20,
               pool_.host_slots() ? "/dev/shm/" + pool_.segment_name()
                                  : "GPU memory of cuda:" + std::to_string(options_.device_index));
  loop_thread_ = std::thread([this] { loop(); });
}

ServerCore::~ServerCore() {
  stop();
  if (loop_thread_.joinable()) loop_thread_.join();
  router_.reset();
  context_.reset();
  if (!ipc_path_.empty()) ::unlink(ipc_path_.c_str());  // libzmq leaves the socket file behind
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

void ServerCore::stop() {
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
  }
  slot_freed_.notify_all();
  finished_cv_.notify_all();
  wake();
}

void ServerCore::wake() {
  uint64_t one = 1;
  if (wake_fd_ >= 0) [[maybe_unused]] auto n = ::write(wake_fd_, &one, sizeof(one));
}

std::optional<FillLease> ServerCore::acquire() {
  std::unique_lock lk(mu_);
  double start = monotonic_seconds();
  bool waited = false;
  while (true) {
    if (stopping_ || !failure_.empty()) return std::nullopt;
    auto slot = ring_.begin_fill(next_acquire_seq_, [this](uint64_t seq, bool delivered) {
      return may_reuse(seq, delivered, monotonic_seconds());
    });
    if (slot) {
      for (auto it = descriptors_.begin(); it != descriptors_.end();) {
        it = ring_.find_published(it->first) ? std::next(it) : descriptors_.erase(it);
      }
      pool_.set_slot_seq(*slot, SlotPool::kNoChunk);
      if (waited) counters_.producer_blocked_s += monotonic_seconds() - start;
      return FillLease{next_acquire_seq_++, *slot, slot_memory(*slot), pool_.slot_bytes()};
    }
    waited = true;
    // Re-check periodically: under stall_policy=skip a consumer becomes skippable with time.
    slot_freed_.wait_for(lk, std::chrono::milliseconds(50));
  }
}

uint8_t* ServerCore::slot_memory(uint32_t slot) const {
#ifdef BATCHCAST_HAVE_CUDA
  if (arena_) return arena_->slot_data(slot);
#endif
  return pool_.slot_data(slot);
}

void ServerCore::publish(const FillLease& lease, ChunkInfo info) {
  {
    std::lock_guard lk(mu_);
    ready_[lease.seq] = {lease.slot, std::move(info)};
    publish_ready();
  }
  wake();
}

void ServerCore::publish_ready() {
  for (auto it = ready_.find(next_publish_seq_); it != ready_.end();
       it = ready_.find(next_publish_seq_)) {
    auto& [slot, info] = it->second;
    BatchDescriptor d;
    d.seq = it->first;
    d.epoch = info.epoch;
    d.index_in_epoch = info.index_in_epoch;
    d.sample_start = info.sample_start;
    d.sample_count = info.sample_count;
    d.epoch_samples = info.epoch_samples ? info.epoch_samples : options_.epoch_samples;
    d.stream_position = stream_position_;
    d.flags = info.epoch_end ? protocol::kFlagEpochEnd : 0;
    d.slot = slot;
    d.tensors = std::move(info.tensors);
    auto invalid = protocol::validate_descriptor(d, pool_.slot_count(), pool_.slot_bytes());
    if (!invalid.empty()) {
      // A producer bug, not a consumer's fault: fail loudly rather than send it.
      failure_ = "producer published an invalid chunk " + std::to_string(d.seq) + ": " + invalid;
      spdlog::error("{}", failure_);
      slot_freed_.notify_all();
      return;
    }
    pool_.set_slot_seq(slot, d.seq);
    ring_.finish_fill(slot);
    stream_position_ += d.sample_count;
    counters_.chunks_published++;
    counters_.samples_published += d.sample_count;
    descriptors_[d.seq] = std::move(d);
    ready_.erase(it);
    ++next_publish_seq_;
  }
}

void ServerCore::finish() {
  {
    std::lock_guard lk(mu_);
    finished_ = true;
    end_seq_ = next_acquire_seq_;
  }
  wake();
}

void ServerCore::fail(const std::string& message) {
  {
    std::lock_guard lk(mu_);
    if (failure_.empty()) failure_ = message;
  }
  spdlog::error("stream failed: {}", message);
  slot_freed_.notify_all();
  wake();
}

bool ServerCore::wait_finished(double timeout_s) {
  std::unique_lock lk(mu_);
  auto done = [this] {
    if (stopping_ || !failure_.empty()) return true;
    if (!finished_ || !started_ || next_publish_seq_ < end_seq_) return false;
    for (const auto& [id, c] : consumers_.all())
      if (!c.end_sent && !c.closing) return false;
    return true;
  };
  if (timeout_s < 0) {
    finished_cv_.wait(lk, done);
  } else if (!finished_cv_.wait_for(lk, std::chrono::duration<double>(timeout_s), done)) {
    return false;
  }
  return failure_.empty() && !stopping_;
}

void ServerCore::set_epoch_samples(uint64_t samples) {
  std::lock_guard lk(mu_);
  options_.epoch_samples = samples;
}

uint64_t ServerCore::consumers_now() const {
  std::lock_guard lk(mu_);
  return consumers_.size();
}

uint64_t ServerCore::consumers_ever() const {
  std::lock_guard lk(mu_);
  return consumers_.ever();
}

ServerStats ServerCore::stats() const {
  std::lock_guard lk(mu_);
  ServerStats s = counters_;
  s.consumers_now = consumers_.size();
  s.consumers_ever = consumers_.ever();
  s.ring_occupied = ring_.occupied();
  for (const auto& [id, c] : consumers_.all())
    s.consumers.push_back({id, c.pid, c.name, c.samples, c.wait_s, true});
  s.consumers.insert(s.consumers.end(), departed_.begin(), departed_.end());
  return s;
}

// A chunk with no holders may be overwritten when no active consumer still has it ahead of
// its cursor, and it was delivered to someone, or some consumer's cursor is already past it (a
// consumer that joined after it and started later). A chunk nobody has seen or passed (before
// the stream starts, or while nobody is attached) is never discarded.
bool ServerCore::may_reuse(uint64_t old_seq, bool delivered, double now) const {
  bool passed = false;
  for (const auto& [id, c] : consumers_.all()) {
    if (c.next_seq > old_seq) passed = true;
    if (c.end_sent || c.closing || c.waiting_epoch_start || c.next_seq > old_seq) continue;
    bool stalled = c.credits == 0 && now - c.last_activity > options_.stall_timeout_s;
    if (options_.stall_policy == StallPolicy::kSkip && stalled) continue;
    return false;  // this consumer has not been sent the chunk yet
  }
  return delivered || (started_ && passed);
}

bool ServerCore::send(const std::string& identity, const Message& message) {
  auto bytes = protocol::encode(message);
  try {
    if (!router_->send(zmq::buffer(identity), zmq::send_flags::sndmore | zmq::send_flags::dontwait))
      return false;
    router_->send(zmq::buffer(bytes), zmq::send_flags::dontwait);
    return true;
  } catch (const zmq::error_t& e) {
    spdlog::warn("send to a consumer failed: {}", e.what());
    return false;
  }
}

void ServerCore::loop() {
  zmq::pollitem_t items[] = {{router_->handle(), 0, ZMQ_POLLIN, 0},
                             {nullptr, wake_fd_, ZMQ_POLLIN, 0}};
  double next_heartbeat = 0, next_liveness = 0;
  while (!stopping_) {
    try {
      zmq::poll(items, 2, std::chrono::milliseconds(20));
    } catch (const zmq::error_t& e) {
      if (e.num() != EINTR) spdlog::error("poll failed: {}", e.what());
      continue;
    }
    if (items[1].revents & ZMQ_POLLIN) {
      uint64_t v;
      [[maybe_unused]] auto n = ::read(wake_fd_, &v, sizeof(v));
    }
    double now = monotonic_seconds();
    std::unique_lock lk(mu_);
    for (int i = 0; i < 10000; ++i) {
      zmq::message_t identity, body;
      if (!router_->recv(identity, zmq::recv_flags::dontwait)) break;
      if (!identity.more()) {
        counters_.messages_dropped++;
        continue;
      }
      (void)router_->recv(body, zmq::recv_flags::dontwait);
      bool extra = false;
      while (body.more()) {  // a well-formed peer sends one frame; drain and drop the rest
        extra = true;
        (void)router_->recv(body, zmq::recv_flags::dontwait);
      }
      if (extra) {
        counters_.messages_dropped++;
        continue;
      }
      handle(identity.to_string(), body.data(), body.size(), now);
    }
    for (auto& [id, c] : consumers_.all()) {
      if (!failure_.empty() && !c.error_sent) {
        c.error_sent = send(c.identity, protocol::ErrorMessage{failure_.substr(0, protocol::kMaxString)});
      }
    }
    deliver();
    if (now >= next_liveness) {
      check_liveness(now);
      next_liveness = now + 0.2;
    }
    if (now >= next_heartbeat) {
      for (const auto& [id, c] : consumers_.all()) send(c.identity, protocol::Heartbeat{});
      next_heartbeat = now + options_.heartbeat_interval_s;
    }
    lk.unlock();
    slot_freed_.notify_all();
    finished_cv_.notify_all();
  }
}

void ServerCore::handle(const std::string& identity, const void* data, size_t size, double now) {
  auto result = protocol::decode(data, size);
  ConsumerRecord* c = consumers_.find_by_identity(identity);
  auto drop = [&](const std::string& why) {
    if (counters_.messages_dropped++ < 20)
      spdlog::warn("dropped a message from {}: {}",
                   c ? "consumer " + std::to_string(c->id) : std::string("an unknown peer"), why);
  };
  if (!result.message) return drop(result.error);
  const Message& m = *result.message;
  if (auto* hello = std::get_if<protocol::Hello>(&m)) {
    if (c) return drop("second hello");
    return on_hello(identity, *hello, now);
  }
  if (!c) return drop("message before hello");
  c->last_seen = now;
  if (auto* credit = std::get_if<protocol::Credit>(&m)) {
    c->credits = std::min<uint32_t>(c->credits + credit->chunks, 1024);
    c->last_activity = now;
  } else if (auto* release = std::get_if<protocol::Release>(&m)) {
    if (!ring_.release(release->slot, release->seq, c->id))
      return drop("release of chunk " + std::to_string(release->seq) + " in slot " +
                  std::to_string(release->slot) + " that it does not hold");
    c->last_activity = now;
    if (c->closing && ring_.held_by(c->id) == 0) drop_consumer(c->id, "left");
  } else if (auto* hb = std::get_if<protocol::Heartbeat>(&m)) {
    c->samples = hb->samples;
    c->wait_s = hb->wait_s;
  } else if (std::holds_alternative<protocol::Goodbye>(m)) {
    // It wants no more chunks, but batches it handed out may still view slots it holds: keep
    // those holds (and the record) until they are released or the process dies.
    c->closing = true;
    if (ring_.held_by(c->id) == 0) drop_consumer(c->id, "left");
  } else {
    drop("a server-to-consumer message type");
  }
}

void ServerCore::on_hello(const std::string& identity, const protocol::Hello& hello, double now) {
  ConsumerRecord r;
  r.identity = identity;
  r.pid = static_cast<pid_t>(hello.pid);
  r.local = !hello.boot_id.empty() && hello.boot_id == boot_id_;
  r.name = hello.name;
  r.last_seen = r.last_activity = now;
  // Start cursor, within the retained chunks that run without a gap up to the newest one (a
  // chunk still held by someone can outlive its successors, and replaying across the hole
  // would jump): the first epoch start there (a whole epoch), else the first chunk there (a
  // partial first epoch; the consumer reports what it missed), else the next chunk to be
  // published. next_epoch joiners then skip forward to an epoch start.
  std::optional<uint64_t> start;
  const auto& retained = ring_.published();
  uint64_t tail = next_publish_seq_;
  while (tail > 0 && retained.count(tail - 1)) --tail;
  for (auto it = retained.lower_bound(tail); it != retained.end(); ++it) {
    if (!start) start = it->first;
    if (descriptors_.at(it->first).index_in_epoch == 0) {
      start = it->first;
      break;
    }
  }
  r.next_seq = start.value_or(next_publish_seq_);
  r.waiting_epoch_start = hello.late_join == protocol::LateJoin::kNextEpoch;
  auto& c = consumers_.add(std::move(r));

  protocol::Welcome w;
  w.consumer_id = c.id;
  w.server_pid = static_cast<uint32_t>(::getpid());
  w.boot_id = boot_id_;
  w.segment_name = pool_.segment_name();
  w.segment_bytes = pool_.segment_bytes();
  w.slot_count = pool_.slot_count();
  w.slot_bytes = pool_.slot_bytes();
  w.slots_offset = pool_.slots_offset();
  w.server_batch_size = options_.batch_size;
  w.epoch_samples = options_.epoch_samples;
  w.epochs = options_.epochs;
  w.first_epoch = options_.first_epoch;
  w.device = options_.device;
#ifdef BATCHCAST_HAVE_CUDA
  if (arena_) {
    w.device_index = static_cast<uint32_t>(arena_->device());
    w.cuda_memory_handle = arena_->memory_handle();
    w.cuda_device_uuid = arena_->device_uuid();
    w.cuda_event_handles = arena_->event_handles();
  }
#endif
  w.heartbeat_interval_s = options_.heartbeat_interval_s;
  w.heartbeat_timeout_s = options_.heartbeat_timeout_s;
  send(identity, w);
  spdlog::info("consumer {} attached ({}pid {}{}, starts at chunk {})", c.id,
               c.name.empty() ? "" : c.name + ", ", c.pid, c.local ? "" : ", remote", c.next_seq);
}

void ServerCore::deliver() {
  if (!started_) {
    if (consumers_.size() < std::max<uint32_t>(options_.min_consumers, 1)) return;
    started_ = true;
    spdlog::info("{} consumer(s) attached: stream starts", consumers_.size());
  }
  for (auto& [id, c] : consumers_.all()) {
    while (!c.end_sent && !c.closing) {
      if (finished_ && c.next_seq >= end_seq_ && next_publish_seq_ >= end_seq_) {
        c.end_sent = send(c.identity, protocol::End{options_.epochs});
        break;
      }
      if (c.credits == 0 || c.next_seq >= next_publish_seq_) break;
      auto slot = ring_.find_published(c.next_seq);
      if (!slot) {  // reused before this consumer was sent it (late join, or left behind)
        c.next_seq = ring_.oldest_published_from(c.next_seq).value_or(next_publish_seq_);
        continue;
      }
      const auto& d = descriptors_.at(c.next_seq);
      if (c.waiting_epoch_start) {
        if (d.index_in_epoch != 0) {
          // Passed, not discarded unseen: without this, a lone next_epoch joiner would wait
          // forever for an epoch start that a full ring of unsent chunks holds back.
          ring_.mark_passed(*slot);
          ++c.next_seq;
          continue;
        }
        c.waiting_epoch_start = false;
      }
      if (!send(c.identity, d)) break;
      ring_.add_holder(*slot, c.id);
      --c.credits;
      ++c.next_seq;
      counters_.descriptors_sent++;
    }
  }
}

void ServerCore::check_liveness(double now) {
  std::vector<uint64_t> dead;
  for (const auto& [id, c] : consumers_.all()) {
    bool alive = c.local ? process_alive(c.pid) : now - c.last_seen < options_.heartbeat_timeout_s;
    if (!alive) dead.push_back(id);
  }
  for (auto id : dead) {
    counters_.consumers_died++;
    drop_consumer(id, "died");
  }
}

void ServerCore::drop_consumer(uint64_t id, const char* why) {
  auto& c = consumers_.all().at(id);
  size_t held = ring_.release_all(id);
  spdlog::info("consumer {} (pid {}) {}; released {} slot reference(s)", id, c.pid, why, held);
  if (departed_.size() >= 1000) departed_.erase(departed_.begin());
  departed_.push_back({id, c.pid, c.name, c.samples, c.wait_s, false});
  consumers_.erase(id);
}

}  // namespace batchcast
