#include "client/consumer.h"

#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <zmq.hpp>

#include "common/error.h"
#include "common/process.h"
#include "shm/slot_pool.h"
#ifdef BATCHCAST_HAVE_CUDA
#include "shm/cuda_pool.h"
#endif

namespace batchcast {

using protocol::BatchDescriptor;

// Session: the connection behind a Consumer. Its I/O thread owns the DEALER socket: it receives
// descriptors, heartbeats, End and errors, and sends credits, releases and heartbeats queued by
// other threads (woken through an eventfd). Shared by the Consumer and every chunk reference,
// so the mapping outlives the Consumer while batches still view it.
class Session : public std::enable_shared_from_this<Session> {
 public:
  explicit Session(const ConsumerOptions& options);
  ~Session();

  // Blocks for the next descriptor. nullopt once End was received and the queue is empty.
  std::optional<BatchDescriptor> pop(double timeout_s, double* waited);
  void post(protocol::Message message);
  void goodbye();

  const protocol::Welcome& welcome() const { return welcome_; }
  const uint8_t* slot_data(uint32_t slot) const {
#ifdef BATCHCAST_HAVE_CUDA
    if (arena_) return arena_->slot_data(slot);
#endif
    return pool_->slot_data(slot);
  }
#ifdef BATCHCAST_HAVE_CUDA
  const ArenaMapping* arena() const { return arena_ ? &*arena_ : nullptr; }
  cudaStream_t copy_stream() const { return copy_stream_.get(); }
  // Queues `release`, sent by the I/O thread once every event in `after` has completed.
  void post_release_after(protocol::Release release, std::vector<std::shared_ptr<CudaEvent>> after);
#endif
  std::atomic<uint32_t> held{0};  // zero-copy batches alive
  std::atomic<uint64_t> samples{0};
  std::atomic<uint64_t> dropped{0};
  std::atomic<double> wait_s{0};
  const std::string& endpoint() const { return endpoint_; }

 private:
  void loop();
  void on_message(const void* data, size_t size, double now);
  bool server_gone(double now);

  std::string endpoint_;
  zmq::context_t context_{1};
  zmq::socket_t socket_{context_, zmq::socket_type::dealer};
  int wake_fd_ = -1;
  protocol::Welcome welcome_;
  bool server_local_ = false;
  std::optional<SlotPool> pool_;
#ifdef BATCHCAST_HAVE_CUDA
  std::optional<ArenaMapping> arena_;  // GPU pools: the server's arena and slot events
  CudaStream copy_stream_;             // device-to-device batch copies
  struct PendingRelease {
    protocol::Release release;
    std::vector<std::shared_ptr<CudaEvent>> after;
  };
  std::vector<PendingRelease> pending_;  // under mu_, taken by the I/O thread
#endif

