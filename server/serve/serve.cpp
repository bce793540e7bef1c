#include "server/serve/serve.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "common/error.h"
#include "common/process.h"
#include "metrics/collector.h"
#include "server/host/stream_host.h"
#include "server/produce/chunk_stage.h"
#include "server/produce/decoded_cache.h"
#include "server/produce/image_source.h"
#include "server/produce/sample_producer.h"
#include "server/produce/slot_layout.h"
#include "server/produce/view_set.h"
#include "server/produce/synthetic_source.h"
#include "server/serve/ring_size.h"
#include "server/serve/signal_watcher.h"
#include "server/stream/stream_plan.h"
#ifdef BATCHCAST_HAVE_CUDA
#include "server/produce/cuda_stage.h"
#endif
#ifdef BATCHCAST_HAVE_NVJPEG
#include "server/produce/nvjpeg_stage.h"
#endif

namespace batchcast {
namespace {

// The decoded cache of `--cache decoded` over `samples` images, made from the views known at the
// start (the transform and every --view), said in the log with how much of the dataset it holds.
std::unique_ptr<DecodedCache> make_cache(const ServeConfig& c, const ViewSet& views,
                                         uint64_t samples) {
  int side = static_cast<int>(c.cache_side);
  if (!side)
    for (uint32_t v = 0; v < views.count(); ++v)
      side = std::max(side, eval_resize_size(views.pipeline(v).options().image_size));
  const uint64_t capacity =
      c.cache_memory ? c.cache_memory : default_cache_memory(read_host_memory());
  // A 4:3 photo at the cached size: what ImageNet's images mostly are.
  const uint64_t typical = DecodedCache::image_bytes(side * 4 / 3, side);
  const uint64_t fit = capacity / typical;
  spdlog::info(
      "decoded cache: images at most {} px on their shorter side, in at most {:.1f} GiB{}: about "
      "{} images of {:.0f} KiB (4:3), {}",
      side, capacity / 1073741824.0, c.cache_memory ? "" : " (half of the free memory)", fit,
      typical / 1024.0,
      fit >= samples ? fmt::format("all {} samples fit", samples)
                     : fmt::format("{} of the {} samples; the others are decoded every epoch",
                                   fit, samples));
  return std::make_unique<DecodedCache>(samples, side, capacity);
}

std::unique_ptr<SampleSource> make_source(const ServeConfig& c, const ViewSet* views) {
  if (!views) return std::make_unique<SyntheticSource>(c.synthetic, c.sample_bytes);
  auto dataset = c.data.empty() ? Dataset::file_list(c.file_list) : Dataset::image_folder(c.data);
  spdlog::info("dataset: {} samples{}", dataset.size(),
               dataset.classes().empty()
                   ? ""
                   : ", " + std::to_string(dataset.classes().size()) + " classes");
  std::unique_ptr<DecodedCache> cache;
  if (c.cache == CacheKind::kDecoded) cache = make_cache(c, *views, dataset.size());
  return std::make_unique<ImageSource>(std::move(dataset), *views, std::move(cache));
}

// The source's decoded cache, if it has one.
const DecodedCache* cache_of(const SampleSource& source) {
  const auto* images = dynamic_cast<const ImageSource*>(&source);
  return images ? images->cache() : nullptr;
}

// What the decoded cache did, after `separator`, for the status and done lines ("" without one).
std::string cache_text(const SampleSource& source, const char* separator) {
  const DecodedCache* cache = cache_of(source);
  if (!cache) return "";
  const DecodedCache::Stats s = cache->stats();
  return fmt::format("{}decoded cache: {} images, {:.0f}/{:.0f} MiB{}, {} hits, {} misses",
                     separator, s.images, s.bytes / 1048576.0, s.capacity / 1048576.0,
                     s.full ? " (full)" : "", s.hits, s.misses);
}

}  // namespace

// The metrics collector's view of the stream host: the server process (its CPU counted from its
// start) and one entry per consumer process (two Loaders in one process share its CPU: one entry,
// their samples summed), each named by the first consumer id seen in it. Every consumer counts,
// attached or gone (a gone one with the final counters of its Goodbye), so that nothing consumed
// is lost; the collector reads a process's CPU while it lives. While consumers still read, the
// counts are not final. After detach() the last snapshot is repeated, so that the collector's
// final tick can come after the host is gone. Called on the sampler thread; detach() on the
// owner's: under mu_.
class MetricsSource {
 public:
  MetricsSource(StreamHost& core, const SampleSource& source) : core_(&core), source_(&source) {}
  MetricsSnapshot operator()() {
    std::lock_guard lk(mu_);
    if (core_) last_ = read(*core_);
    return last_;
  }
  void detach() {
    std::lock_guard lk(mu_);
    if (core_) last_ = read(*core_);
    core_ = nullptr;
  }

