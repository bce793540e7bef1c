#include "metrics/collector.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_set>

#include "common/error.h"
#include "common/process.h"
#include "metrics/csv.h"
#include "metrics/nvml.h"
#include "metrics/proc_stats.h"

namespace batchcast {
namespace {

namespace fs = std::filesystem;
using metrics::cell;
using metrics::CsvFile;
using nlohmann::json;

// NVML's absence is said once per process, not once per collector: a bench that makes many
// collectors would otherwise repeat it.
std::atomic<bool> g_nvml_absence_logged{false};

bool is_consumer_role(const std::string& role) { return role == "consumer" || role == "trainer"; }

// Running mean/peak of one series, for summary.json.
struct Stat {
  double sum = 0, peak = 0;
  int64_t n = 0;
  void add(std::optional<double> v) {
    if (!v) return;
    sum += *v;
    peak = n ? std::max(peak, *v) : *v;
    ++n;
  }
  json mean() const { return n ? json(sum / n) : json(nullptr); }
  json max() const { return n ? json(peak) : json(nullptr); }
};

// What the collector knows about one watched process (key: role, id, pid).
struct ProcRecord {
  std::string role, id;
  pid_t pid = 0;
  double first_t = 0, last_t = 0;
  // CPU: core-seconds since first sight, clamped to never decrease (see README: a descendant
  // read just after its parent reaped it can make one reading dip).
  bool cpu_seen = false;
  uint64_t starttime = 0;
  double cpu_base = 0, cpu_carried = 0, cpu_rel = 0;
  double prev_cpu_t = 0;
  Stat rss_mb, tree_rss_mb;
  int max_procs = 0;
  // Samples/wait: deltas from first sight.
  uint64_t samples_base = 0, samples = 0;
  double wait_base = 0, wait = 0;
};

double per(double num, double den) { return den > 0 ? num / den : 0.0; }

}  // namespace

class MetricsCollector::Impl {
 public:
  Impl(CollectorOptions options, std::function<MetricsSnapshot()> source)
      : opt_(std::move(options)), source_(std::move(source)) {
    if (opt_.dir.empty()) throw Error("metrics: CollectorOptions::dir is empty; name a directory");
    if (!(opt_.interval_s > 0)) {
      throw Error("metrics: interval_s must be > 0 (got " + std::to_string(opt_.interval_s) +
                  ") for " + opt_.dir);
    }
    if (!source_) throw Error("metrics: no snapshot source given for " + opt_.dir);
    std::error_code ec;
    fs::create_directories(opt_.dir, ec);
    if (ec || !fs::is_directory(opt_.dir)) {
      throw Error("metrics: cannot create directory " + opt_.dir + ": " +
                  (ec ? ec.message() : std::string("a file of that name exists")) +
                  "; choose a writable metrics directory");
    }
    if (::access(opt_.dir.c_str(), W_OK) != 0) {
      throw Error("metrics: directory " + opt_.dir + " is not writable (" + std::strerror(errno) +
                  "); choose a writable metrics directory");
    }
    if (opt_.run_name.empty()) {
      fs::path p = fs::absolute(opt_.dir).lexically_normal();
      if (!p.has_filename()) p = p.parent_path();
      opt_.run_name = p.filename().string();
    }
    if (opt_.gpu) {
      std::string why;
      nvml_ = metrics::Nvml::open(opt_.nvml_library, &why);
      if (!nvml_ && !g_nvml_absence_logged.exchange(true)) spdlog::info("metrics: {}", why);
    }
    const fs::path dir(opt_.dir);
    processes_csv_.emplace(
        (dir / "processes.csv").string(),
        std::vector<std::string>{"time_s", "role", "id", "pid", "cpu_s", "cpu_percent", "rss_mb",
                                 "tree_rss_mb", "procs", "samples", "samples_per_s", "wait_s"});
    std::vector<std::string> sys_header{"time_s", "system/cpu_utilization_percentage",
                                        "system/system_memory_usage_megabytes",
                                        "system/system_memory_usage_percentage"};
    for (int g = 0; g < gpu_count(); ++g) {
      const std::string p = "system/gpu_" + std::to_string(g) + "_";
      for (const char* s :
           {"utilization_percentage", "memory_usage_megabytes", "memory_usage_percentage",
            "power_usage_watts", "power_usage_percentage"})
        sys_header.push_back(p + s);
    }
    system_csv_.emplace((dir / "system.csv").string(), sys_header);
    server_csv_.emplace(
        (dir / "server.csv").string(),
        std::vector<std::string>{"time_s", "producer_blocked_s", "producer_blocked_percent",
                                 "ring_used", "ring_size", "ring_fill_percent"});
    gpu_util_.resize(gpu_count());
    gpu_mem_.resize(gpu_count());
    gpu_power_.resize(gpu_count());
  }