  std::mutex mu_;
  std::condition_variable ready_;
  std::deque<BatchDescriptor> queue_;
  std::vector<protocol::Message> outbox_;
  bool ended_ = false;
  bool gone_ = false;
  bool stopping_ = false;
  std::string gone_reason_;
  std::string server_error_;
  double last_heard_ = 0;
  std::thread thread_;
};

// One received chunk. The last owner (the assembler or a zero-copy Batch) releases its slot.
struct ChunkRef {
  std::shared_ptr<Session> session;
  BatchDescriptor desc;
  const uint8_t* base = nullptr;
#ifdef BATCHCAST_HAVE_CUDA
  // GPU pools: events recorded after the last device work that reads this chunk.
  std::mutex mu;
  std::vector<std::shared_ptr<CudaEvent>> readers_done;
  void add_reader_done(std::shared_ptr<CudaEvent> e) {
    std::lock_guard lk(mu);
    readers_done.push_back(std::move(e));
  }
  ~ChunkRef() {
    if (readers_done.empty()) {
      session->post(protocol::Release{desc.seq, desc.slot});
    } else {
      session->post_release_after({desc.seq, desc.slot}, std::move(readers_done));
    }
  }
#else
  ~ChunkRef() { session->post(protocol::Release{desc.seq, desc.slot}); }
#endif
};

// What a batch of a GPU pool needs beyond its views (empty in CPU-only builds).
struct Batch::DeviceState {
#ifdef BATCHCAST_HAVE_CUDA
  std::shared_ptr<Session> session;      // keeps the copy stream and the mapping alive
  int device = 0;
  std::vector<cudaEvent_t> ready;        // wait on these before reading
  std::shared_ptr<CudaEvent> copy_done;  // copied batches: their ready event
  std::optional<uintptr_t> stream;       // the user's stream (use_on_stream)
  std::vector<void*> owned;              // copied batches: cudaMallocAsync'd buffers
#endif
};

namespace {

double deadline_from(double timeout_s) {
  return timeout_s > 0 ? monotonic_seconds() + timeout_s : 1e300;
}

}  // namespace

Session::Session(const ConsumerOptions& options)
    : endpoint_(options.endpoint.empty() ? protocol::default_endpoint() : options.endpoint) {
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
  socket_.send(zmq::buffer(protocol::encode(hello)), zmq::send_flags::none);

  // Handshake on the caller's thread: wait for the welcome.
  double deadline = deadline_from(options.timeout_s);
  while (true) {
    zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1, std::chrono::milliseconds(100));
    if (item.revents & ZMQ_POLLIN) {
      zmq::message_t msg;
      (void)socket_.recv(msg, zmq::recv_flags::none);
      auto r = protocol::decode(msg.data(), msg.size());
      if (r.message && std::holds_alternative<protocol::Welcome>(*r.message)) {
        welcome_ = std::get<protocol::Welcome>(*r.message);
        break;
      }
      throw Error("unexpected answer from " + endpoint_ + " (" +
                  (r.message ? "not a welcome" : r.error) + "); is a batchcast server there?");
    }
    if (monotonic_seconds() > deadline)
      throw TimeoutError("no batchcast server answered at " + endpoint_ + " within " +
                         std::to_string(static_cast<int>(options.timeout_s)) +
                         " s; start one with `batchcast serve --endpoint " + endpoint_ + "`");
  }
  server_local_ = welcome_.boot_id == host_boot_id();  // its pid can be checked
  if (!same_host(welcome_.boot_id, host_boot_id()))
    throw Error("server at " + endpoint_ + " runs on another host; batchcast shares memory only "
                "between processes of one machine");
  pool_.emplace(SlotPool::attach(welcome_.segment_name, welcome_.slot_count, welcome_.slot_bytes,
                                 welcome_.slots_offset));
  if (welcome_.device != protocol::DeviceKind::kCpu) {
#ifdef BATCHCAST_HAVE_CUDA
    arena_.emplace(ArenaMapping::open(welcome_.cuda_device_uuid, welcome_.cuda_memory_handle,
                                      welcome_.cuda_event_handles, welcome_.slot_bytes));
    if (options.cuda_device >= 0 && options.cuda_device != arena_->device())
      throw Error("server at " + endpoint_ + " shares its batches on cuda:" +
                  std::to_string(arena_->device()) + " but this consumer asked for cuda:" +
                  std::to_string(options.cuda_device) +
                  "; batchcast hands out zero-copy tensors on the server's GPU only: use device "
                  "cuda:" + std::to_string(arena_->device()) +
                  " (and .to() yourself) or start one server per GPU");
    CudaDeviceGuard guard(arena_->device());
    copy_stream_ = CudaStream::create();
#else
    throw Error("server at " + endpoint_ + " serves CUDA memory; this build has no CUDA support");
#endif
  }
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  last_heard_ = monotonic_seconds();
  thread_ = std::thread([this] { loop(); });
}

