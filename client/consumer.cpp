#include "client/consumer.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "client/assembler.h"
#include "client/session.h"
#include "common/error.h"
#include "shm/slot_pool.h"

namespace batchcast {

namespace {

// Slots one batch pins while it is assembled: 1 on host pools (a batch spanning chunks is
// copied piece by piece); on GPU pools every chunk it spans, all held at once.
uint64_t slots_per_batch(const protocol::Welcome& w, uint32_t batch_size) {
  if (w.device != protocol::DeviceKind::kCuda || w.chunk_size == 0) return 1;
  // A multiple of the chunk size always starts at a chunk start (a GPU pool's chunks come from
  // the native server: all full but an epoch's last, which ends the batch too).
  const uint64_t chunk = w.chunk_size;
  uint64_t spans =
      batch_size % chunk == 0 ? batch_size / chunk : (batch_size - 1 + chunk - 1) / chunk + 1;
  if (spans >= w.slot_count)
    throw Error("batch_size " + std::to_string(batch_size) + " spans up to " +
                std::to_string(spans) + " chunks of the server's " + std::to_string(w.chunk_size) +
                ", too many for its ring of " + std::to_string(w.slot_count) +
                " GPU slots; start the server with a larger "
                "--ring or --batch-size");
  return spans;
}

uint32_t batch_size_of(const ConsumerOptions& o, const Session& s) {
  uint32_t b = o.batch_size ? o.batch_size : s.welcome().chunk_size;
  if (b == 0) throw Error("batch_size must be >= 1 (the server announced none)");
  return b;
}

// Segments of servers that died (SIGKILL, the OOM killer) are removed by whoever looks next:
// a consumer as it attaches and as it leaves, as well as the next server (docs/memory.md).
void remove_dead_servers_segments() {
  if (int n = remove_stale_segments())
    spdlog::info("removed {} shared segment(s) left by dead batchcast servers", n);
}

ConsumerOptions after_sweep(ConsumerOptions options) {
  remove_dead_servers_segments();
  return options;
}

}  // namespace

Batch::~Batch() {
  if (device_) device_->on_destroy(chunks_);
  if (session_) session_->held--;
}

void Batch::use_on_stream(uintptr_t stream) {
  if (device_) device_->use_on_stream(stream);
}

Consumer::Consumer(ConsumerOptions options)
    : options_(after_sweep(std::move(options))),
      session_(std::make_shared<Session>(options_)),
      rebatcher_(batch_size_of(options_, *session_), options_.drop_last,
                 session_->welcome().first_epoch, session_->welcome().epoch_samples),
      assembler_(Assembler::create(session_, rebatcher_.batch_size(), options_.cuda_device)) {
  const auto& w = session_->welcome();
  uint64_t spans = slots_per_batch(w, rebatcher_.batch_size());
  // Held zero-copy batches pin their slots: if they could pin every slot the next batch needs,
  // next() would wait forever. A small ring lowers max_held (later batches become copies).
  if (w.slot_count > spans && options_.max_held > w.slot_count - spans)
    options_.max_held = static_cast<uint32_t>(w.slot_count - spans);
  session_->post(protocol::Credit{std::max<uint32_t>(options_.prefetch, 1)});
}

Consumer::~Consumer() { close(); }

void Consumer::close() {
  if (!session_) return;
  assembler_.reset();
  chunk_.reset();
  session_->goodbye();
  session_.reset();
  remove_dead_servers_segments();
}

const protocol::Welcome& Consumer::welcome() const { return session_->welcome(); }
protocol::Order Consumer::order() const { return session_->welcome().order; }
int Consumer::cuda_device() const { return session_->memory().cuda_device(); }

std::optional<uint64_t> Consumer::batches_per_epoch() const {
  return rebatcher_.batches_per_epoch();
}

ConsumerStats Consumer::stats() const {
  ConsumerStats s = stats_;
  s.skipped = rebatcher_.skipped();
  if (session_) s.dropped_messages = session_->dropped.load();
  return s;
}

std::shared_ptr<ChunkRef> Consumer::pop_chunk() {
  double waited = 0;
  auto d = session_->pop(options_.timeout_s, &waited);
  stats_.wait_s += waited;
  session_->wait_s = stats_.wait_s;
  if (!d) return nullptr;
  session_->post(protocol::Credit{1});  // keep `prefetch` chunks in flight
  return std::make_shared<ChunkRef>(session_, std::move(*d));
}

void Consumer::seek(uint64_t epoch, uint64_t sample, std::vector<uint64_t> had) {
  pending_seek_ = PendingSeek{{epoch, sample}, std::move(had)};
}

std::pair<uint64_t, uint64_t> Consumer::position() const {
  if (pending_seek_) return {pending_seek_->target.epoch, pending_seek_->target.sample};
  return rebatcher_.position();
}

std::shared_ptr<Batch> Consumer::next() {
  if (!session_) throw Error("consumer is closed");
  if (pending_seek_) {
    assembler_->discard();
    samples_.clear();
    chunk_.reset();
    const protocol::Seek target = pending_seek_->target;
    rebatcher_.seek(target.epoch, target.sample);
    for (auto& part : protocol::had_parts(target.epoch, pending_seek_->had))
      session_->post(std::move(part));  // ahead of the Seek they resume after
    session_->seek(target);
    pending_seek_.reset();
  }
  while (true) {
    auto step = rebatcher_.step();
    if (!rebatcher_.holds_chunk()) chunk_.reset();  // its slot goes back before we wait
    switch (step.kind) {
      case Rebatcher::Step::kNeedChunk:
        if ((chunk_ = pop_chunk()))
          rebatcher_.push(chunk_->desc.position);
        else
          rebatcher_.end_of_stream();
        break;
      case Rebatcher::Step::kPiece: {
        assembler_->add({chunk_, step.start, step.count});
        const auto& rows = chunk_->desc.samples;
        if (!rows.empty())
          samples_.insert(samples_.end(), rows.begin() + step.start,
                          rows.begin() + step.start + step.count);
        break;
      }
      case Rebatcher::Step::kBatch:
        return take_batch(step.batch);
      case Rebatcher::Step::kEpochEnd:
        assembler_->discard();  // drop_last's short batch, if any
        samples_.clear();
        return nullptr;
    }
  }
}

std::shared_ptr<Batch> Consumer::take_batch(const BatchSpan& span) {
  std::shared_ptr<Batch> batch(new Batch());
  batch->epoch = span.epoch;
  batch->sample_start = span.sample_start;
  batch->size = span.size;
  batch->samples = std::move(samples_);
  samples_.clear();
  const Assembler::View view = assembler_->viewable();
  if (view == Assembler::View::kSlot && session_->held.load() < options_.max_held) {
    session_->held++;
    batch->session_ = session_;
    assembler_->view(*batch);
  } else {
    batch->copied = true;
    stats_.copies++;
    if (view == Assembler::View::kCopy)
      assembler_->view(*batch);  // a private chunk's rows, already this consumer's own copy
    else
      assembler_->copy(*batch);
  }
  stats_.batches++;
  stats_.samples += span.size;
  session_->samples = stats_.samples;
  return batch;
}

}  // namespace batchcast
