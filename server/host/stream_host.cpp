#include "server/host/stream_host.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <zmq.hpp>

#include "common/error.h"
#include "common/process.h"
#include "protocol/endpoint.h"
#include "shm/device_identity.h"

namespace batchcast {
namespace {

// Rewrites a wildcard tcp host to loopback unless remote consumers were allowed.
std::string resolve_endpoint(const std::string& endpoint, bool allow_remote,
                             std::string* ipc_path) {
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
      spdlog::info(
          "binding {} on loopback only (pass allow_remote / --listen-all for every interface)", ep);
      host = "127.0.0.1";
    }
    return "tcp://" + host + ep.substr(colon);
  }
  throw Error("endpoint " + ep + ": unsupported scheme; use ipc://PATH or tcp://HOST:PORT");
}

SlotMemory create_pool(const StreamHostOptions& o, const std::string& endpoint) {
  if (o.slot_bytes == 0) throw Error("server needs slot_bytes > 0");
  if (o.ring_slots < 2)
    throw Error("ring needs at least 2 slots (got " + std::to_string(o.ring_slots) + ")");
  // The Welcome carries an event handle per slot and GPU.
  const size_t gpus = o.cuda_devices.size();
  if (gpus && o.ring_slots * gpus > protocol::kMaxCudaSlots)
    throw Error("a GPU pool has at most " + std::to_string(protocol::kMaxCudaSlots) +
                " slots over all its GPUs (got --ring " + std::to_string(o.ring_slots) + " on " +
                std::to_string(gpus) + " GPU(s)); lower --ring");
  if (int n = remove_stale_segments())
    spdlog::info("removed {} stale shared segment(s) left by dead batchcast servers", n);
  std::string name = segment_name_for(endpoint);
  if (endpoint.find(":*") != std::string::npos) name += "." + std::to_string(::getpid());
  return SlotMemory::create(name, o.ring_slots, o.slot_bytes, o.cuda_devices);
}

// Writes the failure record beside an ipc socket: owner-only, complete or absent (written to a
// temporary name, then renamed), so a consumer never reads half a message. O_EXCL|O_NOFOLLOW:
// the directory is usually /tmp, where another user may have planted a link at that name.
void record_failure(const std::string& path, const std::string& message) {
  const std::string tmp = path + "." + std::to_string(::getpid());
  ::unlink(tmp.c_str());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  bool ok = fd >= 0 &&
            ::write(fd, message.data(), message.size()) == static_cast<ssize_t>(message.size());
  if (fd >= 0) ok = ::close(fd) == 0 && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    spdlog::warn("cannot record the stream's failure in {}: {}", path, std::strerror(errno));
    ::unlink(tmp.c_str());
  }
}

}  // namespace

StreamHost::StreamHost(StreamHostOptions options)
    : options_(std::move(options)),
      endpoint_(resolve_endpoint(options_.endpoint, options_.allow_remote, &ipc_path_)),
      boot_id_(host_boot_id()),
      memory_(create_pool(options_, endpoint_)) {
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
    throw Error(
        "cannot bind " + endpoint_ + ": " + e.what() +
        (e.num() == EADDRINUSE ? " (another process listens there; pick another endpoint)" : ""));
  }
  ::umask(old_umask);
  if (!ipc_path_.empty()) ::chmod(ipc_path_.c_str(), 0600);
  endpoint_ = router_->get(zmq::sockopt::last_endpoint);
  failure_path_ = protocol::failure_record_path(endpoint_);
  // This endpoint answers again: a failure recorded by an earlier server no longer applies.
  if (!failure_path_.empty()) ::unlink(failure_path_.c_str());
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) throw Error("eventfd failed");
  StreamRules rules;
  rules.slot_count = memory_.pool().slot_count();
  rules.slot_bytes = memory_.pool().slot_bytes();
  rules.lead_chunks = options_.lead_chunks;
  rules.min_consumers = options_.min_consumers;
  rules.stall_policy = options_.stall_policy;
  rules.stall_timeout_s = options_.stall_timeout_s;
  rules.heartbeat_interval_s = options_.heartbeat_interval_s;
  rules.heartbeat_timeout_s = options_.heartbeat_timeout_s;
  rules.epochs = options_.epochs;
  rules.epoch_samples = options_.epoch_samples;
  rules.regenerates = options_.regenerates;
  rules.default_order = options_.default_order;
  rules.dataset_size = options_.dataset_size;
  rules.epoch_shard = options_.epoch_shard;
  rules.seed = options_.seed;
  rules.welcome = welcome(memory_);
  StreamState::ResolveView resolve;
  if (options_.find_view)
    resolve = [this](const std::string& view) { return choose_view_locked(view); };
  state_.emplace(
      std::move(rules),
      [this](const std::string& identity, const protocol::Message& m) { return send(identity, m); },
      [](pid_t pid) { return process_alive(pid); }, std::move(resolve));
  spdlog::info("serving on {} ({} slots x {:.1f} MiB in {})", endpoint_, options_.ring_slots,
               memory_.pool().slot_bytes() / double(1 << 20),
               memory_.pool().host_slots() ? "/dev/shm/" + memory_.pool().segment_name()
                                           : "GPU memory of " + cuda_list(options_.cuda_devices));
  loop_thread_ = std::thread([this] { loop(); });
}