Session::~Session() {
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
  }
  uint64_t one = 1;
  [[maybe_unused]] auto n = ::write(wake_fd_, &one, sizeof(one));
  if (thread_.joinable()) thread_.join();
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

void Session::post(protocol::Message message) {
  {
    std::lock_guard lk(mu_);
    outbox_.push_back(std::move(message));
  }
  uint64_t one = 1;
  [[maybe_unused]] auto n = ::write(wake_fd_, &one, sizeof(one));
}

void Session::goodbye() {
  post(protocol::Heartbeat{samples.load(), wait_s.load()});  // final counters for the metrics
  post(protocol::Goodbye{});
}

#ifdef BATCHCAST_HAVE_CUDA
void Session::post_release_after(protocol::Release release,
                                 std::vector<std::shared_ptr<CudaEvent>> after) {
  {
    std::lock_guard lk(mu_);
    pending_.push_back({release, std::move(after)});
  }
  uint64_t one = 1;
  [[maybe_unused]] auto n = ::write(wake_fd_, &one, sizeof(one));
}
#endif

std::optional<BatchDescriptor> Session::pop(double timeout_s, double* waited) {
  std::unique_lock lk(mu_);
  double start = monotonic_seconds();
  double deadline = deadline_from(timeout_s);
  while (queue_.empty()) {
    if (!server_error_.empty())
      throw Error("batchcast server at " + endpoint_ + " reported: " + server_error_);
    if (ended_) break;
    if (gone_) throw ServerGoneError(gone_reason_);
    if (monotonic_seconds() > deadline)
      throw TimeoutError("no data from the batchcast server at " + endpoint_ + " within " +
                         std::to_string(static_cast<int>(timeout_s)) +
                         " s (it is alive: is it stalled on a slow or stopped consumer?)");
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
  std::lock_guard lk(mu_);
  if (auto* d = std::get_if<BatchDescriptor>(&*r.message)) {
    auto invalid = protocol::validate_descriptor(*d, welcome_.slot_count, welcome_.slot_bytes);
    if (invalid.empty() && pool_->slot_seq(d->slot) != d->seq)
      invalid = "slot " + std::to_string(d->slot) + " does not hold chunk " + std::to_string(d->seq);
    if (!invalid.empty()) {
      dropped++;
      spdlog::warn("dropped a descriptor from {}: {}", endpoint_, invalid);
      outbox_.push_back(protocol::Release{d->seq, d->slot});
      return;
    }
    queue_.push_back(std::move(*d));
  } else if (std::holds_alternative<protocol::End>(*r.message)) {
    ended_ = true;
  } else if (auto* e = std::get_if<protocol::ErrorMessage>(&*r.message)) {
    server_error_ = e->message;
  } else if (!std::holds_alternative<protocol::Heartbeat>(*r.message)) {
    dropped++;
  }
  ready_.notify_all();
}

void Session::loop() {
  zmq::pollitem_t items[] = {{socket_.handle(), 0, ZMQ_POLLIN, 0}, {nullptr, wake_fd_, ZMQ_POLLIN, 0}};
  double next_heartbeat = 0, next_check = 0;
  bool stopping = false;
  bool goodbye_sent = false;
#ifdef BATCHCAST_HAVE_CUDA
  std::vector<PendingRelease> waiting;  // releases whose readers' events have not completed
  if (arena_) (void)cudaSetDevice(arena_->device());
#endif
  while (!stopping) {
    int poll_ms = 50;
#ifdef BATCHCAST_HAVE_CUDA
    if (!waiting.empty()) poll_ms = 1;  // a release waits on the GPU: poll its events often
#endif
    zmq::poll(items, 2, std::chrono::milliseconds(poll_ms));
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
#ifdef BATCHCAST_HAVE_CUDA
      for (auto& p : pending_) waiting.push_back(std::move(p));
      pending_.clear();
#endif
    }
#ifdef BATCHCAST_HAVE_CUDA
    for (auto it = waiting.begin(); it != waiting.end();) {
      bool done = true;
      for (const auto& e : it->after) {
        // Stopping: the session is going away, so wait (this is the last chance to release).
        cudaError_t st = stopping ? cudaEventSynchronize(e->get()) : cudaEventQuery(e->get());
        if (st == cudaErrorNotReady) {
          done = false;
          break;
        }
        if (st != cudaSuccess) (void)cudaGetLastError();  // a failed context: release anyway
      }
      if (!done) {
        ++it;
        continue;
      }
      out.push_back(it->release);
      it = waiting.erase(it);
    }
#endif
    if (now >= next_heartbeat) {
      out.push_back(protocol::Heartbeat{samples.load(), wait_s.load()});
      next_heartbeat = now + welcome_.heartbeat_interval_s;
    }
    if (stopping && !goodbye_sent) out.push_back(protocol::Goodbye{});
    for (const auto& m : out) {
      if (std::holds_alternative<protocol::Goodbye>(m)) {
        if (goodbye_sent) continue;
        goodbye_sent = true;
      }
      socket_.send(zmq::buffer(protocol::encode(m)), zmq::send_flags::dontwait);
    }
    if (now >= next_check) {
      next_check = now + 0.2;
      std::lock_guard lk(mu_);
      if (!ended_ && !gone_ && server_gone(now)) {
        gone_ = true;
        gone_reason_ = "the batchcast server at " + endpoint_ + " (pid " +
                       std::to_string(welcome_.server_pid) + ") is gone: it " +
                       (server_local_ ? "exited or was killed" : "stopped answering heartbeats") +
                       " before the end of the stream";
        ready_.notify_all();
      }
    }
  }
}

