#include "server/produce/sample_producer.h"

#include <spdlog/spdlog.h>

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "common/error.h"

namespace batchcast {
namespace {

// One chunk being filled: shared by its sample tasks; the task that writes the last sample
// publishes it.
struct ChunkJob {
  FillLease lease;
  // Per view of the lease (views[v] of view v): its tensors and their layout in its slot (empty
  // for a view the lease does not fill).
  std::vector<std::vector<SampleTensor>> view_tensors;
  std::vector<SlotLayout> view_layouts;
  protocol::ChunkPosition position;
  std::vector<protocol::TensorSpec> tensors;
  // The samples its rows come from: the epoch's order (row p is order[sample_start + p]), or a
  // relaxed chunk's own samples (sample_start 0).
  std::shared_ptr<const std::vector<uint64_t>> order;
  std::atomic<uint32_t> remaining{0};
};

struct SampleTask {
  std::shared_ptr<ChunkJob> job;
  uint32_t position;  // inside the chunk
};

// A FIFO of sample tasks for the worker threads; close() ends them.
class TaskQueue {
 public:
  void push(SampleTask t) {
    {
      std::lock_guard lk(mu_);
      tasks_.push_back(std::move(t));
    }
    cv_.notify_one();
  }
  bool pop(SampleTask* t) {
    std::unique_lock lk(mu_);
    cv_.wait(lk, [&] { return closed_ || !tasks_.empty(); });
    if (tasks_.empty()) return false;
    *t = std::move(tasks_.front());
    tasks_.pop_front();
    return true;
  }
  void close() {
    {
      std::lock_guard lk(mu_);
      closed_ = true;
    }
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<SampleTask> tasks_;
  bool closed_ = false;
};

}  // namespace

SampleProducer::SampleProducer(StreamHost& core, const SampleSource& source, const StreamPlan& plan,
                               SampleProducerOptions options)
    : core_(core),
      source_(source),
      plan_(plan),
      options_(options),
      tensors_(source.tensors()),
      layout_(SlotLayout::plan(tensors_, options.chunk_size)),
      slot_tensors_(options.stage ? options.stage->slot_tensors() : tensors_),
      slot_layout_(SlotLayout::plan(slot_tensors_, options.chunk_size)) {
  if (options_.chunk_size == 0) throw Error("batch size must be >= 1");
  if (slot_layout_.bytes > core_.memory().pool().slot_bytes())
    throw Error("a chunk needs " + std::to_string(slot_layout_.bytes) + " bytes but slots hold " +
                std::to_string(core_.memory().pool().slot_bytes()));
}

namespace {

// Where sample `position` of each view's tensors goes in the chunk's slots; none for a view
// the lease does not fill (SampleSource::fill_views skips it).
std::vector<std::vector<uint8_t*>> sample_outs(const ChunkJob& job, uint32_t position) {
  std::vector<std::vector<uint8_t*>> outs(job.view_layouts.size());
  for (size_t v = 0; v < job.view_layouts.size(); ++v)
    if (job.lease.views[v])
      outs[v] = job.view_layouts[v].sample_outs(job.lease.views[v], job.view_tensors[v], position);
  return outs;
}

}  // namespace

bool SampleProducer::first_report(uint64_t index) {
  std::lock_guard lk(reported_mu_);
  return reported_.size() < kMaxReported && reported_.insert(index).second;
}

bool SampleProducer::run() {
  TaskQueue queue;
  std::atomic<bool> failed{false};
  auto fill_one = [&](const SampleTask& task) {
    auto& job = *task.job;
    const auto& order = *job.order;
    uint64_t p = job.position.sample_start + task.position;
    for (uint64_t attempt = 0; attempt < order.size(); ++attempt) {
      const uint64_t index = order[(p + attempt) % order.size()];
      try {
        if (options_.stage)
          options_.stage->fill(job.lease, task.position, index, job.position.epoch);
        else
          source_.fill_views(index, job.position.epoch, sample_outs(job, task.position));
        return;
      } catch (const SampleError& e) {
        if (options_.on_error == OnErrorPolicy::kRaise) throw;
        ++skipped_;
        if (first_report(index))
          spdlog::warn("skipped bad sample {} (on_error=skip; counted each time it is read, "
                       "reported once)",
                       e.what());
      }
    }
    throw Error("every sample of epoch " + std::to_string(job.position.epoch) +
                " failed to decode");
  };
  // A stage's upload may block on the GPU for a long time (nvJPEG's batched decode waits on its
  // stream, and a server time-sliced with training contexts waits its turn): done by a worker,
  // that is a core not decoding. So a finished chunk goes to a thread of its own that uploads and
  // publishes (bench/RESULTS.md, "the mixed decoder on 2 cores").
  TaskQueue uploads;
  std::thread uploader;
  // Each row's dataset index as asked for (a bad sample skipped stands for its replacement, as
  // in the exact order): relaxed readers take rows by it.
  auto publish = [&](ChunkJob& job) {
    const auto first = job.order->begin() + static_cast<std::ptrdiff_t>(job.position.sample_start);
    core_.publish(job.lease, job.position, std::move(job.tensors),
                  std::vector<uint64_t>(first, first + job.position.sample_count));
  };
  if (options_.stage) {
    uploader = std::thread([&] {
      SampleTask task;
      while (uploads.pop(&task)) {
        if (failed) continue;  // drain
        try {
          options_.stage->upload(task.job->lease, task.job->position.sample_count);
          publish(*task.job);
        } catch (const std::exception& e) {
          failed = true;
          core_.fail(e.what());
        }
      }
    });
  }
  std::vector<std::thread> workers;
  for (uint32_t w = 0; w < std::max<uint32_t>(options_.workers, 1); ++w) {
    workers.emplace_back([&] {
      SampleTask task;
      while (queue.pop(&task)) {
        if (failed) continue;  // drain
        try {
          fill_one(task);
          if (--task.job->remaining == 0) {
            if (options_.stage)
              uploads.push(std::move(task));
            else
              publish(*task.job);
          }
        } catch (const std::exception& e) {
          failed = true;
          core_.fail(e.what());
        }
      }
    });
  }

  const uint64_t epoch_samples = plan_.epoch_samples();
  const uint64_t chunks = (epoch_samples + options_.chunk_size - 1) / options_.chunk_size;
  // Queues the samples of chunk `c` of epoch `e` (in `order`) for the workers to fill into the
  // leased slot. False if the stage refused the slot (the stream failed).
  auto position_of = [&](uint64_t e, uint64_t c) {
    protocol::ChunkPosition pos;
    pos.epoch = e;
    pos.index_in_epoch = c;
    pos.sample_start = c * options_.chunk_size;
    pos.sample_count = static_cast<uint32_t>(
        std::min<uint64_t>(options_.chunk_size, epoch_samples - pos.sample_start));
    pos.epoch_samples = epoch_samples;
    pos.epoch_end = c + 1 == chunks;
    return pos;
  };
  // A chunk for relaxed readers: its own samples; its draws are its own too (its number is
  // unique, and stands for the epoch in every augmentation draw of its samples).
  auto relaxed_position = [&](const FillLease& lease) {
    protocol::ChunkPosition pos;
    pos.epoch = lease.seq;
    pos.sample_count = static_cast<uint32_t>(lease.samples.size());
    return pos;
  };
  std::mutex begin_mu;  // the stage's begin() is called by one thread at a time (chunk_stage.h)
  auto submit = [&](const FillLease& lease, const protocol::ChunkPosition& position,
                    std::shared_ptr<const std::vector<uint64_t>> order) {
    auto job = std::make_shared<ChunkJob>();
    job->lease = lease;
    job->position = position;
    const auto& pos = job->position;
    try {
      std::lock_guard lk(begin_mu);
      if (options_.stage) options_.stage->begin(lease, pos.sample_count);
    } catch (const std::exception& ex) {
      failed = true;
      core_.fail(ex.what());
      return false;
    }
    job->order = std::move(order);
    if (!options_.stage) {
      job->view_tensors.resize(lease.views.size());
      job->view_layouts.resize(lease.views.size());
      for (uint32_t v = 0; v < lease.views.size(); ++v) {
        if (!lease.views[v]) continue;
        job->view_tensors[v] = v == 0 ? tensors_ : source_.view_tensors(v);
        job->view_layouts[v] =
            v == 0 ? layout_ : SlotLayout::plan(job->view_tensors[v], options_.chunk_size);
      }
    }
    job->tensors = slot_layout_.specs(slot_tensors_, pos.sample_count);
    job->remaining = pos.sample_count;
    for (uint32_t p = 0; p < pos.sample_count; ++p) queue.push({job, p});
    return true;
  };
  // Chunks asked for again by consumers catching up, and chunks for relaxed readers, until
  // every consumer got End.
  std::thread regenerating;
  if (core_.regenerates()) {
    regenerating = std::thread([&] {
      std::shared_ptr<const std::vector<uint64_t>> order;  // of `order_epoch`: usually one epoch
      uint64_t order_epoch = 0;
      while (auto lease = core_.acquire_private(-1)) {
        if (!lease->samples.empty()) {
          auto samples = std::make_shared<const std::vector<uint64_t>>(lease->samples);
          if (failed || !submit(*lease, relaxed_position(*lease), samples)) return;
          continue;
        }
        const ChunkAddress at = *lease->regenerate;
        if (at.index >= chunks) {
          core_.fail("a consumer asked for chunk " + std::to_string(at.index) + " of epoch " +
                     std::to_string(at.epoch) + ", which has " + std::to_string(chunks));
          return;
        }
        if (!order || order_epoch != at.epoch) {
          order = std::make_shared<const std::vector<uint64_t>>(plan_.epoch_order(at.epoch));
          order_epoch = at.epoch;
        }
        if (failed || !submit(*lease, position_of(at.epoch, at.index), order)) return;
      }
    });
  }

  bool ok = true;
  for (uint64_t e = options_.first_epoch;
       ok && (options_.epochs == 0 || e < options_.first_epoch + options_.epochs); ++e) {
    auto order = std::make_shared<const std::vector<uint64_t>>(plan_.epoch_order(e));
    for (uint64_t c = 0; ok && c < chunks; ++c) {
      if (core_.skip_unwanted(position_of(e, c))) continue;  // every consumer left it (break)
      auto lease = core_.acquire();
      if (!lease && core_.finished()) break;  // only relaxed readers read, and they are done
      ok = lease && !failed && submit(*lease, position_of(e, c), order);
    }
    if (core_.finished()) break;
  }
  if (ok && !failed) core_.finish();
  if (regenerating.joinable()) regenerating.join();
  queue.close();
  for (auto& w : workers) w.join();
  uploads.close();
  if (uploader.joinable()) uploader.join();
  return ok && !failed;
}

}  // namespace batchcast