  ~Impl() {
    try {
      stop();
    } catch (const std::exception& e) {
      spdlog::error("{}", e.what());
    }
  }

  void start() {
    std::lock_guard control(control_mu_);
    if (state_ == State::kRunning) return;
    if (state_ == State::kStopped) {
      throw Error("metrics: the collector for " + opt_.dir +
                  " was stopped; a run cannot be resumed, create a new collector");
    }
    std::unique_lock lk(wake_mu_);
    stop_requested_ = false;
    first_tick_done_ = false;
    thread_ = std::thread([this] { run(); });
    wake_cv_.wait(lk, [this] { return first_tick_done_; });
    state_ = State::kRunning;
  }

  void stop() {
    std::lock_guard control(control_mu_);
    if (state_ != State::kRunning) {
      state_ = State::kStopped;
      return;
    }
    {
      std::lock_guard lk(wake_mu_);
      stop_requested_ = true;
    }
    wake_cv_.notify_all();
    thread_.join();
    state_ = State::kStopped;
    std::string err;
    {
      std::lock_guard lk(data_mu_);
      err = write_error_;
    }
    if (!err.empty()) throw Error("metrics: " + err);
  }

  json summary() const {
    std::lock_guard lk(data_mu_);
    return build_summary();
  }

  bool has_gpu() const { return gpu_count() > 0; }
  const CollectorOptions& options() const { return opt_; }

 private:
  enum class State { kIdle, kRunning, kStopped };

  int gpu_count() const { return nvml_ ? nvml_->device_count() : 0; }

  // The sampler thread.
  void run() {
    t0_ = monotonic_seconds();
    {
      std::lock_guard lk(data_mu_);
      start_unix_ =
          std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
              .count();
    }
    thread_cpu0_ = metrics::thread_cpu_seconds();
    tick(false);
    {
      std::lock_guard lk(wake_mu_);
      first_tick_done_ = true;
    }
    wake_cv_.notify_all();
    double next = t0_;
    for (;;) {
      // Deadlines on a fixed grid (no drift); a tick that overran skips the missed slots.
      next += opt_.interval_s;
      const double now = monotonic_seconds();
      if (next < now) next = now;
      std::unique_lock lk(wake_mu_);
      const auto deadline = std::chrono::steady_clock::time_point(
          std::chrono::duration_cast<std::chrono::steady_clock::duration>(
              std::chrono::duration<double>(next)));
      if (wake_cv_.wait_until(lk, deadline, [this] { return stop_requested_; })) break;
      lk.unlock();
      tick(false);
    }
    tick(true);
  }