Batch::~Batch() {
#ifdef BATCHCAST_HAVE_CUDA
  if (device_) {
    try {
      CudaDeviceGuard guard(device_->device);
      // Never used on a stream: the only device work on it is our own copy.
      cudaStream_t s = device_->stream ? reinterpret_cast<cudaStream_t>(*device_->stream)
                                       : device_->session->copy_stream();
      if (device_->stream && !chunks_.empty()) {
        auto done = std::make_shared<CudaEvent>(CudaEvent::create(/*interprocess=*/false));
        cuda_check(cudaEventRecord(done->get(), s), "recording a batch's release event");
        for (auto& c : chunks_) c->add_reader_done(done);
      }
      for (void* p : device_->owned) (void)cudaFreeAsync(p, s);
    } catch (const std::exception& e) {
      spdlog::warn("releasing a CUDA batch: {}", e.what());
    }
  }
#endif
  if (session_) session_->held--;
}

void Batch::use_on_stream(uintptr_t stream) {
#ifdef BATCHCAST_HAVE_CUDA
  if (!device_) return;
  CudaDeviceGuard guard(device_->device);
  auto s = reinterpret_cast<cudaStream_t>(stream);
  for (cudaEvent_t e : device_->ready)
    cuda_check(cudaStreamWaitEvent(s, e, 0), "making stream " + std::to_string(stream) +
                                                 " wait for the server's batch");
  device_->stream = stream;
#else
  (void)stream;
#endif
}

