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
#include "decoders/view_spec.h"
#include "metrics/collector.h"
#include "server/host/stream_host.h"
#include "server/produce/chunk_stage.h"
#include "server/produce/image_source.h"
#include "server/produce/sample_producer.h"
#include "server/produce/slot_layout.h"
#include "server/produce/synthetic_source.h"
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

std::unique_ptr<SampleSource> make_source(const ServeConfig& c) {
  if (c.synthetic) return std::make_unique<SyntheticSource>(c.synthetic, c.sample_bytes);
  auto dataset = c.data.empty() ? Dataset::file_list(c.file_list) : Dataset::image_folder(c.data);
  spdlog::info("dataset: {} samples{}", dataset.size(),
               dataset.classes().empty()
                   ? ""
                   : ", " + std::to_string(dataset.classes().size()) + " classes");
  return std::make_unique<ImageSource>(std::move(dataset), c.pipeline_options());
}

// The metrics collector's view of the stream host: the server process and one entry per consumer
// process (two Loaders in one process share its CPU: one entry, their samples summed), each
// named by the first consumer id seen in it. Every consumer counts, attached or gone (a gone one
// with the final counters of its Goodbye), so that nothing consumed is lost; the collector reads
// a process's CPU while it lives. While consumers still read, the counts are not final.
std::unique_ptr<MetricsCollector> make_collector(const ServeConfig& c, StreamHost& core) {
  if (c.metrics_dir.empty()) return nullptr;
  CollectorOptions co;
  co.dir = c.metrics_dir;
  co.interval_s = c.metrics_interval;
  // Called on the sampler thread only: the names need no lock.
  return std::make_unique<MetricsCollector>(
      co, [&core, names = std::map<pid_t, std::string>()]() mutable {
        auto s = core.stats();
        MetricsSnapshot snap;
        snap.producer_blocked_s = s.producer_blocked_s;
        snap.ring_used = s.ring_occupied;
        snap.ring_size = s.ring_slots;
        snap.processes.push_back({"server", "server", ::getpid(), 0, 0});
        std::map<pid_t, size_t> entry;  // pid -> index in snap.processes
        for (const auto& cs : s.consumers) {
          auto [it, fresh] = entry.try_emplace(cs.pid, snap.processes.size());
          if (fresh) {
            const std::string& id = names.try_emplace(cs.pid, std::to_string(cs.id)).first->second;
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
      });
}

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
  return out;
}

void log_status(const StreamStats& s, const StreamStats& last, double seconds) {
  spdlog::info(
      "{:.0f} samples/s | {} consumer(s) | ring {}/{} | {} samples published{}{}",
      (s.samples_published - last.samples_published) / seconds, s.consumers_now, s.ring_occupied,
      s.ring_slots, s.samples_published, slowest_and_regenerated(s),
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

// A new view's slots: their size and its tensors in them, for chunks of `chunk` samples.
void lay_out_view(StreamHostOptions::ViewAnswer& answer, std::vector<SampleTensor> tensors,
                  uint32_t chunk) {
  SlotLayout layout = SlotLayout::plan(tensors, chunk);
  answer.slot_bytes = layout.bytes;
  answer.specs = [layout, tensors = std::move(tensors)](uint32_t samples) {
    return layout.specs(tensors, samples);
  };
}

// A consumer's (or --view's) view text -> a view of `source` (decoders/view_spec.h's
// resolve_view over the transform as configured: a field it derives, such as eval's resize
// size, is derived again for the view's own size): a view it has, or a new one, with its slot
// layout for chunks of `chunk` samples.
StreamHostOptions::ViewAnswer answer_view(ImageSource& source, const PipelineOptions& transform,
                                          uint32_t chunk, const std::string& text) {
  StreamHostOptions::ViewAnswer answer;
  try {
    const PipelineOptions view = resolve_view(text, transform);
    if (auto known = source.find_view(view)) {
      answer.view = *known;
      return answer;
    }
    answer.view = source.add_view(view);
    lay_out_view(answer, source.view_tensors(answer.view), chunk);
  } catch (const Error& e) {
    answer.error = e.what();
  }
  return answer;
}

}  // namespace

// The views of a GPU pool (docs/views.md). View v is known by its options as asked
// (view_spec_text with seed: two outputs of one crop are two views). Decoded on the CPU, the
// source's view v is their uint8 HWC staging and conversions[v] turns it into the view's output
// on the GPU (CudaStage); decoded on the GPU (--decoder nvjpeg|mixed), the source's view v is the
// view itself and conversions[v] is empty (NvjpegStage). Views are answered at start (--view) or
// on the event loop when a consumer asks for a new one (the host then allocates its arenas, the
// stage its staging at the first lease that carries it), and read by the stage's begin() on the
// producer thread: under mu.
struct GpuViews {
  std::mutex mu;
  std::vector<std::string> texts;
#ifdef BATCHCAST_HAVE_CUDA
  std::vector<std::vector<TensorConversion>> conversions;
#endif
};

#ifdef BATCHCAST_HAVE_CUDA

namespace {

StreamHostOptions::ViewAnswer answer_gpu_view(GpuViews& views, ImageSource& source,
                                              const ServeConfig& c, const std::string& text) {
  StreamHostOptions::ViewAnswer answer;
  try {
    const PipelineOptions view = c.decodable_view(text);
    const std::string key = view_spec_text(view, true);
    std::lock_guard lk(views.mu);
    for (uint32_t v = 0; v < views.texts.size(); ++v)
      if (views.texts[v] == key) {
        answer.view = v;
        return answer;
      }
    std::vector<TensorConversion> conversions = c.conversions(view);
    if (source.view_count() != views.texts.size())
      throw Error("this server adds no views any more (an earlier view could not be made)");
    answer.view = source.add_view(c.staged(view));
    std::vector<SampleTensor> tensors =
        CudaStage::converted(source.view_tensors(answer.view), conversions);
    views.texts.push_back(key);
    views.conversions.push_back(conversions);
    lay_out_view(answer, std::move(tensors), c.batch_size);
  } catch (const Error& e) {
    answer.error = e.what();
  }
  return answer;
}

}  // namespace
#endif

ServeRun::ServeRun(const ServeConfig& c) : config_(c) {
  source_ = make_source(c);
  plan_ = std::make_unique<StreamPlan>(
      source_->size(), StreamPlanOptions{c.transform.seed, c.shuffle, c.rank, c.world_size});
  SampleProducerOptions po = c.producer_options();
  StreamHostOptions so = c.server_options(*source_, plan_->epoch_samples());
  auto* images = c.synthetic ? nullptr : static_cast<ImageSource*>(source_.get());
  std::function<StreamHostOptions::ViewAnswer(const std::string&)> find_view;
  if (images && !c.on_gpu())
    find_view = [images, transform = c.pipeline_options(),
                 chunk = c.batch_size](const std::string& text) {
      return answer_view(*images, transform, chunk, text);
    };
#ifdef BATCHCAST_HAVE_CUDA
  if (images && c.on_gpu()) {
    gpu_views_ = std::make_unique<GpuViews>();
    gpu_views_->texts.push_back(view_spec_text(c.transform, true));
    gpu_views_->conversions.push_back(c.conversions());
    find_view = [views = gpu_views_.get(), images, &c = config_](const std::string& text) {
      return answer_gpu_view(*views, *images, c, text);
    };
  }
#endif
  so.find_view = find_view;
  spdlog::info("ring: {} slots of {:.1f} MiB ({:.0f} MiB{})", so.ring_slots,
               so.slot_bytes / 1048576.0, so.ring_slots * (so.slot_bytes / 1048576.0),
               so.lead_chunks ? ", sized by --ring-memory; trainers may drift apart by " +
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
    DecodeSplit::WaitedChunk waited;  // --decoder mixed: the engine takes what consumers wait for
    if (c.decoder == DecoderKind::kMixed)
      waited = [core = core_.get()] { return core->waited_chunk(); };
    stage_ = std::make_unique<NvjpegStage>(
        [core = core_.get()](uint32_t view) { return core->view_memory(view).arenas(); },
        static_cast<const ImageSource&>(*source_), c.batch_size, po.on_error, std::move(waited));
  }
#endif
#ifdef BATCHCAST_HAVE_CUDA
  if (c.on_gpu() && !stage_)
    stage_ = std::make_unique<CudaStage>(
        *source_,
        [core = core_.get(), views = gpu_views_.get(), &c = config_](uint32_t view) {
          CudaStage::View v{core->view_memory(view).arenas(), c.conversions()};
          if (views) {  // an image folder's views (a synthetic source has view 0 only)
            std::lock_guard lk(views->mu);
            v.conversions = views->conversions.at(view);
          }
          return v;
        },
        c.batch_size);
  if (const ArenaSet* arenas = core_->memory().arenas(); arenas && arenas->arenas().size() > 1)
    spdlog::info("the pool is on {} GPUs, every chunk copied from the first: {}",
                 arenas->arenas().size(), arenas->describe_copies());
#endif
  po.stage = stage_.get();
  collector_ = make_collector(c, *core_);
  if (collector_) collector_->start();
  producer_ = std::make_unique<SampleProducer>(*core_, *source_, *plan_, po);
  producing_ = std::thread([this] {
    produce_ok_ = producer_->run();
    produced_ = true;
  });
}

ServeRun::~ServeRun() {
  stop();
  if (producing_.joinable()) producing_.join();
  if (collector_) collector_->stop();
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
      log_status(s, last, now - last_t);
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
      "; {} chunks regenerated (consumers catching up or decoupled: {} decoupling(s)); the "
      "producer found the ring full for {:.1f} s",
      s.chunks_published, s.samples_published, producer_->skipped_samples(), s.consumers_ever,
      s.consumers_died, s.chunks_regenerated, s.decouplings, s.producer_blocked_s);
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
