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
#include "metrics/proc_stats.h"
#include "metrics/process_account.h"
#include "metrics/system_series.h"

namespace batchcast {
namespace {

namespace fs = std::filesystem;
using metrics::cell;
using metrics::CsvFile;
using metrics::ProcessAccount;
using metrics::Stat;
using nlohmann::json;

// What a machine cannot give is in every summary ("missing") and in the report; the log says it
// once per process at debug level: on a machine without a GPU or RAPL it is the same on every
// run, and every tracked command or bench collector would repeat it.
std::atomic<bool> g_missing_logged{false};

bool is_consumer_role(const std::string& role) { return role == "consumer" || role == "trainer"; }
// A tracked command (batchcast track) may know how many samples it consumed (--samples); its
// CPU is a whole process tree, so it is counted in "all" only.
bool counts_samples(const std::string& role) { return is_consumer_role(role) || role == "command"; }

double per(double num, double den) { return den > 0 ? num / den : 0.0; }

}  // namespace

class MetricsCollector::Impl {
 public:
  Impl(CollectorOptions options, std::function<MetricsSnapshot()> source, CollectorEnv env)
      : opt_(std::move(options)), source_(std::move(source)), env_(std::move(env)) {
    if (!env_.now) env_.now = monotonic_seconds;
    if (!env_.scan_processes) env_.scan_processes = metrics::ProcessTable::scan;
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
    system_.emplace(metrics::SystemSeriesOptions{opt_.gpu, opt_.nvml_library, opt_.powercap_root});
    if (!g_missing_logged.exchange(true))
      for (const std::string& m : system_->missing()) spdlog::debug("metrics: {}", m);
    const fs::path dir(opt_.dir);
    processes_csv_.emplace((dir / "processes.csv").string(), ProcessAccount::csv_header());
    system_csv_.emplace((dir / "system.csv").string(), system_->csv_header());
    server_csv_.emplace(
        (dir / "server.csv").string(),
        std::vector<std::string>{"time_s", "producer_blocked_s", "producer_blocked_percent",
                                 "ring_used", "ring_size", "ring_fill_percent"});
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
    if (!env_.sampler_thread) {
      begin();
      state_ = State::kRunning;
      return;
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
    if (env_.sampler_thread) {
      {
        std::lock_guard lk(wake_mu_);
        stop_requested_ = true;
      }
      wake_cv_.notify_all();
      thread_.join();
    } else {
      take(true);
    }
    state_ = State::kStopped;
    std::string err;
    {
      std::lock_guard lk(data_mu_);
      err = write_error_;
    }
    if (!err.empty()) throw Error("metrics: " + err);
  }

  void tick() {
    std::lock_guard control(control_mu_);
    if (env_.sampler_thread || state_ != State::kRunning) {
      throw Error("metrics: tick() for " + opt_.dir +
                  " needs a running collector without a sampler thread "
                  "(CollectorEnv::sampler_thread false)");
    }
    take(false);
  }

  json summary() const {
    std::lock_guard lk(data_mu_);
    return build_summary();
  }

  bool has_gpu() const { return system_->gpu_count() > 0; }
  const std::string& collocation() const { return system_->collocation(); }
  const CollectorOptions& options() const { return opt_; }

 private:
  enum class State { kIdle, kRunning, kStopped };

  // The baseline: time zero and the first tick.
  void begin() {
    t0_ = env_.now();
    {
      std::lock_guard lk(data_mu_);
      start_unix_ =
          std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
              .count();
    }
    take(false);
  }

  // The sampler thread. Its schedule is the steady clock's: env_.now only stamps the rows.
  void run() {
    begin();
    {
      std::lock_guard lk(wake_mu_);
      first_tick_done_ = true;
    }
    wake_cv_.notify_all();
    double next = monotonic_seconds();
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
      take(false);
    }
    take(true);
  }