Consumer::Consumer(ConsumerOptions options)
    : options_(std::move(options)), session_(std::make_shared<Session>(options_)) {
  batch_size_ = options_.batch_size ? options_.batch_size : session_->welcome().server_batch_size;
  if (batch_size_ == 0) throw Error("batch_size must be >= 1 (the server announced none)");
  const auto& w = session_->welcome();
  // Slots one batch pins while it is assembled: 1 on host pools (a batch spanning chunks is
  // copied piece by piece); on GPU pools every chunk it spans, all held at once.
  uint64_t spans = 1;
  if (w.device == protocol::DeviceKind::kCuda && w.server_batch_size > 0) {
    // A multiple of the chunk size always starts at a chunk start (a GPU pool's chunks come from
    // the native server: all full but an epoch's last, which ends the batch too).
    const uint64_t chunk = w.server_batch_size;
    spans = batch_size_ % chunk == 0 ? batch_size_ / chunk
                                     : (batch_size_ - 1 + chunk - 1) / chunk + 1;
    if (spans >= w.slot_count)
      throw Error("batch_size " + std::to_string(batch_size_) + " spans up to " +
                  std::to_string(spans) + " chunks of the server's " +
                  std::to_string(w.server_batch_size) + ", too many for its ring of " +
                  std::to_string(w.slot_count) + " GPU slots; start the server with a larger "
                  "--ring or --batch-size");
  }
  // Held zero-copy batches pin their slots: if they could pin every slot the next batch needs,
  // next() would wait forever. A small ring lowers max_held (later batches become copies).
  if (w.slot_count > spans && options_.max_held > w.slot_count - spans)
    options_.max_held = static_cast<uint32_t>(w.slot_count - spans);
  epoch_ = w.first_epoch;
  session_->post(protocol::Credit{std::max<uint32_t>(options_.prefetch, 1)});
}

Consumer::~Consumer() { close(); }

void Consumer::close() {
  if (!session_) return;
  cur_.reset();
  stash_.reset();
  session_->goodbye();
  session_.reset();
}

const protocol::Welcome& Consumer::welcome() const { return session_->welcome(); }

std::optional<uint64_t> Consumer::batches_per_epoch() const {
  uint64_t n = epoch_samples_ ? epoch_samples_ : session_ ? session_->welcome().epoch_samples : 0;
  if (n == 0) return std::nullopt;
  return options_.drop_last ? n / batch_size_ : (n + batch_size_ - 1) / batch_size_;
}

ConsumerStats Consumer::stats() const {
  ConsumerStats s = stats_;
  if (session_) s.dropped_messages = session_->dropped.load();
  return s;
}

std::shared_ptr<ChunkRef> Consumer::pop_chunk() {
  if (stash_) return std::move(stash_);
  if (stream_ended_) return nullptr;
  double waited = 0;
  auto d = session_->pop(options_.timeout_s, &waited);
  stats_.wait_s += waited;
  session_->wait_s = stats_.wait_s;
  if (!d) {
    stream_ended_ = true;
    return nullptr;
  }
  session_->post(protocol::Credit{1});  // keep `prefetch` chunks in flight
  auto ref = std::make_shared<ChunkRef>();
  ref->session = session_;
  ref->base = session_->slot_data(d->slot);
  ref->desc = std::move(*d);
  return ref;
}

struct Pieces {
  struct Piece {
    std::shared_ptr<ChunkRef> chunk;
    uint32_t start;
    uint32_t count;
  };
  std::vector<Piece> list;
  // Host pools: a batch spanning chunks is copied piece by piece as its chunks arrive (staged),
  // so it holds one chunk at a time. Holding every piece until the batch was complete
  // deadlocked the ring once a batch spanned more chunks than the pool has slots (e.g. batch
  // 250 over chunks of 32 in 8 slots): the producer waited for a slot, the consumer for a chunk.
  std::optional<protocol::BatchDescriptor> first;  // the first piece's chunk
  uint32_t first_start = 0;
  std::vector<std::unique_ptr<uint8_t[]>> staged;  // one per tensor, batch_size rows
  uint32_t staged_rows = 0;
};

namespace {
void stage_pieces(Pieces& pieces, uint32_t capacity);
}  // namespace