 private:
  MetricsSnapshot read(StreamHost& core) {
    auto s = core.stats();
    MetricsSnapshot snap;
    snap.producer_blocked_s = s.producer_blocked_s;
    snap.ring_used = s.ring_occupied;
    snap.ring_size = s.ring_slots;
    snap.samples_decoded = s.samples_decoded();
    if (const DecodedCache* cache = cache_of(*source_)) {
      const DecodedCache::Stats c = cache->stats();
      snap.cache = MetricsSnapshot::Cache{c.hits, c.misses, c.images, c.bytes, c.capacity};
    }
    MetricsSnapshot::Process server{"server", "server", ::getpid(), 0, 0};
    server.since_start = true;  // start-up (dataset scan, pool) is the server's CPU too
    snap.processes.push_back(server);
    std::map<pid_t, size_t> entry;  // pid -> index in snap.processes
    for (const auto& cs : s.consumers) {
      auto [it, fresh] = entry.try_emplace(cs.pid, snap.processes.size());
      if (fresh) {
        const std::string& id = names_.try_emplace(cs.pid, std::to_string(cs.id)).first->second;
        snap.processes.push_back({"consumer", id, cs.pid, 0, 0});
      }
      snap.processes[it->second].samples += cs.samples;
      snap.processes[it->second].wait_s += cs.wait_s;
    }
    // A consumer that said Goodbye sent its final counters with it.
    if (const uint64_t reading = core.consumers_reading())
      snap.incomplete = std::to_string(reading) +
                        " consumer(s) still attached when the server stopped: what they "
                        "consumed after their last heartbeat is not counted";
    return snap;
  }