StreamHost::~StreamHost() {
  stop();
  if (loop_thread_.joinable()) loop_thread_.join();
  router_.reset();
  context_.reset();
  if (!ipc_path_.empty()) ::unlink(ipc_path_.c_str());  // libzmq leaves the socket file behind
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

protocol::Welcome StreamHost::welcome(const SlotMemory& memory) const {
  protocol::Welcome w;
  w.server_pid = static_cast<uint32_t>(::getpid());
  w.boot_id = boot_id_;
  w.chunk_size = options_.chunk_size;
  w.epochs = options_.epochs;
  w.first_epoch = options_.first_epoch;
  memory.describe(w);  // segment, slots, device and (GPU pools) the IPC handles
  w.heartbeat_interval_s = options_.heartbeat_interval_s;
  w.heartbeat_timeout_s = options_.heartbeat_timeout_s;
  return w;
}

void StreamHost::stop() {
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
  }
  slot_freed_.notify_all();
  finished_cv_.notify_all();
  wake();
}

void StreamHost::wake() {
  uint64_t one = 1;
  if (wake_fd_ >= 0) [[maybe_unused]]
    auto n = ::write(wake_fd_, &one, sizeof(one));
}

std::optional<FillLease> StreamHost::acquire() {
  std::unique_lock lk(mu_);
  while (true) {
    if (stopping_ || state_->failed() || state_->finished()) return std::nullopt;
    if (auto fill = state_->try_acquire(monotonic_seconds())) return lease(*fill);
    // Re-check periodically: under stall_policy=skip a consumer becomes skippable with time.
    slot_freed_.wait_for(lk, std::chrono::milliseconds(50));
  }
}

std::optional<FillLease> StreamHost::acquire_private(double timeout_s) {
  std::unique_lock lk(mu_);
  const double deadline = timeout_s < 0 ? 1e300 : monotonic_seconds() + timeout_s;
  while (!stopping_ && !state_->failed() && !state_->all_ended()) {
    if (auto fill = state_->try_acquire_private(monotonic_seconds())) return lease(*fill);
    if (monotonic_seconds() >= deadline) break;
    slot_freed_.wait_for(lk, std::chrono::milliseconds(50));
  }
  return std::nullopt;
}

bool StreamHost::skip_unwanted(const protocol::ChunkPosition& position) {
  {
    std::lock_guard lk(mu_);
    if (stopping_ || state_->failed() || state_->wanted(position)) return false;
    state_->skip(position);
  }
  wake();
  return true;
}

void StreamHost::publish(const FillLease& lease, const protocol::ChunkPosition& position,
                         std::vector<protocol::TensorSpec> tensors,
                         std::vector<uint64_t> samples) {
  std::string failure;
  {
    std::lock_guard lk(mu_);
    // The slot's sequence word is written while the chunk is complete and before any consumer
    // can be sent its descriptor (the state publishes it, in order, at the earliest now).
    // Only in the views filled: in the others the slot holds nothing a consumer may read.
    for (size_t v = 0; v < lease.views.size(); ++v)
      if (lease.views[v]) view_pool(static_cast<uint32_t>(v)).set_slot_seq(lease.slot, lease.seq);
    bool was_failed = state_->failed();
    state_->publish(lease.seq, lease.slot, position, std::move(tensors), std::move(samples));
    if (!was_failed && state_->failed()) failure = state_->failure();
    note_for_producers();
  }
  if (!failure.empty()) stream_failed(failure);  // an invalid chunk failed the stream
  wake();
}