std::shared_ptr<Batch> Consumer::next() {
  if (!session_) throw Error("consumer is closed");
  if (pending_epoch_end_) {
    pending_epoch_end_ = false;
    return nullptr;
  }
  Pieces pieces;
  uint32_t total = 0;
  bool epoch_over = false;
  while (total < batch_size_) {
    if (!cur_ || pos_ == cur_->desc.position.sample_count) {
      bool ended_epoch = cur_ && cur_->desc.position.epoch_end;
      cur_.reset();
      if (ended_epoch) {
        epoch_over = true;
        break;
      }
      bool fresh = !stash_;  // a stashed chunk was accounted for when it arrived
      auto next = pop_chunk();
      if (!next) {
        epoch_over = true;
        break;
      }
      const auto& d = next->desc;
      if (fresh) {
        // Samples this consumer will never see: the part of the epoch before a late join, or
        // chunks reused before it was sent them (left behind under stall_policy=skip). Counted
        // now, so the epoch they cut short already reports them.
        if (!have_expected_)
          stats_.skipped += d.position.sample_start;
        else if (d.stream_position > expected_position_)
          stats_.skipped += d.stream_position - expected_position_;
        have_expected_ = true;
        expected_position_ = d.stream_position + d.position.sample_count;
        if (d.position.epoch_samples)
          epoch_samples_ = d.position.epoch_samples;  // learnt once a producer knows it
      }
      if (epoch_open_ && d.position.epoch != epoch_) {  // new epoch without its predecessor's end
        stash_ = std::move(next);
        epoch_over = true;
        break;
      }
      if (!epoch_open_) {
        epoch_open_ = true;
        epoch_ = d.position.epoch;
      }
      cur_ = std::move(next);
      pos_ = 0;
    }
    uint32_t k = std::min(batch_size_ - total, cur_->desc.position.sample_count - pos_);
    pieces.list.push_back({cur_, pos_, k});
    pos_ += k;
    total += k;
#ifdef BATCHCAST_HAVE_CUDA
    bool host_pool = session_->arena() == nullptr;  // device pools copy on the GPU at the end
#else
    bool host_pool = true;
#endif
    if (host_pool && pieces.list.size() + (pieces.first ? 1 : 0) >= 2)
      stage_pieces(pieces, batch_size_);
  }
  if (epoch_over) {
    epoch_open_ = false;
    if (total == 0 || (options_.drop_last && total < batch_size_)) return nullptr;
    pending_epoch_end_ = true;
  }
  auto batch = assemble(pieces, total);
  stats_.batches++;
  stats_.samples += total;
  session_->samples = stats_.samples;
  return batch;
}