  // One sample: the owner's snapshot, /proc, NVML; rows to the CSVs; summary refresh.
  void take(bool final_tick) {
    const double cpu0 = metrics::thread_cpu_seconds();
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
      table = env_.scan_processes();
    const double now = env_.now();
    system_->read(now);
    const double t = now - t0_;

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
      if (fresh) order_.push_back(key);
      processes_csv_->write_row(it->second.update(t, p, table.tree_usage(p.pid, watched),
                                                  system_->gpu_by_pid(), {min_span, cores_}));
      tree_rss_sum += it->second.tree_rss_mb_now();
    }
    peak_rss_sum_.add(tree_rss_sum);
    system_csv_->write_row(system_->row(t));

    // Producer and ring.
    if (!ticks_) blocked_base_ = s.producer_blocked_s;
    const double blocked = std::max(0.0, s.producer_blocked_s - blocked_base_);
    std::optional<double> blocked_pct;
    // At most 100 %: the owner's counter includes a block still going on (it never jumps by
    // more than the time passed), and the tick's span is measured a /proc scan later than the
    // snapshot, which on a busy machine can make the ratio overshoot a little.
    if (auto r = rate(blocked - last_blocked_)) blocked_pct = std::min(100.0, *r * 100.0);
    last_blocked_ = blocked;
    std::optional<double> fill;
    if (s.ring_size > 0) fill = 100.0 * s.ring_used / s.ring_size;
    ring_fill_.add(fill);
    ring_size_ = s.ring_size;
    if (s.samples_decoded) samples_decoded_ = s.samples_decoded;
    if (s.cache) cache_ = s.cache;
    server_csv_->write_row({cell(t), cell(blocked), cell(blocked_pct, 1),
                            std::to_string(s.ring_used), std::to_string(s.ring_size),
                            cell(fill, 1)});

    last_t_ = t;
    ++ticks_;
    sampler_cpu_s_ += metrics::thread_cpu_seconds() - cpu0;
    for (const CsvFile* f : {&*processes_csv_, &*system_csv_, &*server_csv_})
      if (write_error_.empty() && !f->error().empty()) write_error_ = f->error();
    if (final_tick || (opt_.summary_every_ticks > 0 && ticks_ % opt_.summary_every_ticks == 0))
      write_summary(final_tick);
  }

