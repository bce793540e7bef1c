// batchcast: the command-line program. Subcommands: serve (the server), make-dataset (an
// ImageNet-like dataset cut from real photos), report (plots of metrics run directories).
#include <signal.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <memory>
#include <thread>

#include "common/error.h"
#include "common/process.h"
#include "decoders/make_dataset.h"
#include "metrics/collector.h"
#include "server/image_source.h"
#include "server/sample_producer.h"
#include "server/server_core.h"
#include "server/synthetic_source.h"
#ifdef BATCHCAST_HAVE_CUDA
#include "server/cuda_stage.h"
#endif
#ifdef BATCHCAST_HAVE_NVJPEG
#include "server/nvjpeg_stage.h"
#endif

namespace batchcast {
namespace {

struct ServeArgs {
  std::string data;
  std::string file_list;
  uint64_t synthetic = 0;
  uint64_t sample_bytes = 1024;
  std::string endpoint;
  bool listen_all = false;
  uint32_t batch_size = 64;
  int image_size = 224;
  bool eval = false;
  uint32_t workers = std::max(1u, std::thread::hardware_concurrency());
  std::string device = "cpu";
  std::string decoder = "cpu";
  uint64_t epochs = 1;
  uint64_t seed = 0;
  bool shuffle = true;
  uint32_t min_consumers = 1;
  std::string output = "float32";
  std::string on_error = "raise";
  uint32_t ring = 8;
  uint32_t rank = 0;
  uint32_t world_size = 1;
  std::string stall_policy = "wait";
  double stall_timeout = 10;
  std::string metrics_dir;
  double metrics_interval = 1.0;
  double status_interval = 5.0;
};

// Blocks SIGINT/SIGTERM in every thread; a watcher thread turns them into a clean stop.
// Lock-free, so async-signal-safe, and read by another thread (a sig_atomic_t would race).
std::atomic<int> g_signal{0};
static_assert(std::atomic<int>::is_always_lock_free);
void record_signal(int sig) { g_signal.store(sig); }

// SIGINT/SIGTERM become a clean stop. A handler records them, whichever thread they land on
// (blocking them is not enough: libraries such as NVML and the CUDA driver start threads of
// their own), and a watcher thread acts on the record.
class SignalWatcher {
 public:
  SignalWatcher() {
    struct sigaction sa {};
    sa.sa_handler = record_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
  }
  void watch(std::function<void(int)> on_signal) {
    thread_ = std::thread([this, on_signal] {
      while (!done_) {
        if (int sig = g_signal.exchange(0)) on_signal(sig);
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    });
  }
  // Joins the watcher: call it before whatever on_signal touches is destroyed.
  void stop() {
    done_ = true;
    if (thread_.joinable()) thread_.join();
  }
  ~SignalWatcher() { stop(); }

 private:
  std::atomic<bool> done_{false};
  std::thread thread_;
};

// "cpu" -> -1; "cuda" or "cuda:K" -> K. Anything else throws.
int parse_device(const std::string& device) {
  if (device == "cpu") return -1;
  if (device.rfind("cuda", 0) != 0)
    throw Error("--device " + device + ": use cpu or cuda:K (K a GPU index)");
#ifndef BATCHCAST_HAVE_CUDA
  throw Error("--device " + device + ": this build has no CUDA support (use --device cpu)");
#else
  std::string index = device.size() > 5 && device[4] == ':' ? device.substr(5) : "";
  if (device != "cuda" && (index.empty() || index.find_first_not_of("0123456789") != std::string::npos))
    throw Error("--device " + device + ": use cpu or cuda:K (K a GPU index)");
  return require_cuda_device(index.empty() ? 0 : std::stoi(index));  // fails at once without a GPU
#endif
}

// Checks --decoder against the rest of the command line; true for nvjpeg.
bool gpu_decoding(const ServeArgs& a) {
  if (a.decoder == "cpu") return false;
  if (a.decoder != "nvjpeg") throw Error("--decoder " + a.decoder + ": use cpu or nvjpeg");
  if (a.synthetic) throw Error("--decoder nvjpeg decodes images; --synthetic has none (drop it)");
  if (a.device == "cpu")
    throw Error("--decoder nvjpeg decodes into a GPU pool: add --device cuda:K");
#ifndef BATCHCAST_HAVE_NVJPEG
  throw Error("--decoder nvjpeg: this build has no nvJPEG (its CUDA toolkit lacks nvjpeg.h); "
              "rebuild where the toolkit has it, or use --decoder cpu");
#endif
  return true;
}

int serve(const ServeArgs& a) {
  SignalWatcher signals;
  [[maybe_unused]] const bool gpu_decode = gpu_decoding(a);
  [[maybe_unused]] const int cuda_device = parse_device(a.device);
#ifdef BATCHCAST_HAVE_CUDA
  // GPU pools: the CPU decodes uint8 HWC into pinned staging; the GPU normalises (cuda_stage.h).
  std::vector<TensorConversion> conversions;
#endif
  std::unique_ptr<SampleSource> source;
  [[maybe_unused]] const ImageSource* images = nullptr;
  int sources = (a.synthetic > 0) + !a.data.empty() + !a.file_list.empty();
  if (sources != 1) throw Error("give exactly one of --data DIR, --file-list FILE or --synthetic N");
  if (a.synthetic) {
    source = std::make_unique<SyntheticSource>(a.synthetic, a.sample_bytes);
  } else {
    PipelineOptions p;
    p.image_size = a.image_size;
    p.train = !a.eval;
    p.output = parse_dtype(a.output, kOutputDTypes);
    p.seed = a.seed;
#ifdef BATCHCAST_HAVE_CUDA
    if (cuda_device >= 0 && !gpu_decode && p.output != DType::kUInt8) {
      conversions.resize(1);
      conversions[0].normalize = p.output;
      conversions[0].mean = p.mean;
      conversions[0].std = p.std;
      p.output = DType::kUInt8;
    }
#endif
    auto dataset = a.data.empty() ? Dataset::file_list(a.file_list) : Dataset::image_folder(a.data);
    spdlog::info("dataset: {} samples{}", dataset.size(),
                 dataset.classes().empty() ? "" : ", " + std::to_string(dataset.classes().size()) + " classes");
    auto image_source = std::make_unique<ImageSource>(std::move(dataset), p);
    images = image_source.get();
    source = std::move(image_source);
  }
  StreamPlan plan(source->size(), {a.seed, a.shuffle, a.rank, a.world_size});
  SampleProducerOptions po;
  po.batch_size = a.batch_size;
  po.workers = a.workers;
  po.epochs = a.epochs;
  if (a.on_error != "raise" && a.on_error != "skip")
    throw Error("--on-error " + a.on_error + ": use raise or skip");
  po.on_error = a.on_error == "skip" ? OnErrorPolicy::kSkip : OnErrorPolicy::kRaise;

  ServerOptions so;
  so.endpoint = a.endpoint;
  so.allow_remote = a.listen_all;
  so.ring_slots = a.ring;
  so.slot_bytes = SlotLayout::plan(source->tensors(), a.batch_size).bytes;
#ifdef BATCHCAST_HAVE_CUDA
  if (cuda_device >= 0) {
    so.device = protocol::DeviceKind::kCuda;
    so.device_index = static_cast<uint32_t>(cuda_device);
    so.slot_bytes =
        SlotLayout::plan(CudaStage::converted(source->tensors(), conversions), a.batch_size).bytes;
  }
#endif
  so.batch_size = a.batch_size;
  so.epoch_samples = plan.epoch_samples();
  so.epochs = a.epochs;
  so.min_consumers = a.min_consumers;
  if (a.stall_policy != "wait" && a.stall_policy != "skip")
    throw Error("--stall-policy " + a.stall_policy + ": use wait or skip");
  so.stall_policy = a.stall_policy == "skip" ? StallPolicy::kSkip : StallPolicy::kWait;
  so.stall_timeout_s = a.stall_timeout;
  ServerCore core(so);
#ifdef BATCHCAST_HAVE_CUDA
  std::unique_ptr<ChunkStage> stage;  // destroyed before the core whose arena it borrows
#ifdef BATCHCAST_HAVE_NVJPEG
  if (gpu_decode)
    stage = std::make_unique<NvjpegStage>(*core.device_arena(), *images, a.batch_size, po.on_error);
#endif
  if (cuda_device >= 0 && !stage)
    stage = std::make_unique<CudaStage>(*core.device_arena(), *source, conversions, a.batch_size);
  po.stage = stage.get();
#endif

  std::atomic<bool> stop{false};
  signals.watch([&](int sig) {
    spdlog::info("received {}: shutting down", sig == SIGINT ? "SIGINT" : "SIGTERM");
    stop = true;
    core.stop();
  });

  std::unique_ptr<MetricsCollector> collector;
  if (!a.metrics_dir.empty()) {
    CollectorOptions co;
    co.dir = a.metrics_dir;
    co.interval_s = a.metrics_interval;
    collector = std::make_unique<MetricsCollector>(co, [&core] {
      auto s = core.stats();
      MetricsSnapshot snap;
      snap.producer_blocked_s = s.producer_blocked_s;
      snap.ring_used = s.ring_occupied;
      snap.ring_size = s.ring_slots;
      snap.processes.push_back({"server", "server", ::getpid(), 0, 0});
      // Consumers that left stay listed while their process lives, so their CPU is counted.
      for (const auto& c : s.consumers)
        if (c.attached || process_alive(c.pid))
          snap.processes.push_back({"consumer", std::to_string(c.id), c.pid, c.samples, c.wait_s});
      return snap;
    });
    collector->start();
  }

  SampleProducer producer(core, *source, plan, po);
  std::atomic<bool> produced{false};
  bool produce_ok = false;
  std::thread producing([&] {
    produce_ok = producer.run();
    produced = true;
  });

  auto last = core.stats();
  double last_t = monotonic_seconds();
  while (!stop) {
    if (produced && (!produce_ok || core.wait_finished(0))) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    double now = monotonic_seconds();
    if (a.status_interval > 0 && now - last_t >= a.status_interval) {
      auto s = core.stats();
      spdlog::info("{:.0f} samples/s | {} consumer(s) | ring {}/{} | {} samples published{}",
                   (s.samples_published - last.samples_published) / (now - last_t), s.consumers_now,
                   s.ring_occupied, s.ring_slots, s.samples_published,
                   s.messages_dropped ? fmt::format(" | {} bad messages dropped", s.messages_dropped)
                                      : "");
      last = s;
      last_t = now;
    }
  }
  if (!produced && !stop) core.wait_finished(-1);
  bool finished = produced && produce_ok && core.wait_finished(0);
  if (!finished && !stop) std::this_thread::sleep_for(std::chrono::milliseconds(500));  // let errors reach consumers
  signals.stop();  // its callback uses `core`, which is destroyed before `signals`
  core.stop();
  producing.join();
  if (collector) collector->stop();
  auto s = core.stats();
  spdlog::info("done: {} chunks, {} samples published, {} bad samples skipped, {} consumers served, {} died",
               s.chunks_published, s.samples_published, producer.skipped_samples(), s.consumers_ever,
               s.consumers_died);
  if (stop) return 0;
  return finished ? 0 : 1;
}

}  // namespace
}  // namespace batchcast

int main(int argc, char** argv) {
  using namespace batchcast;
  CLI::App app{"batchcast: one shared data-loading server for collocated training jobs"};
  app.require_subcommand(1);
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error")->capture_default_str();

  ServeArgs a;
  auto* serve_cmd = app.add_subcommand("serve", "decode a dataset once and serve its batches");
  serve_cmd->add_option("--data", a.data, "image folder (torchvision ImageFolder layout)");
  serve_cmd->add_option("--file-list", a.file_list, "text file of 'path label' lines");
  serve_cmd->add_option("--synthetic", a.synthetic, "serve N synthetic samples (tests, benchmarks)");
  serve_cmd->add_option("--sample-bytes", a.sample_bytes, "bytes per synthetic sample")->capture_default_str();
  serve_cmd->add_option("--endpoint", a.endpoint, "ipc://PATH or tcp://HOST:PORT (default ipc:///tmp/batchcast-UID.sock)");
  serve_cmd->add_flag("--listen-all", a.listen_all, "let tcp://*:PORT listen on every interface, not only loopback");
  serve_cmd->add_option("--batch-size", a.batch_size, "samples per chunk; consumers' default batch size")->capture_default_str();
  serve_cmd->add_option("--image-size", a.image_size, "output side in pixels")->capture_default_str();
  serve_cmd->add_flag("--eval", a.eval, "Resize + CenterCrop instead of RandomResizedCrop + flip");
  serve_cmd->add_option("--workers", a.workers, "decoding threads")->capture_default_str();
  serve_cmd->add_option("--device", a.device, "cpu or cuda:K")->capture_default_str();
  serve_cmd->add_option("--decoder", a.decoder, "cpu (TurboJPEG/libjpeg) or nvjpeg (GPU; needs --device cuda:K)")->capture_default_str();
  serve_cmd->add_option("--epochs", a.epochs, "epochs to serve (0: until stopped)")->capture_default_str();
  serve_cmd->add_option("--seed", a.seed, "seed of shuffling and augmentation")->capture_default_str();
  serve_cmd->add_flag("--shuffle,!--no-shuffle", a.shuffle, "shuffle every epoch (default on)");
  serve_cmd->add_option("--min-consumers", a.min_consumers, "consumers to wait for before the stream starts")->capture_default_str();
  serve_cmd->add_option("--output", a.output, "float32, float16, bfloat16 (normalised) or uint8")->capture_default_str();
  serve_cmd->add_option("--on-error", a.on_error, "bad samples: raise (fail the stream) or skip (count them)")->capture_default_str();
  serve_cmd->add_option("--ring", a.ring, "slots in the shared pool")->capture_default_str();
  serve_cmd->add_option("--rank", a.rank, "this server's shard (DistributedSampler semantics)")->capture_default_str();
  serve_cmd->add_option("--world-size", a.world_size, "number of shards")->capture_default_str();
  serve_cmd->add_option("--stall-policy", a.stall_policy, "wait (never skip data) or skip")->capture_default_str();
  serve_cmd->add_option("--stall-timeout", a.stall_timeout, "seconds before skip leaves an idle consumer behind")->capture_default_str();
  serve_cmd->add_option("--metrics-dir", a.metrics_dir, "write CPU/throughput metrics (CSV + summary.json) here");
  serve_cmd->add_option("--metrics-interval", a.metrics_interval, "seconds between metric samples")->capture_default_str();
  serve_cmd->add_option("--status-interval", a.status_interval, "seconds between status lines (0: none)")->capture_default_str();

  MakeDatasetOptions md;
  auto* make_cmd = app.add_subcommand("make-dataset", "cut an ImageNet-like JPEG dataset from real photos");
  make_cmd->add_option("--out", md.out_dir, "output folder (ImageFolder layout)")->required();
  make_cmd->add_option("--source", md.source_dir, "folder of photos (e.g. Debian's mate-backgrounds)")->capture_default_str();
  make_cmd->add_option("--classes", md.classes, "class folders")->capture_default_str();
  make_cmd->add_option("--per-class", md.images_per_class, "images per class")->capture_default_str();
  make_cmd->add_option("--seed", md.seed, "seed")->capture_default_str();

  std::vector<std::string> report_dirs;
  std::string report_out;
  auto* report_cmd = app.add_subcommand("report", "plot metrics run directories (PNG + HTML)");
  report_cmd->add_option("dirs", report_dirs, "run directories (written by --metrics-dir)")->required();
  report_cmd->add_option("--out", report_out, "output folder (default: DIR/report)");

  auto* bench_cmd = app.add_subcommand(
      "bench", "N collocated trainings, batchcast vs N DataLoaders (bench/collocated.py; try --help)");
  bench_cmd->allow_extras()->prefix_command();
  bench_cmd->set_help_flag();  // --help goes to the script

  CLI11_PARSE(app, argc, argv);
  spdlog::set_default_logger(spdlog::stderr_color_mt("batchcast"));  // stdout stays for data
  spdlog::set_level(spdlog::level::from_str(log_level));
  try {
    if (*serve_cmd) return serve(a);
    if (*make_cmd) {
      auto r = make_dataset(md);
      spdlog::info("wrote {} images ({:.1f} MiB) in {} classes to {} from {} photos", r.images,
                   r.bytes / 1048576.0, r.classes, md.out_dir, r.sources);
      return 0;
    }
    if (*report_cmd || *bench_cmd) {
      std::vector<std::string> args = {BATCHCAST_PYTHON};
      if (*report_cmd) {
        args.insert(args.end(), {"-m", "batchcast.report"});
        args.insert(args.end(), report_dirs.begin(), report_dirs.end());
        if (!report_out.empty()) args.insert(args.end(), {"--out", report_out});
      } else {
        args.push_back(std::string(BATCHCAST_SOURCE_DIR) + "/bench/collocated.py");
        for (const auto& extra : bench_cmd->remaining()) args.push_back(extra);
      }
      std::string path = BATCHCAST_PYTHON_DIR;
      if (const char* old = std::getenv("PYTHONPATH")) path += std::string(":") + old;
      ::setenv("PYTHONPATH", path.c_str(), 1);
      std::vector<char*> argv_exec;
      for (auto& s : args) argv_exec.push_back(s.data());
      argv_exec.push_back(nullptr);
      ::execv(argv_exec[0], argv_exec.data());
      throw Error(std::string("cannot run ") + BATCHCAST_PYTHON + ": " + std::strerror(errno));
    }
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return 2;
  }
  return 0;
}