namespace {

// A C-contiguous view of `total` samples shaped like `t` (data to be filled in).
TensorView contiguous_view(const protocol::TensorSpec& t, uint32_t total) {
  TensorView v{t.name, t.dtype, t.shape, {}, nullptr};
  v.shape[0] = total;
  v.strides.assign(v.shape.size(), 1);
  for (size_t i = v.shape.size() - 1; i-- > 0;) v.strides[i] = v.strides[i + 1] * v.shape[i + 1];
  return v;
}

// Bytes of one sample of `t` stored contiguously.
size_t row_bytes(const protocol::TensorSpec& t) {
  size_t n = dtype_size(t.dtype);
  for (size_t i = 1; i < t.shape.size(); ++i) n *= static_cast<size_t>(t.shape[i]);
  return n;
}

// Copies rows [start, start+count) of a strided tensor into contiguous `out`.
void copy_rows(const uint8_t* base, const protocol::TensorSpec& t, uint32_t start, uint32_t count,
               uint8_t* out) {
  size_t item = dtype_size(t.dtype);
  size_t row_elems = 1;
  bool contiguous = true;
  int64_t expect = 1;
  for (size_t i = t.shape.size(); i-- > 1;) {
    if (t.shape[i] != 1 && t.strides[i] != expect) contiguous = false;
    expect *= t.shape[i];
    row_elems *= static_cast<size_t>(t.shape[i]);
  }
  const uint8_t* src = base + t.offset;
  for (uint32_t r = 0; r < count; ++r) {
    const uint8_t* row = src + (start + r) * t.strides[0] * item;
    uint8_t* dst = out + r * row_elems * item;
    if (contiguous) {
      std::memcpy(dst, row, row_elems * item);
      continue;
    }
    for (size_t e = 0; e < row_elems; ++e) {  // general strides: element by element
      size_t rem = e;
      int64_t off = 0;
      for (size_t i = t.shape.size(); i-- > 1;) {
        off += static_cast<int64_t>(rem % t.shape[i]) * t.strides[i];
        rem /= t.shape[i];
      }
      std::memcpy(dst + e * item, row + off * item, item);
    }
  }
}

// Copies the pieces gathered so far into the staging buffers and drops their chunk references.
void stage_pieces(Pieces& pieces, uint32_t capacity) {
  for (auto& p : pieces.list) {
    if (!pieces.first) {
      pieces.first = p.chunk->desc;
      pieces.first_start = p.start;
      for (const auto& t : p.chunk->desc.tensors)
        pieces.staged.push_back(
            std::make_unique<uint8_t[]>(std::max<size_t>(row_bytes(t) * capacity, 1)));
    }
    const auto& first = *pieces.first;
    if (p.chunk->desc.tensors.size() != first.tensors.size())
      throw Error("chunks " + std::to_string(first.seq) + " and " + std::to_string(p.chunk->desc.seq) +
                  " disagree on their tensors; use the producer's batch size to avoid mixing them");
    for (size_t ti = 0; ti < first.tensors.size(); ++ti) {
      const auto& t = first.tensors[ti];
      const auto& pt = p.chunk->desc.tensors[ti];
      if (pt.dtype != t.dtype || pt.shape.size() != t.shape.size() ||
          !std::equal(pt.shape.begin() + 1, pt.shape.end(), t.shape.begin() + 1))
        throw Error("chunks " + std::to_string(first.seq) + " and " +
                    std::to_string(p.chunk->desc.seq) + " disagree on tensor '" + t.name +
                    "' (shape or dtype); use the producer's batch size to avoid mixing them");
      copy_rows(p.chunk->base, pt, p.start, p.count,
                pieces.staged[ti].get() + pieces.staged_rows * row_bytes(t));
    }
    pieces.staged_rows += p.count;
  }
  pieces.list.clear();
}

}  // namespace

std::shared_ptr<Batch> Consumer::assemble(Pieces& pieces, uint32_t total) {
  std::shared_ptr<Batch> batch(new Batch());
  batch->size = total;
  if (pieces.first) {
    batch->epoch = pieces.first->position.epoch;
    batch->sample_start = pieces.first->position.sample_start + pieces.first_start;
  } else {
    batch->epoch = pieces.list.front().chunk->desc.position.epoch;
    batch->sample_start =
        pieces.list.front().chunk->desc.position.sample_start + pieces.list.front().start;
  }
#ifdef BATCHCAST_HAVE_CUDA
  const ArenaMapping* arena = session_->arena();
  if (arena) {
    batch->device_ = std::make_unique<Batch::DeviceState>();
    batch->device_->session = session_;
    batch->device_->device = arena->device();
  }
#endif
  bool zero_copy =
      !pieces.first && pieces.list.size() == 1 && session_->held.load() < options_.max_held;
  if (zero_copy) {
    const auto& first = pieces.list.front();
    session_->held++;
    batch->session_ = session_;
    batch->chunks_.push_back(first.chunk);
    for (const auto& t : first.chunk->desc.tensors) {
      TensorView v{t.name, t.dtype, t.shape, t.strides, nullptr};
      v.shape[0] = total;
      v.data = const_cast<uint8_t*>(first.chunk->base + t.offset +
                                    first.start * t.strides[0] * dtype_size(t.dtype));
#ifdef BATCHCAST_HAVE_CUDA
      if (arena) {
        v.device = protocol::DeviceKind::kCuda;
        v.device_index = static_cast<uint32_t>(arena->device());
      }
#endif
      batch->tensors.push_back(std::move(v));
    }
#ifdef BATCHCAST_HAVE_CUDA
    if (arena) batch->device_->ready.push_back(arena->slot_event(first.chunk->desc.slot));
#endif
    return batch;
  }
  batch->copied = true;
  stats_.copies++;
#ifdef BATCHCAST_HAVE_CUDA
  if (arena) return assemble_on_device(pieces, total, std::move(batch));
#endif
  // Host pools: every copy (a batch spanning chunks, or one beyond max_held) goes through the
  // staging buffers; copy what is left, then hand the buffers over.
  stage_pieces(pieces, batch_size_);
  for (size_t ti = 0; ti < pieces.first->tensors.size(); ++ti) {
    TensorView v = contiguous_view(pieces.first->tensors[ti], total);
    v.data = pieces.staged[ti].get();
    batch->owned_.push_back(std::move(pieces.staged[ti]));
    batch->tensors.push_back(std::move(v));
  }
  return batch;
}