  // Requires data_mu_.
  json build_summary() const {
    json procs = json::array();
    double cpu_server = 0, cpu_consumers = 0, cpu_all = 0, run_wait = 0;
    uint64_t samples = 0;
    double wait = 0;
    for (const auto& key : order_) {
      const ProcessAccount& r = records_.at(key);
      procs.push_back(r.to_json());
      cpu_all += r.cpu_s();
      run_wait += r.run_wait_s();
      if (r.role() == "server") cpu_server += r.cpu_s();
      if (is_consumer_role(r.role())) cpu_consumers += r.cpu_s();
      if (counts_samples(r.role())) {
        samples += r.samples();
        wait += r.wait_s();
      }
    }
    auto per_sample = [&](std::optional<double> v) {
      return samples && v ? json(*v / static_cast<double>(samples)) : json(nullptr);
    };
    const std::optional<double> gpu_j = system_->gpu_energy_j(), cpu_j = system_->cpu_energy_j();
    std::optional<double> all_j;
    if (gpu_j || cpu_j) all_j = gpu_j.value_or(0) + cpu_j.value_or(0);
    json out = {
        {"format", "batchcast-metrics"},
        {"format_version", 2},
        {"run_name", opt_.run_name},
        {"complete", complete_},
        {"incomplete_reason",
         complete_ || last_snap_.incomplete.empty() ? json(nullptr) : json(last_snap_.incomplete)},
        {"collocation", system_->collocation()},
        {"start_unix_s", start_unix_},
        {"duration_s", last_t_},
        {"interval_s", opt_.interval_s},
        {"ticks", ticks_},
        {"samples", samples},
        {"samples_per_s", per(static_cast<double>(samples), last_t_)},
        {"wait_s", wait},
        {"run_queue_wait_s", run_wait},
        {"cpu_core_s", {{"server", cpu_server}, {"consumers", cpu_consumers}, {"all", cpu_all}}},
        {"cpu_core_s_per_sample",
         {{"server", per_sample(cpu_server)},
          {"consumers", per_sample(cpu_consumers)},
          {"all", per_sample(cpu_all)}}},
        {"energy_joules",
         {{"gpu", gpu_j ? json(*gpu_j) : json(nullptr)},
          {"cpu", cpu_j ? json(*cpu_j) : json(nullptr)},
          {"all", all_j ? json(*all_j) : json(nullptr)}}},
        {"joules_per_sample",
         {{"gpu", per_sample(gpu_j)}, {"cpu", per_sample(cpu_j)}, {"all", per_sample(all_j)}}},
        {"peak_rss_mb", peak_rss_sum_.max()},
        {"producer_blocked_s", last_blocked_},
        {"samples_decoded", samples_decoded_ ? json(*samples_decoded_) : json(nullptr)},
        {"cache", cache_ ? json{{"hits", cache_->hits},
                                {"misses", cache_->misses},
                                {"images", cache_->images},
                                {"bytes", cache_->bytes},
                                {"capacity_bytes", cache_->capacity}}
                         : json(nullptr)},
        {"ring_size", ring_size_},
        {"mean_ring_fill_percent", ring_fill_.mean()},
        {"processes", procs},
        {"missing", system_->missing()},
        {"sampler",
         {{"cpu_s", sampler_cpu_s_},
          {"percent_of_core", per(sampler_cpu_s_, last_t_) * 100.0},
          {"nvml", system_->gpu_count() > 0}}},
    };
    system_->add_summary(&out);
    out["system"]["cpu_cores"] = cores_;
    return out;
  }

  // Requires data_mu_. Written to a temporary name and renamed, so readers never see half a file.
  void write_summary(bool final_tick) {
    complete_ = final_tick && last_snap_.incomplete.empty();
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
  // The machine's online CPUs: no CPU rate can exceed them.
  const double cores_ = static_cast<double>(std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN)));
  std::function<MetricsSnapshot()> source_;
  CollectorEnv env_;
  std::optional<metrics::SystemSeries> system_;
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

  // State of the ticking thread (the sampler, or the owner without one).
  bool source_error_logged_ = false;
  double t0_ = 0;

  // Everything below is guarded by data_mu_ (written by the sampler, read by summary()).
  mutable std::mutex data_mu_;
  MetricsSnapshot last_snap_;
  std::map<std::string, ProcessAccount> records_;
  std::vector<std::string> order_;  // first-seen order, for stable summaries
  double start_unix_ = 0;
  double last_t_ = 0;
  int64_t ticks_ = 0;
  bool complete_ = false;
  double blocked_base_ = 0, last_blocked_ = 0;
  int64_t ring_size_ = 0;
  std::optional<uint64_t> samples_decoded_;
  std::optional<MetricsSnapshot::Cache> cache_;
  Stat ring_fill_, peak_rss_sum_;
  double sampler_cpu_s_ = 0;
  std::string write_error_;
};

MetricsCollector::MetricsCollector(CollectorOptions options,
                                   std::function<MetricsSnapshot()> source, CollectorEnv env)
    : impl_(std::make_unique<Impl>(std::move(options), std::move(source), std::move(env))) {}
MetricsCollector::~MetricsCollector() = default;
void MetricsCollector::start() { impl_->start(); }
void MetricsCollector::stop() { impl_->stop(); }
void MetricsCollector::tick() { impl_->tick(); }
nlohmann::json MetricsCollector::summary() const { return impl_->summary(); }
bool MetricsCollector::has_gpu() const { return impl_->has_gpu(); }
const std::string& MetricsCollector::collocation() const { return impl_->collocation(); }
const CollectorOptions& MetricsCollector::options() const { return impl_->options(); }

}  // namespace batchcast