  // One sample: the owner's snapshot, /proc, NVML; rows to the CSVs; summary refresh.
  void tick(bool final_tick) {
    // The source runs without our locks held (it may take the GIL, and a thread holding the GIL
    // may be waiting in summary()).
    MetricsSnapshot snap;
    bool have_snap = false;
    try {
      snap = source_();
      have_snap = true;
    } catch (const std::exception& e) {
      if (!source_error_logged_) {
        spdlog::warn("metrics: snapshot source for {} failed: {} (last snapshot reused)", opt_.dir,
                     e.what());
        source_error_logged_ = true;
      }
    }
    metrics::ProcessTable table;
    if (have_snap ? !snap.processes.empty() : !last_snap_.processes.empty())
      table = metrics::ProcessTable::scan();
    auto sys_cpu = metrics::read_system_cpu();
    auto sys_mem = metrics::read_system_memory();
    std::vector<metrics::GpuReading> gpus;
    if (nvml_) gpus = nvml_->read();
    const double t = monotonic_seconds() - t0_;

    std::lock_guard lk(data_mu_);
    if (have_snap) last_snap_ = std::move(snap);
    const MetricsSnapshot& s = last_snap_;
    const double dt = ticks_ ? t - last_t_ : 0.0;
    // Rates over a span much shorter than the interval (the final tick at stop()) would be noise
    // (/proc counts CPU in 10 ms ticks), so their cells stay empty; cumulative columns do not.
    const double min_span = 0.25 * opt_.interval_s;
    auto rate = [&](double delta) -> std::optional<double> {
      if (!(dt >= min_span)) return std::nullopt;
      return delta / dt;
    };

    std::unordered_set<pid_t> watched;
    for (const auto& p : s.processes) watched.insert(p.pid);
    double tree_rss_sum = 0;
    for (const auto& p : s.processes) {
      const std::string key = p.role + '\n' + p.id + '\n' + std::to_string(p.pid);
      auto [it, fresh] = records_.try_emplace(key);
      ProcRecord& r = it->second;
      if (fresh) {
        order_.push_back(key);
        r.role = p.role;
        r.id = p.id;
        r.pid = p.pid;
        r.first_t = t;
        r.samples_base = p.samples;
        r.wait_base = p.wait_s;
      }
      const double prev_t = r.last_t;
      r.last_t = t;
      // Counters: a counter that went backwards (owner restarted it) is rebased.
      if (p.samples < r.samples_base + r.samples) r.samples_base = p.samples - r.samples;
      const uint64_t prev_samples = r.samples;
      r.samples = p.samples - r.samples_base;
      if (p.wait_s < r.wait_base + r.wait) r.wait_base = p.wait_s - r.wait;
      r.wait = p.wait_s - r.wait_base;

      std::optional<double> cpu_s, cpu_pct, rss, tree_rss;
      int procs = 0;
      if (auto u = table.tree_usage(p.pid, watched)) {
        if (!r.cpu_seen) {
          r.cpu_seen = true;
          r.starttime = u->starttime;
          r.cpu_base = u->cpu_s;
          r.prev_cpu_t = t;
        } else if (u->starttime != r.starttime) {  // the pid now names another process
          r.cpu_carried = r.cpu_rel;
          r.starttime = u->starttime;
          r.cpu_base = u->cpu_s;
        }
        const double prev_cpu = r.cpu_rel;
        r.cpu_rel = std::max(r.cpu_rel, r.cpu_carried + u->cpu_s - r.cpu_base);
        cpu_s = r.cpu_rel;
        if (t - r.prev_cpu_t >= min_span) {
          cpu_pct = (r.cpu_rel - prev_cpu) / (t - r.prev_cpu_t) * 100.0;
        }
        r.prev_cpu_t = t;
        rss = u->rss_bytes / 1e6;
        tree_rss = u->tree_rss_bytes / 1e6;
        r.rss_mb.add(rss);
        r.tree_rss_mb.add(tree_rss);
        r.max_procs = std::max(r.max_procs, u->procs);
        tree_rss_sum += *tree_rss;
        procs = u->procs;
      }
      std::optional<double> sps;
      if (!fresh && t - prev_t >= min_span) sps = (r.samples - prev_samples) / (t - prev_t);
      processes_csv_->write_row({cell(t), p.role, p.id, std::to_string(p.pid), cell(cpu_s),
                                 cell(cpu_pct, 1), cell(rss, 1), cell(tree_rss, 1),
                                 cpu_s ? std::to_string(procs) : "", std::to_string(r.samples),
                                 cell(sps, 2), cell(r.wait)});
    }
    peak_rss_sum_.add(tree_rss_sum);

    // System.
    std::optional<double> cpu_util, mem_mb, mem_pct;
    if (sys_cpu && last_sys_cpu_ && sys_cpu->total > last_sys_cpu_->total) {
      cpu_util = 100.0 * (sys_cpu->busy - last_sys_cpu_->busy) /
                 static_cast<double>(sys_cpu->total - last_sys_cpu_->total);
    }
    if (sys_cpu) last_sys_cpu_ = sys_cpu;
    if (sys_mem) {
      mem_mb = sys_mem->used_mb;
      mem_pct = per(sys_mem->used_mb, sys_mem->total_mb) * 100.0;
    }
    sys_cpu_util_.add(cpu_util);
    sys_mem_mb_.add(mem_mb);
    std::vector<std::string> sys_row{cell(t), cell(cpu_util, 2), cell(mem_mb, 1), cell(mem_pct, 2)};
    for (size_t g = 0; g < gpus.size(); ++g) {
      const auto& r = gpus[g];
      sys_row.insert(sys_row.end(),
                     {cell(r.utilization_percent, 1), cell(r.memory_used_mb, 1),
                      cell(r.memory_percent, 2), cell(r.power_watts, 2), cell(r.power_percent, 2)});
      gpu_util_[g].add(r.utilization_percent);
      gpu_mem_[g].add(r.memory_used_mb);
      gpu_power_[g].add(r.power_watts);
    }
    system_csv_->write_row(sys_row);

    // Producer and ring.
    if (!ticks_) blocked_base_ = s.producer_blocked_s;
    const double blocked = std::max(0.0, s.producer_blocked_s - blocked_base_);
    std::optional<double> blocked_pct;
    if (auto r = rate(blocked - last_blocked_)) blocked_pct = *r * 100.0;
    last_blocked_ = blocked;
    std::optional<double> fill;
    if (s.ring_size > 0) fill = 100.0 * s.ring_used / s.ring_size;
    ring_fill_.add(fill);
    ring_size_ = s.ring_size;
    server_csv_->write_row({cell(t), cell(blocked), cell(blocked_pct, 1),
                            std::to_string(s.ring_used), std::to_string(s.ring_size),
                            cell(fill, 1)});

    last_t_ = t;
    ++ticks_;
    sampler_cpu_s_ = metrics::thread_cpu_seconds() - thread_cpu0_;
    for (const CsvFile* f : {&*processes_csv_, &*system_csv_, &*server_csv_})
      if (write_error_.empty() && !f->error().empty()) write_error_ = f->error();
    if (final_tick || (opt_.summary_every_ticks > 0 && ticks_ % opt_.summary_every_ticks == 0))
      write_summary(final_tick);
  }