  std::mutex mu_;
  StreamHost* core_;
  const SampleSource* source_;
  std::map<pid_t, std::string> names_;
  MetricsSnapshot last_;
};

namespace {

// The slowest attached consumer and how far behind it is; what regeneration cost (the extra
// decoding for consumers that catch up or were decoupled).
std::string slowest_and_regenerated(const StreamStats& s) {
  const StreamStats::Consumer* slowest = nullptr;
  for (const auto& c : s.consumers)
    if (c.attached && (!slowest || c.behind > slowest->behind)) slowest = &c;
  std::string out;
  if (slowest && s.consumers_now > 1) {
    out += fmt::format(" | slowest: consumer {}{} (pid {}) {} samples behind", slowest->id,
                       slowest->name.empty() ? "" : " '" + slowest->name + "'", slowest->pid,
                       slowest->behind);
    if (slowest->decoupled)
      out += ", decoupled";
    else if (slowest->holding_s >= 1)
      out += fmt::format(", holding the stream back {:.0f} s", slowest->holding_s);
  }
  if (s.chunks_regenerated)
    out += fmt::format(" | {} chunks regenerated, {} decoupling(s)", s.chunks_regenerated,
                       s.decouplings);
  if (s.chunks_relaxed || s.samples_taken_relaxed)
    out += fmt::format(" | relaxed readers: {} samples decoded for them, {} taken",
                       s.samples_relaxed, s.samples_taken_relaxed);
  return out;
}

void log_status(const StreamStats& s, const StreamStats& last, double seconds,
                const std::string& cache) {
  spdlog::info(
      "{:.0f} samples/s | {} consumer(s) | ring {}/{} | {} samples published{}{}{}",
      (s.samples_published - last.samples_published) / seconds, s.consumers_now, s.ring_occupied,
      s.ring_slots, s.samples_published, slowest_and_regenerated(s), cache,
      s.messages_dropped ? fmt::format(" | {} bad messages dropped", s.messages_dropped) : "");
}

// The stream is done, but consumers may still be reading their last batches. A GPU pool dies
// with this process (CUDA IPC lets no importer keep it alive: a consumer would read freed
// memory), so the server stays until every consumer has released its batches and left, or died
// (pid checked every 0.2 s, heartbeats otherwise). The metrics count a consumer's samples until
// its Goodbye, which carries its final counters, so with metrics the server stays until every
// consumer said Goodbye or died (a host pool's mappings outlive the server: batches a consumer
// still holds stay readable). A signal ends the wait (the metrics then say they are
// incomplete).
void wait_for_consumers(const std::atomic<bool>& stop, const std::function<uint64_t()>& left,
                        const char* why) {
  double next_note = monotonic_seconds();
  while (!stop && left() > 0) {
    if (monotonic_seconds() >= next_note) {
      spdlog::info("stream done; waiting for {} consumer(s) ({})", left(), why);
      next_note += 10;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

}  // namespace

ServeRun::ServeRun(const ServeConfig& c) : config_(c) {
  if (!c.synthetic)
    views_ = std::make_unique<ViewSet>(c.transform_view(), c.staging(), c.decoder_flag(),
                                       c.batch_size);
  // The views served from the start share the ring's budget with view 0 (ring_size.h).
  uint64_t views_bytes = views_ ? views_->layout(0).bytes : 0;
  for (const auto& text : c.views) {
    const uint32_t known = views_->count();
    StreamHostOptions::ViewAnswer answer = views_->answer(text);
    if (!answer.error.empty()) throw Error("--view " + answer.error);
    if (views_->count() > known) views_bytes += answer.slot_bytes;
  }
  source_ = make_source(c, views_.get());  // after the views: the cache's side is the largest's
  plan_ = std::make_unique<StreamPlan>(
      source_->size(), StreamPlanOptions{c.transform.seed, c.shuffle, c.rank, c.world_size});
  SampleProducerOptions po = c.producer_options();
  StreamHostOptions so = c.server_options(views_ ? views_->slot_tensors(0) : source_->tensors(),
                                          plan_->epoch_samples(), views_bytes);
  so.dataset_size = source_->size();
  so.epoch_shard = [plan = plan_.get()](uint64_t epoch) { return plan->epoch_order(epoch); };
  so.seed = c.transform.seed;
  if (views_)
    so.find_view = [views = views_.get()](const std::string& text) {
      return views->answer(text);
    };
  spdlog::info("ring: {} slots of {:.1f} MiB ({:.0f} MiB{}{})", so.ring_slots,
               so.slot_bytes / 1048576.0, so.ring_slots * (so.slot_bytes / 1048576.0),
               views_bytes > so.slot_bytes
                   ? fmt::format(", {:.0f} MiB with the --view views",
                                 so.ring_slots * (views_bytes / 1048576.0))
                   : "",
               so.lead_chunks ? ", sized by --ring-memory and the epoch; trainers may drift "
                                "apart by " +
                                    std::to_string(so.ring_slots - so.lead_chunks) + " chunks"
                              : "");
  // A consumer keeps its current batch and its prefetch (3 chunks) while its user does not read
  // (docs/stream.md, the limit of tiny rings).
  if (so.ring_slots < 5)
    spdlog::warn(
        "a ring of {} slots: a trainer that pauses with a batch in hand can hold the "
        "others until it reads again; give --ring 5 or more",
        so.ring_slots);
  core_ = std::make_unique<StreamHost>(std::move(so));
  for (const auto& text : c.views) {
    try {
      core_->serve_view(text);
    } catch (const Error& e) {
      throw Error(std::string("--view ") + e.what());
    }
  }
#ifdef BATCHCAST_HAVE_NVJPEG
  if (c.gpu_decoding()) {
    std::optional<DecodeSplit::Stream> mixed;  // the engine helps while consumers wait
    if (c.decoder == DecoderKind::kMixed)
      mixed = DecodeSplit::Stream{[core = core_.get()] { return core->waited_chunk(); },
                                  [core = core_.get()] { return core->samples_sent(); },
                                  monotonic_seconds};
    stage_ = std::make_unique<NvjpegStage>(
        [core = core_.get()](uint32_t view) { return core->view_memory(view).arenas(); },
        static_cast<const ImageSource&>(*source_), c.batch_size, po.on_error, std::move(mixed),
        po.workers);
  }
#endif
#ifdef BATCHCAST_HAVE_CUDA
  if (c.on_gpu() && !stage_)
    stage_ = std::make_unique<CudaStage>(
        *source_,
        [core = core_.get(), views = views_.get()](uint32_t view) {
          // A synthetic source has view 0 only, copied as it is.
          return CudaStage::View{core->view_memory(view).arenas(),
                                 views ? views->conversions(view)
                                       : std::vector<TensorConversion>()};
        },
        c.batch_size);
  if (const ArenaSet* arenas = core_->memory().arenas(); arenas && arenas->arenas().size() > 1)
    spdlog::info("the pool is on {} GPUs, every chunk copied from the first: {}",
                 arenas->arenas().size(), arenas->describe_copies());
#endif
  po.stage = stage_.get();
  if (!c.metrics_dir.empty()) {
    metrics_source_ = std::make_shared<MetricsSource>(*core_, *source_);
    CollectorOptions co;
    co.dir = c.metrics_dir;
    co.interval_s = c.metrics_interval;
    collector_ = std::make_unique<MetricsCollector>(
        co, [source = metrics_source_] { return (*source)(); });
    collector_->start();
  }
  producer_ = std::make_unique<SampleProducer>(*core_, *source_, *plan_, po);
  producing_ = std::thread([this] {
    produce_ok_ = producer_->run();
    produced_ = true;
  });
}

ServeRun::~ServeRun() {
  stop();
  if (producing_.joinable()) producing_.join();
  if (!collector_) return;
  // The server's CPU counts to its end: the collector's final tick comes after the stream, its
  // pool and its socket are torn down, with the host's last counters.
  metrics_source_->detach();
  producer_.reset();
  stage_.reset();
  core_.reset();
  plan_.reset();
  source_.reset();
  views_.reset();
  try {
    collector_->stop();
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
  }
}

void ServeRun::stop() {
  stop_ = true;
  core_->stop();
}

int ServeRun::wait() {
  StreamHost& core = *core_;
  auto last = core.stats();
  double last_t = monotonic_seconds();
  while (!stop_) {
    if (core.failed() || (produced_ && (!produce_ok_ || core.wait_finished(0)))) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    double now = monotonic_seconds();
    if (config_.status_interval > 0 && now - last_t >= config_.status_interval) {
      auto s = core.stats();
      log_status(s, last, now - last_t, cache_text(*source_, " | "));
      last = s;
      last_t = now;
    }
  }
  if (!produced_ && !stop_) core.wait_finished(-1);
  const bool failed = core.failed() || (!stop_ && !(produce_ok_ && core.wait_finished(0)));
  if (failed && config_.fail_linger > 0) {
    // Trainers that attach now still get the error (and those after the exit read the failure
    // record): without the linger they would wait out their timeout on a silent endpoint.
    spdlog::info("still answering on {} for {} s with the error (--fail-linger)", core.endpoint(),
                 config_.fail_linger);
    const double until = monotonic_seconds() + config_.fail_linger;
    while (!stop_ && monotonic_seconds() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (!failed && config_.on_gpu())
    wait_for_consumers(
        stop_, [&core] { return core.consumers_now(); },
        "to release their batches and leave: they are reading the GPU pool");
  else if (!failed && collector_)
    wait_for_consumers(
        stop_, [&core] { return core.consumers_reading(); },
        "to finish and leave: their samples are counted until then");
  core.stop();
  if (producing_.joinable()) producing_.join();
  auto s = core.stats();
  spdlog::info(
      "done: {} chunks, {} samples published, {} bad samples skipped, {} consumers served, {} died"
      "; {} chunks regenerated (consumers catching up or decoupled: {} decoupling(s)){}; {} "
      "samples decoded in all{}; the producer found the ring full for {:.1f} s",
      s.chunks_published, s.samples_published, producer_->skipped_samples(), s.consumers_ever,
      s.consumers_died, s.chunks_regenerated, s.decouplings,
      s.samples_taken_relaxed ? fmt::format("; {} chunks decoded for relaxed readers ({} samples; "
                                            "they took {} samples from every chunk)",
                                            s.chunks_relaxed, s.samples_relaxed,
                                            s.samples_taken_relaxed)
                              : "",
      s.samples_decoded(), cache_text(*source_, "; "), s.producer_blocked_s);
  return failed ? 1 : 0;  // a stop during the linger does not make a failure a success
}

int serve(const ServeConfig& c) {
  SignalWatcher signals;  // before any thread starts: they inherit its signal mask
  std::vector<std::unique_ptr<ServeRun>> servers;
  for (const ServeConfig& rc : c.every_rank ? c.rank_configs() : std::vector<ServeConfig>{c}) {
    if (c.every_rank) spdlog::info("rank {} of {}: {}", rc.rank, rc.world_size, rc.endpoint);
    servers.push_back(std::make_unique<ServeRun>(rc));
  }
  signals.watch([&servers](int signo) {
    spdlog::info("received {}: shutting down", signal_name(signo));
    for (auto& server : servers) server->stop();
  });
  int code = 0;
  for (auto& server : servers) code = std::max(code, server->wait());
  signals.stop();  // its callback uses `servers`, which are destroyed before `signals`
  return code;
}

}  // namespace batchcast