void StreamHost::note_for_producers() {
  waited_chunk_.store(state_->waited_chunk().value_or(kNoChunk), std::memory_order_relaxed);
  samples_sent_.store(state_->samples_sent(), std::memory_order_relaxed);
}

FillLease StreamHost::lease(const StreamState::Fill& fill) {
  const uint32_t slot = fill.slot;
  FillLease l;
  l.seq = fill.seq;
  l.slot = slot;
  l.data = memory_.slot_data(slot);
  l.capacity = memory_.pool().slot_bytes();
  l.regenerate = fill.regenerate;
  l.samples = fill.samples;
  // The slot's previous chunk is gone from every view, filled in this chunk's or not.
  for (uint32_t v = 0; v <= view_memory_.size(); ++v) {
    view_pool(v).set_slot_seq(slot, SlotPool::kNoChunk);
    const bool filled = !fill.view || *fill.view == v;
    l.views.push_back(!filled ? nullptr : v == 0 ? l.data : view_memory_[v - 1]->slot_data(slot));
  }
  return l;
}

void StreamHost::finish() {
  {
    std::lock_guard lk(mu_);
    state_->finish();
  }
  wake();
}

void StreamHost::fail(const std::string& message) {
  bool first;
  {
    std::lock_guard lk(mu_);
    first = !state_->failed();
    state_->fail(message);
  }
  spdlog::error("stream failed: {}", message);
  if (first) stream_failed(message);  // a later fail() changes nothing: producers were woken
  wake();
}

void StreamHost::stream_failed(const std::string& message) {
  if (!failure_path_.empty()) record_failure(failure_path_, message);
  slot_freed_.notify_all();  // acquire() returns nullopt from now on
}

bool StreamHost::failed() const {
  std::lock_guard lk(mu_);
  return state_->failed();
}

bool StreamHost::finished() const {
  std::lock_guard lk(mu_);
  return state_->finished();
}

bool StreamHost::wait_finished(double timeout_s) {
  std::unique_lock lk(mu_);
  auto done = [this] { return stopping_ || state_->failed() || state_->all_ended(); };
  if (timeout_s < 0) {
    finished_cv_.wait(lk, done);
  } else if (!finished_cv_.wait_for(lk, std::chrono::duration<double>(timeout_s), done)) {
    return false;
  }
  return !state_->failed() && !stopping_;
}

void StreamHost::set_epoch_samples(uint64_t samples) {
  std::lock_guard lk(mu_);
  state_->set_epoch_samples(samples);
}

uint64_t StreamHost::consumers_now() const {
  std::lock_guard lk(mu_);
  return state_->consumers_now();
}

uint64_t StreamHost::consumers_reading() const {
  std::lock_guard lk(mu_);
  return state_->consumers_reading();
}

uint64_t StreamHost::consumers_ever() const {
  std::lock_guard lk(mu_);
  return state_->consumers_ever();
}

StreamStats StreamHost::stats() const {
  std::lock_guard lk(mu_);
  StreamStats s = state_->stats();
  s.producer_blocked_s = state_->producer_blocked_s(monotonic_seconds());
  return s;
}

bool StreamHost::send(const std::string& identity, const protocol::Message& message) {
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

void StreamHost::loop() {
  zmq::pollitem_t items[] = {{router_->handle(), 0, ZMQ_POLLIN, 0},
                             {nullptr, wake_fd_, ZMQ_POLLIN, 0}};
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
    {
      std::lock_guard lk(mu_);
      receive_all(now);
      state_->tick(now);
      release_retired_slots(now);
      note_for_producers();
    }
    slot_freed_.notify_all();
    finished_cv_.notify_all();
  }
}

void StreamHost::receive_all(double now) {
  for (int i = 0; i < 10000; ++i) {
    zmq::message_t identity, body;
    if (!router_->recv(identity, zmq::recv_flags::dontwait)) break;
    if (!identity.more()) {
      state_->drop_frame();
      continue;
    }
    (void)router_->recv(body, zmq::recv_flags::dontwait);
    bool extra = false;
    while (body.more()) {  // a well-formed peer sends one frame; drain and drop the rest
      extra = true;
      (void)router_->recv(body, zmq::recv_flags::dontwait);
    }
    if (extra) {
      state_->drop_frame();
      continue;
    }
    state_->receive(identity.to_string(), body.data(), body.size(), now);
  }
}

}  // namespace batchcast