  // Requires data_mu_.
  json build_summary() const {
    json procs = json::array();
    double cpu_server = 0, cpu_consumers = 0, cpu_all = 0;
    uint64_t samples = 0;
    double wait = 0;
    for (const auto& key : order_) {
      const ProcRecord& r = records_.at(key);
      const double span = r.last_t - r.first_t;
      json p = {{"role", r.role},
                {"id", r.id},
                {"pid", r.pid},
                {"first_s", r.first_t},
                {"last_s", r.last_t},
                {"cpu_core_s", r.cpu_seen ? json(r.cpu_rel) : json(nullptr)},
                {"mean_cpu_percent", r.cpu_seen ? json(per(r.cpu_rel, span) * 100) : json(nullptr)},
                {"peak_rss_mb", r.rss_mb.max()},
                {"peak_tree_rss_mb", r.tree_rss_mb.max()},
                {"max_procs", r.max_procs},
                {"samples", r.samples},
                {"samples_per_s", per(static_cast<double>(r.samples), span)},
                {"wait_s", r.wait},
                {"cpu_core_s_per_sample",
                 r.samples ? json(r.cpu_rel / static_cast<double>(r.samples)) : json(nullptr)}};
      procs.push_back(std::move(p));
      cpu_all += r.cpu_rel;
      if (r.role == "server") cpu_server += r.cpu_rel;
      if (is_consumer_role(r.role)) {
        cpu_consumers += r.cpu_rel;
        samples += r.samples;
        wait += r.wait;
      }
    }
    auto per_sample = [&](double cpu) {
      return samples ? json(cpu / static_cast<double>(samples)) : json(nullptr);
    };
    json gpus = json::array();
    double gpu_util_sum = 0;
    int gpu_util_n = 0;
    for (int g = 0; g < gpu_count(); ++g) {
      gpus.push_back({{"index", g},
                      {"name", nvml_->device_names()[g]},
                      {"mean_utilization_percentage", gpu_util_[g].mean()},
                      {"peak_memory_usage_megabytes", gpu_mem_[g].max()},
                      {"mean_power_usage_watts", gpu_power_[g].mean()}});
      if (gpu_util_[g].n) {
        gpu_util_sum += gpu_util_[g].sum / gpu_util_[g].n;
        ++gpu_util_n;
      }
    }
    json out = {
        {"format", "batchcast-metrics"},
        {"format_version", 1},
        {"run_name", opt_.run_name},
        {"complete", complete_},
        {"start_unix_s", start_unix_},
        {"duration_s", last_t_},
        {"interval_s", opt_.interval_s},
        {"ticks", ticks_},
        {"samples", samples},
        {"samples_per_s", per(static_cast<double>(samples), last_t_)},
        {"wait_s", wait},
        {"cpu_core_s", {{"server", cpu_server}, {"consumers", cpu_consumers}, {"all", cpu_all}}},
        {"cpu_core_s_per_sample",
         {{"server", per_sample(cpu_server)},
          {"consumers", per_sample(cpu_consumers)},
          {"all", per_sample(cpu_all)}}},
        {"peak_rss_mb", peak_rss_sum_.max()},
        {"producer_blocked_s", last_blocked_},
        {"ring_size", ring_size_},
        {"mean_ring_fill_percent", ring_fill_.mean()},
        {"system",
         {{"mean_cpu_utilization_percentage", sys_cpu_util_.mean()},
          {"peak_system_memory_usage_megabytes", sys_mem_mb_.max()}}},
        {"gpus", gpus},
        {"mean_gpu_utilization_percentage",
         gpu_util_n ? json(gpu_util_sum / gpu_util_n) : json(nullptr)},
        {"processes", procs},
        {"sampler",
         {{"cpu_s", sampler_cpu_s_},
          {"percent_of_core", per(sampler_cpu_s_, last_t_) * 100.0},
          {"nvml", gpu_count() > 0}}},
    };
    return out;
  }