#ifdef BATCHCAST_HAVE_CUDA
std::shared_ptr<Batch> Consumer::assemble_on_device(Pieces& pieces, uint32_t total,
                                                    std::shared_ptr<Batch> batch) {
  const ArenaMapping& arena = *session_->arena();
  CudaDeviceGuard guard(arena.device());
  cudaStream_t cs = session_->copy_stream();
  for (const auto& p : pieces.list)
    cuda_check(cudaStreamWaitEvent(cs, arena.slot_event(p.chunk->desc.slot), 0),
               "waiting for the server's chunk " + std::to_string(p.chunk->desc.seq));
  const auto& first = pieces.list.front();
  for (size_t ti = 0; ti < first.chunk->desc.tensors.size(); ++ti) {
    const auto& t = first.chunk->desc.tensors[ti];
    TensorView v = contiguous_view(t, total);
    v.device = protocol::DeviceKind::kCuda;
    v.device_index = static_cast<uint32_t>(arena.device());
    size_t row_bytes = static_cast<size_t>(v.strides[0]) * dtype_size(t.dtype);
    void* buffer = nullptr;
    cuda_check(cudaMallocAsync(&buffer, std::max<size_t>(row_bytes * total, 1), cs),
               "allocating a " + std::to_string(row_bytes * total) +
                   "-byte batch copy on the GPU (free GPU memory or hold fewer batches)");
    batch->device_->owned.push_back(buffer);
    size_t row = 0;
    for (const auto& p : pieces.list) {
      const auto& pt = p.chunk->desc.tensors.at(ti);
      if (pt.dtype != t.dtype || pt.shape.size() != t.shape.size() ||
          !std::equal(pt.shape.begin() + 1, pt.shape.end(), t.shape.begin() + 1) ||
          pt.strides != v.strides)
        throw Error("chunks " + std::to_string(first.chunk->desc.seq) + " and " +
                    std::to_string(p.chunk->desc.seq) + " disagree on tensor '" + t.name +
                    "' (shape, dtype or layout); use the producer's batch size to avoid mixing them");
      const uint8_t* src = p.chunk->base + pt.offset + p.start * row_bytes;
      cuda_check(cudaMemcpyAsync(static_cast<uint8_t*>(buffer) + row * row_bytes, src,
                                 p.count * row_bytes, cudaMemcpyDeviceToDevice, cs),
                 "copying tensor '" + t.name + "' of a batch on the GPU");
      row += p.count;
    }
    v.data = buffer;
    batch->tensors.push_back(std::move(v));
  }
  auto done = std::make_shared<CudaEvent>(CudaEvent::create(/*interprocess=*/false));
  cuda_check(cudaEventRecord(done->get(), cs), "recording a batch copy's event");
  for (const auto& p : pieces.list) p.chunk->add_reader_done(done);
  batch->device_->copy_done = done;
  batch->device_->ready.push_back(done->get());
  return batch;
}
#endif

}  // namespace batchcast