  // Requires data_mu_. Written to a temporary name and renamed, so readers never see half a file.
  void write_summary(bool final_tick) {
    complete_ = final_tick;
    const fs::path path = fs::path(opt_.dir) / "summary.json";
    const fs::path tmp = fs::path(opt_.dir) / ".summary.json.tmp";
    {
      std::ofstream out(tmp, std::ios::out | std::ios::trunc);
      out << build_summary().dump(2) << '\n';
      out.flush();
      if (!out) {
        if (write_error_.empty()) write_error_ = tmp.string() + ": " + std::strerror(errno);
        return;
      }
    }
    std::error_code ec;
    fs::rename(tmp, path, ec);
    if (ec && write_error_.empty()) write_error_ = path.string() + ": " + ec.message();
  }

  CollectorOptions opt_;
  std::function<MetricsSnapshot()> source_;
  std::optional<metrics::Nvml> nvml_;
  std::optional<CsvFile> processes_csv_, system_csv_, server_csv_;

  // start/stop serialisation.
  std::mutex control_mu_;
  State state_ = State::kIdle;
  std::thread thread_;
  // Wakes the sampler early for stop(); tells start() the first tick is done.
  std::mutex wake_mu_;
  std::condition_variable wake_cv_;
  bool stop_requested_ = false;
  bool first_tick_done_ = false;

  // Sampler-thread-only state.
  bool source_error_logged_ = false;
  double thread_cpu0_ = 0;
  double t0_ = 0;
  std::optional<metrics::SystemCpuTimes> last_sys_cpu_;

  // Everything below is guarded by data_mu_ (written by the sampler, read by summary()).
  mutable std::mutex data_mu_;
  MetricsSnapshot last_snap_;
  std::map<std::string, ProcRecord> records_;
  std::vector<std::string> order_;  // first-seen order, for stable summaries
  double start_unix_ = 0;
  double last_t_ = 0;
  int64_t ticks_ = 0;
  bool complete_ = false;
  double blocked_base_ = 0, last_blocked_ = 0;
  int64_t ring_size_ = 0;
  Stat ring_fill_, sys_cpu_util_, sys_mem_mb_, peak_rss_sum_;
  std::vector<Stat> gpu_util_, gpu_mem_, gpu_power_;
  double sampler_cpu_s_ = 0;
  std::string write_error_;
};

MetricsCollector::MetricsCollector(CollectorOptions options,
                                   std::function<MetricsSnapshot()> source)
    : impl_(std::make_unique<Impl>(std::move(options), std::move(source))) {}
MetricsCollector::~MetricsCollector() = default;
void MetricsCollector::start() { impl_->start(); }
void MetricsCollector::stop() { impl_->stop(); }
nlohmann::json MetricsCollector::summary() const { return impl_->summary(); }
bool MetricsCollector::has_gpu() const { return impl_->has_gpu(); }
const CollectorOptions& MetricsCollector::options() const { return impl_->options(); }

}  // namespace batchcast
