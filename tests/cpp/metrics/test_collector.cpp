// MetricsCollector end to end: CPU of forked processes (own, live child, reaped child) against
// their own getrusage, NVML absent and faked, the CSV/summary layout, errors, sampler cost.
// CPU comparisons are CPU time against CPU time, so a loaded machine only makes them slower.
// Tests that need ticks but not real CPU drive them through the seam (CollectorEnv: no sampler
// thread, a clock of their own), so none of them sleeps for the sampler.
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "metrics/collector.h"
#include "metrics/process_tracker.h"

namespace batchcast {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

double rusage_s(int who) {
  rusage ru{};
  getrusage(who, &ru);
  return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + ru.ru_stime.tv_sec +
         ru.ru_stime.tv_usec * 1e-6;
}

// Spins until this process has used `seconds` more CPU (its own clock, not the wall's).
void burn_cpu(double seconds) {
  const double until = rusage_s(RUSAGE_SELF) + seconds;
  volatile uint64_t x = 0;
  while (rusage_s(RUSAGE_SELF) < until)
    for (int i = 0; i < 200000; ++i) x = x + i;
}

void write_all(int fd, const void* p, size_t n) {
  ASSERT_EQ(::write(fd, p, n), static_cast<ssize_t>(n));
}
double read_double(int fd) {
  double v = -1;
  if (::read(fd, &v, sizeof v) != sizeof v) return -1;
  return v;
}
void send_double(int fd, double v) {
  if (::write(fd, &v, sizeof v) != sizeof v) _exit(3);
}
// Blocks until the other side writes a byte (returns true) or closes (false).
bool wait_byte(int fd) {
  char c;
  return ::read(fd, &c, 1) == 1;
}

// A forked child running `body(in, out)`: `in` reads what the test sends, `out` writes back.
struct Child {
  pid_t pid = -1;
  int to_child = -1, from_child = -1;

  explicit Child(const std::function<void(int, int)>& body) {
    int down[2], up[2];
    if (pipe(down) != 0 || pipe(up) != 0) std::abort();
    pid = fork();
    if (pid == 0) {
      ::close(down[1]);
      ::close(up[0]);
      body(down[0], up[1]);
      _exit(0);
    }
    ::close(down[0]);
    ::close(up[1]);
    to_child = down[1];
    from_child = up[0];
  }
  void go() { write_all(to_child, "g", 1); }
  double result() { return read_double(from_child); }
  // Closes the command pipe (the child's last wait_byte returns) and reaps it.
  void finish() {
    if (pid <= 0) return;
    ::close(to_child);
    ::close(from_child);
    int status = 0;
    waitpid(pid, &status, 0);
    pid = -1;
  }
  ~Child() { finish(); }
};

// Run directories under /tmp, removed when the test program ends.
class TempDirs : public ::testing::Environment {
 public:
  void TearDown() override {
    for (const auto& d : dirs) fs::remove_all(d);
  }
  std::vector<fs::path> dirs;
};
TempDirs* const g_temp_dirs =
    static_cast<TempDirs*>(::testing::AddGlobalTestEnvironment(new TempDirs));

fs::path fresh_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("bc_metrics_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(d);
  g_temp_dirs->dirs.push_back(d);
  return d;
}

std::vector<std::vector<std::string>> read_csv(const fs::path& p) {
  std::ifstream in(p);
  std::vector<std::vector<std::string>> rows;
  std::string line;
  while (std::getline(in, line)) {
    std::vector<std::string> cells;
    std::stringstream ss(line);
    std::string c;
    while (std::getline(ss, c, ',')) cells.push_back(c);
    if (!line.empty() && line.back() == ',') cells.push_back("");
    rows.push_back(cells);
  }
  return rows;
}

json read_json(const fs::path& p) {
  std::ifstream in(p);
  return json::parse(in);
}

MetricsSnapshot one_process(const std::string& role, pid_t pid) {
  MetricsSnapshot s;
  s.processes.push_back({role, "p" + std::to_string(pid), pid, 0, 0});
  return s;
}

CollectorOptions fast_options(const fs::path& dir) {
  CollectorOptions o;
  o.dir = dir.string();
  o.interval_s = 0.2;
  return o;
}

// Ticks taken by the test (no sampler thread) on a clock the test moves: advance() then tick().
struct ManualTicks {
  double now = 100.0;
  CollectorEnv env(std::function<metrics::ProcessTable()> scan = {}) {
    return CollectorEnv{[this] { return now; }, std::move(scan), false};
  }
};

TEST(MetricsCollector, RecordsBurnedCpuWithinTenPercent) {
  Child burner([](int in, int out) {
    if (!wait_byte(in)) return;
    const double c0 = rusage_s(RUSAGE_SELF);
    burn_cpu(1.5);
    send_double(out, rusage_s(RUSAGE_SELF) - c0);
    wait_byte(in);  // stay alive until the collector's final tick
  });
  const fs::path dir = fresh_dir("burn");
  MetricsCollector c(fast_options(dir), [&] { return one_process("consumer", burner.pid); });
  c.start();
  burner.go();
  const double burned = burner.result();
  ASSERT_GT(burned, 1.4);
  c.stop();
  burner.finish();
  json s = c.summary();
  ASSERT_EQ(s["processes"].size(), 1u);
  const double recorded = s["processes"][0]["cpu_core_s"].get<double>();
  EXPECT_NEAR(recorded, burned, 0.1 * burned) << "recorded " << recorded << " s";
  EXPECT_NEAR(s["cpu_core_s"]["consumers"].get<double>(), recorded, 1e-9);
  EXPECT_NEAR(s["cpu_core_s"]["all"].get<double>(), recorded, 1e-9);
  EXPECT_EQ(s["complete"], true);
  EXPECT_FALSE(s["system"]["mean_cpu_utilization_percentage"].is_null());
  EXPECT_EQ(read_json(dir / "summary.json")["processes"][0]["cpu_core_s"], recorded);
}

// The /proc seam: a process tree the test writes. CPU is counted from first sight, a live child
// is charged to its parent, and cpu_percent is CPU over the injected clock's span.
TEST(MetricsCollector, InjectedProcessTableAndClockGiveExactFigures) {
  const pid_t root = 0x7ffffff0, child = 0x7ffffff1;
  double root_cpu = 10, child_cpu = 1;
  auto scan = [&] {
    metrics::ProcStat r, k;
    r.pid = root;
    r.ppid = 1;
    r.utime_s = root_cpu;
    r.rss_bytes = 3'000'000;
    k.pid = child;
    k.ppid = root;
    k.utime_s = child_cpu;
    k.rss_bytes = 1'000'000;
    return metrics::ProcessTable({r, k});
  };
  const fs::path dir = fresh_dir("seam");
  ManualTicks clock;
  MetricsCollector c(
      fast_options(dir), [&] { return one_process("trainer", root); }, clock.env(scan));
  c.start();
  clock.now += 2.0;
  root_cpu += 1.0;
  child_cpu += 1.0;
  c.tick();
  clock.now += 1.0;
  root_cpu += 0.5;
  c.stop();
  auto rows = read_csv(dir / "processes.csv");
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_EQ(rows[1][0], "0.000");
  EXPECT_EQ(rows[2][0], "2.000");
  EXPECT_DOUBLE_EQ(std::stod(rows[2][4]), 2.0);
  EXPECT_DOUBLE_EQ(std::stod(rows[2][5]), 100.0);
  EXPECT_DOUBLE_EQ(std::stod(rows[3][5]), 50.0);
  EXPECT_EQ(rows[3][8], "2");
  json s = c.summary();
  EXPECT_DOUBLE_EQ(s["duration_s"].get<double>(), 3.0);
  EXPECT_DOUBLE_EQ(s["processes"][0]["cpu_core_s"].get<double>(), 2.5);
  EXPECT_EQ(s["processes"][0]["max_procs"], 2);
  EXPECT_THROW(c.tick(), Error);  // stopped
}

TEST(MetricsCollector, TickIsRefusedWithASamplerThread) {
  const fs::path dir = fresh_dir("tickthread");
  MetricsCollector c(fast_options(dir), [] { return one_process("server", getpid()); });
  c.start();
  EXPECT_THROW(c.tick(), Error);
  c.stop();
}

TEST(MetricsCollector, CountsLiveChildForItsParent) {
  Child parent([](int in, int out) {
    if (!wait_byte(in)) return;
    int report[2], hold[2];
    if (pipe(report) != 0 || pipe(hold) != 0) _exit(2);
    pid_t c = fork();
    if (c == 0) {
      ::close(hold[1]);
      const double c0 = rusage_s(RUSAGE_SELF);
      burn_cpu(1.0);
      send_double(report[1], rusage_s(RUSAGE_SELF) - c0);
      wait_byte(hold[0]);  // alive (not reaped) until the parent lets go
      _exit(0);
    }
    ::close(hold[0]);
    send_double(out, read_double(report[0]));
    wait_byte(in);
    ::close(hold[1]);
    waitpid(c, nullptr, 0);
  });
  const fs::path dir = fresh_dir("live");
  MetricsCollector c(fast_options(dir), [&] { return one_process("trainer", parent.pid); });
  c.start();
  parent.go();
  const double child_cpu = parent.result();
  ASSERT_GT(child_cpu, 0.9);
  c.stop();  // the child is still alive here
  parent.finish();
  json p = c.summary()["processes"][0];
  const double recorded = p["cpu_core_s"].get<double>();
  // The parent itself uses almost nothing (it blocks on a pipe).
  EXPECT_NEAR(recorded, child_cpu, 0.1 * child_cpu) << "recorded " << recorded << " s";
  EXPECT_EQ(p["max_procs"], 2);
}

TEST(MetricsCollector, CountsReapedChildForItsParent) {
  Child parent([](int in, int out) {
    if (!wait_byte(in)) return;
    pid_t c = fork();
    if (c == 0) {
      burn_cpu(1.0);
      _exit(0);
    }
    waitpid(c, nullptr, 0);
    send_double(out, rusage_s(RUSAGE_CHILDREN));
    wait_byte(in);
  });
  const fs::path dir = fresh_dir("reaped");
  MetricsCollector c(fast_options(dir), [&] { return one_process("trainer", parent.pid); });
  c.start();
  parent.go();
  const double child_cpu = parent.result();
  ASSERT_GT(child_cpu, 0.9);
  c.stop();
  parent.finish();
  const double recorded = c.summary()["processes"][0]["cpu_core_s"].get<double>();
  EXPECT_NEAR(recorded, child_cpu, 0.1 * child_cpu) << "recorded " << recorded << " s";
}

std::vector<std::string> header_of(const fs::path& p) { return read_csv(p).at(0); }

TEST(MetricsCollector, WorksWithoutNvml) {
  const fs::path dir = fresh_dir("nonvml");
  CollectorOptions o = fast_options(dir);
  o.nvml_library = "/nonexistent/libnvidia-ml.so.1";
  ManualTicks clock;
  MetricsCollector c(
      o, [] { return one_process("server", getpid()); }, clock.env());
  EXPECT_FALSE(c.has_gpu());
  c.start();
  clock.now += 0.2;
  c.tick();
  c.stop();
  for (const auto& col : header_of(dir / "system.csv"))
    EXPECT_EQ(col.find("gpu"), std::string::npos) << col;
  json s = read_json(dir / "summary.json");
  EXPECT_TRUE(s["gpus"].empty());
  EXPECT_TRUE(s["mean_gpu_utilization_percentage"].is_null());
  EXPECT_EQ(s["sampler"]["nvml"], false);
}

TEST(MetricsCollector, DefaultNvmlLibraryAbsentHereIsHarmless) {
  const fs::path dir = fresh_dir("defnvml");
  MetricsCollector c(fast_options(dir), [] { return one_process("server", getpid()); });
  if (c.has_gpu()) GTEST_SKIP() << "this machine has NVML and a GPU";
  c.start();
  c.stop();
  EXPECT_EQ(header_of(dir / "system.csv").size(), 4u);
}

TEST(MetricsCollector, FakeNvmlGivesMlflowGpuColumns) {
  const fs::path dir = fresh_dir("fakenvml");
  CollectorOptions o = fast_options(dir);
  o.nvml_library = BC_FAKE_NVML_PATH;
  ManualTicks clock;
  MetricsCollector c(
      o, [] { return one_process("trainer", getpid()); }, clock.env());
  ASSERT_TRUE(c.has_gpu());
  EXPECT_EQ(c.collocation(), "time-slicing");
  c.start();
  clock.now += 0.2;
  c.tick();
  clock.now += 0.2;
  c.stop();
  auto rows = read_csv(dir / "system.csv");
  std::vector<std::string> want{"time_s", "system/cpu_utilization_percentage",
                                "system/system_memory_usage_megabytes",
                                "system/system_memory_usage_percentage"};
  for (const char* g : {"system/gpu_0_", "system/gpu_1_"}) {
    for (const char* k :
         {"utilization_percentage", "memory_usage_megabytes", "memory_usage_percentage",
          "power_usage_watts", "power_usage_percentage", "energy_joules", "sm_active_percentage",
          "sm_occupancy_percentage", "tensor_active_percentage", "dram_active_percentage"})
      want.push_back(std::string(g) + k);
  }
  EXPECT_EQ(rows.at(0), want);
  ASSERT_EQ(rows.size(), 4u);  // header, start, tick, stop
  EXPECT_EQ(rows[1][4], "40.0");
  EXPECT_EQ(rows[1][5], "20000.0");
  EXPECT_EQ(rows[1][6], "25.00");
  EXPECT_EQ(rows[1][7], "250.00");
  EXPECT_EQ(rows[1][8], "50.00");
  EXPECT_EQ(rows[1][9], "0.000");    // energy since the first tick
  EXPECT_EQ(rows[1][10], "");        // GPM needs two samples
  EXPECT_EQ(rows[2][9], "100.000");  // the fake adds 100 J per reading
  EXPECT_EQ(rows[2][10], "55.00");
  EXPECT_EQ(rows[2][11], "33.00");
  EXPECT_EQ(rows[2][12], "22.00");
  EXPECT_EQ(rows[2][13], "11.00");
  EXPECT_EQ(rows[2][14], "80.0");
  EXPECT_EQ(rows[2][20], "");  // GPU 1 has no GPM
  json s = read_json(dir / "summary.json");
  ASSERT_EQ(s["gpus"].size(), 2u);
  EXPECT_EQ(s["gpus"][1]["name"], "Fake GPU 1");
  EXPECT_DOUBLE_EQ(s["gpus"][1]["mean_utilization_percentage"].get<double>(), 80.0);
  EXPECT_DOUBLE_EQ(s["gpus"][0]["mean_power_usage_watts"].get<double>(), 250.0);
  EXPECT_DOUBLE_EQ(s["gpus"][0]["mean_sm_active_percentage"].get<double>(), 55.0);
  EXPECT_TRUE(s["gpus"][1]["mean_sm_active_percentage"].is_null());
  EXPECT_DOUBLE_EQ(s["mean_gpu_utilization_percentage"].get<double>(), 60.0);
  EXPECT_DOUBLE_EQ(s["mean_sm_active_percentage"].get<double>(), 55.0);
  const int64_t readings = s["ticks"].get<int64_t>();
  EXPECT_EQ(readings, 3);
  EXPECT_DOUBLE_EQ(s["gpus"][0]["energy_joules"].get<double>(), 100.0 * (readings - 1));
  EXPECT_DOUBLE_EQ(s["energy_joules"]["gpu"].get<double>(), 200.0 * (readings - 1));
  EXPECT_EQ(s["collocation"], "time-slicing");
  // This process is listed on GPU 0 through the versioned process list and the utilisation
  // samples: its row carries them.
  auto procs = read_csv(dir / "processes.csv");
  EXPECT_EQ(procs.at(0).at(13), "gpu_sm_percent");
  EXPECT_EQ(procs.at(1).at(13), "42.0");
  EXPECT_EQ(procs.at(1).at(14), "1000.0");
  EXPECT_DOUBLE_EQ(s["processes"][0]["mean_gpu_sm_percent"].get<double>(), 42.0);
  EXPECT_DOUBLE_EQ(s["processes"][0]["peak_gpu_memory_mb"].get<double>(), 1000.0);
}

// Two processes pinned to one CPU, both busy: while one runs the other is runnable and waits,
// so each one's run-queue wait is about the other's CPU. Asserted with a wide margin (at least
// 40 % of the pair's CPU), which other load on that CPU can only increase.
TEST(MetricsCollector, RunQueueWaitRisesWhenTwoBusyProcessesShareOneCore) {
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(0, &one);
  auto pinned_burner = [&one](int in, int out) {
    if (sched_setaffinity(0, sizeof one, &one) != 0) _exit(4);
    if (!wait_byte(in)) return;
    const double c0 = rusage_s(RUSAGE_SELF);
    burn_cpu(0.4);
    send_double(out, rusage_s(RUSAGE_SELF) - c0);
    wait_byte(in);
  };
  Child a(pinned_burner), b(pinned_burner);
  const fs::path dir = fresh_dir("runqueue");
  MetricsCollector c(fast_options(dir), [&] {
    MetricsSnapshot s;
    s.processes.push_back({"trainer", "a", a.pid, 0, 0});
    s.processes.push_back({"trainer", "b", b.pid, 0, 0});
    return s;
  });
  c.start();
  a.go();
  b.go();
  const double cpu = a.result() + b.result();
  c.stop();
  json s = c.summary();
  const double wait = s["run_queue_wait_s"].get<double>();
  EXPECT_NEAR(wait,
              s["processes"][0]["run_queue_wait_s"].get<double>() +
                  s["processes"][1]["run_queue_wait_s"].get<double>(),
              1e-9);
  EXPECT_GE(wait, 0.4 * cpu) << "pair CPU " << cpu << " s, run-queue wait " << wait << " s";
  auto rows = read_csv(dir / "processes.csv");
  EXPECT_EQ(rows.at(0).at(12), "run_queue_wait_s");
}

// A command the owner started itself (batchcast track): CPU counts from the process's start and
// the owner's exact figure after it has exited (wait4's rusage) is taken, so nothing is lost.
TEST(MetricsCollector, SinceStartAndExactCpuLoseNothingAtEitherEnd) {
  Child burner([](int in, int) {
    burn_cpu(0.5);  // before the collector's first tick
    wait_byte(in);
  });
  const fs::path dir = fresh_dir("sincestart");
  std::atomic<bool> exited{false};
  std::atomic<double> exact{0};
  const pid_t pid = burner.pid;
  MetricsCollector c(fast_options(dir), [&] {
    MetricsSnapshot s;
    MetricsSnapshot::Process p{"trainer", "cmd", pid, 0, 0};
    p.since_start = true;
    if (exited) p.exact_cpu_s = exact.load();
    s.processes.push_back(p);
    return s;
  });
  // Let the child burn before the first tick, as a command does before track's first sample.
  while (true) {
    auto st = std::ifstream("/proc/" + std::to_string(burner.pid) + "/stat");
    std::string line;
    std::getline(st, line);
    auto after = line.substr(line.rfind(')') + 2);
    std::istringstream in(after);
    std::string f;
    std::vector<std::string> fields;
    while (in >> f) fields.push_back(f);
    if (fields.size() > 12 && std::stod(fields[11]) + std::stod(fields[12]) >=
                                  0.45 * static_cast<double>(sysconf(_SC_CLK_TCK)))
      break;
    std::this_thread::yield();
  }
  c.start();
  ::close(burner.to_child);
  rusage ru{};
  int status = 0;
  ASSERT_EQ(wait4(burner.pid, &status, 0, &ru), burner.pid);
  burner.pid = -1;
  ::close(burner.from_child);
  exact = ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + ru.ru_stime.tv_sec +
          ru.ru_stime.tv_usec * 1e-6;
  exited = true;
  c.stop();
  const double recorded = c.summary()["processes"][0]["cpu_core_s"].get<double>();
  EXPECT_DOUBLE_EQ(recorded, exact.load());
  EXPECT_GT(recorded, 0.45);
}

TEST(MetricsCollector, WritesDocumentedCsvAndSummary) {
  // A server (this process) and two consumers (sleeping children) fed by counters.
  auto sleeper = [](int in, int) { wait_byte(in); };
  Child a(sleeper), b(sleeper);
  std::atomic<uint64_t> sa{0}, sb{0};
  std::atomic<int> ring{0};
  const fs::path dir = fresh_dir("layout") / "nested" / "run1";  // parents are created
  CollectorOptions o = fast_options(dir);
  o.nvml_library = "/nonexistent/libnvidia-ml.so.1";
  o.summary_every_ticks = 2;
  ManualTicks clock;
  MetricsCollector c(
      o,
      [&] {
        MetricsSnapshot s;
        s.producer_blocked_s = 0.5;
        s.ring_size = 8;
        s.ring_used = ring.load();
        s.processes.push_back({"server", "", getpid(), 0, 0});
        s.processes.push_back({"consumer", "a", a.pid, sa.load(), 0.25});
        s.processes.push_back({"consumer", "b", b.pid, sb.load(), 0.5});
        return s;
      },
      clock.env());
  c.start();
  for (int i = 0; i < 10; ++i) {
    sa += 32;
    sb += 16;
    ring = (i % 8) + 1;
    clock.now += 0.2;
    c.tick();
  }
  json partial = read_json(dir / "summary.json");  // every 2 ticks
  EXPECT_EQ(partial["complete"], false);
  EXPECT_EQ(partial["ticks"], 10);
  clock.now += 0.2;
  c.stop();
  c.stop();  // idempotent
  EXPECT_THROW(c.start(), Error);

  auto procs = read_csv(dir / "processes.csv");
  const std::vector<std::string> want{"time_s",
                                      "role",
                                      "id",
                                      "pid",
                                      "cpu_s",
                                      "cpu_percent",
                                      "rss_mb",
                                      "tree_rss_mb",
                                      "procs",
                                      "samples",
                                      "samples_per_s",
                                      "wait_s",
                                      "run_queue_wait_s",
                                      "gpu_sm_percent",
                                      "gpu_memory_mb"};
  EXPECT_EQ(procs.at(0), want);
  ASSERT_EQ(procs.size(), 1 + 3 * 12u);
  EXPECT_EQ(procs[1][1], "server");
  EXPECT_EQ(procs[2][1], "consumer");
  EXPECT_EQ(procs[2][2], "a");
  EXPECT_EQ(procs[2][3], std::to_string(a.pid));
  EXPECT_EQ(procs[2][9], "0");  // deltas from first sight
  for (size_t i = 1; i < procs.size(); ++i) EXPECT_EQ(procs[i].size(), want.size()) << i;
  auto server = read_csv(dir / "server.csv");
  EXPECT_EQ(server.at(0),
            (std::vector<std::string>{"time_s", "producer_blocked_s", "producer_blocked_percent",
                                      "ring_used", "ring_size", "ring_fill_percent"}));
  EXPECT_EQ(server.at(1)[4], "8");
  EXPECT_EQ(header_of(dir / "system.csv"),
            (std::vector<std::string>{"time_s", "system/cpu_utilization_percentage",
                                      "system/system_memory_usage_megabytes",
                                      "system/system_memory_usage_percentage"}));
  EXPECT_FALSE(fs::exists(dir / ".summary.json.tmp"));

  json s = read_json(dir / "summary.json");
  EXPECT_EQ(s, c.summary());
  EXPECT_EQ(s["format"], "batchcast-metrics");
  EXPECT_EQ(s["run_name"], "run1");
  EXPECT_EQ(s["complete"], true);
  EXPECT_EQ(s["incomplete_reason"], nullptr);
  EXPECT_EQ(s["samples"], 320u + 160u);
  EXPECT_DOUBLE_EQ(s["wait_s"].get<double>(), 0.75);  // counters are counted whole
  EXPECT_NEAR(s["duration_s"].get<double>(), 2.2, 1e-9);
  EXPECT_EQ(s["ticks"].get<int>(), 12);
  EXPECT_EQ(procs[5][10], "160.00");  // consumer a: 32 samples in 0.2 s
  const double server_cpu = s["cpu_core_s"]["server"];
  const double all_cpu = s["cpu_core_s"]["all"];
  EXPECT_GE(all_cpu, server_cpu);
  EXPECT_NEAR(s["cpu_core_s_per_sample"]["all"].get<double>(), all_cpu / 480, 1e-12);
  EXPECT_NEAR(s["cpu_core_s_per_sample"]["server"].get<double>(), server_cpu / 480, 1e-12);
  ASSERT_EQ(s["processes"].size(), 3u);
  EXPECT_EQ(s["processes"][1]["samples"], 320u);
  EXPECT_EQ(s["processes"][2]["id"], "b");
  EXPECT_GT(s["processes"][0]["peak_rss_mb"].get<double>(), 0);
  EXPECT_GT(s["peak_rss_mb"].get<double>(), 0);
  EXPECT_EQ(s["ring_size"], 8);
  EXPECT_GT(s["mean_ring_fill_percent"].get<double>(), 0);
  EXPECT_DOUBLE_EQ(s["producer_blocked_s"].get<double>(), 0.0);
  EXPECT_TRUE(s["system"].contains("mean_cpu_utilization_percentage"));
  for (const char* key : {"start_unix_s", "interval_s", "samples_per_s", "sampler", "gpus"})
    EXPECT_TRUE(s.contains(key)) << key;
}

TEST(MetricsCollector, CountsWholeCountersAndSaysWhyARunIsIncomplete) {
  // A consumer first listed after it consumed 500 samples (it attached and read between two
  // ticks) counts all 500; one that leaves stays listed with its final count; a summary whose
  // owner says its counts are not final is incomplete, and says why.
  const fs::path dir = fresh_dir("whole");
  int phase = 0;
  ManualTicks clock;
  MetricsCollector c(
      fast_options(dir),
      [&] {
        MetricsSnapshot s;
        s.processes.push_back({"server", "", getpid(), 0, 0});
        if (phase >= 1) s.processes.push_back({"consumer", "1", 0x7ffffff0, 500, 1.5});
        if (phase >= 2) s.incomplete = "1 consumer(s) still attached";
        return s;
      },
      clock.env());
  c.start();
  phase = 1;
  clock.now += 0.2;
  c.tick();
  phase = 2;
  clock.now += 0.2;
  c.stop();
  json s = read_json(dir / "summary.json");
  EXPECT_EQ(s["samples"], 500u);
  EXPECT_DOUBLE_EQ(s["wait_s"].get<double>(), 1.5);
  EXPECT_EQ(s["complete"], false);
  EXPECT_EQ(s["incomplete_reason"], "1 consumer(s) still attached");
}

TEST(MetricsCollector, UnknownPidHasEmptyCpuCells) {
  const fs::path dir = fresh_dir("unknown");
  MetricsCollector c(fast_options(dir), [] { return one_process("consumer", 0x7ffffff0); });
  c.start();
  c.stop();
  auto rows = read_csv(dir / "processes.csv");
  ASSERT_GE(rows.size(), 2u);
  EXPECT_EQ(rows[1][4], "");
  EXPECT_TRUE(c.summary()["processes"][0]["cpu_core_s"].is_null());
}

TEST(MetricsCollector, ClearErrorsForBadDirectories) {
  const fs::path base = fresh_dir("errors");
  fs::create_directories(base);
  std::ofstream(base / "a_file") << "x";
  CollectorOptions o;
  o.dir = (base / "a_file" / "run").string();
  try {
    MetricsCollector c(o, [] { return MetricsSnapshot{}; });
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(o.dir), std::string::npos) << e.what();
  }
  o.dir = (base / "ro").string();
  if (geteuid() != 0) {  // root writes anywhere
    fs::create_directories(o.dir);
    chmod(o.dir.c_str(), 0555);
    try {
      MetricsCollector c(o, [] { return MetricsSnapshot{}; });
      FAIL() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("not writable"), std::string::npos) << e.what();
    }
  }
  o.dir = (base / "ok").string();
  o.interval_s = 0;
  EXPECT_THROW(MetricsCollector(o, [] { return MetricsSnapshot{}; }), Error);
}

TEST(MetricsCollector, SourceThatThrowsIsSurvived) {
  const fs::path dir = fresh_dir("throws");
  int calls = 0;
  ManualTicks clock;
  MetricsCollector c(
      fast_options(dir),
      [&]() -> MetricsSnapshot {
        if (calls++ > 0) throw std::runtime_error("owner is gone");
        return one_process("server", getpid());
      },
      clock.env());
  c.start();
  clock.now += 0.2;
  c.tick();
  c.stop();
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(c.summary()["processes"].size(), 1u);  // the last good snapshot is reused
}

TEST(ProcessTracker, CountsOwnSamplesAndWait) {
  const fs::path dir = fresh_dir("tracker");
  ProcessTracker t(fast_options(dir), "trainer");
  t.start();
  t.add_samples(100);
  t.add_wait(0.25);
  t.add_wait(-1);  // ignored
  burn_cpu(0.3);
  t.stop();
  json s = t.summary();
  EXPECT_EQ(s["samples"], 100u);
  EXPECT_NEAR(s["wait_s"].get<double>(), 0.25, 1e-6);
  ASSERT_EQ(s["processes"].size(), 1u);
  EXPECT_EQ(s["processes"][0]["role"], "trainer");
  EXPECT_EQ(s["processes"][0]["id"], std::to_string(getpid()));
  EXPECT_GT(s["cpu_core_s"]["consumers"].get<double>(), 0.25);
}

// Sampler cost per tick with a realistic watch list (this process and three children); at the
// default 1 s interval the sampler's share of a core is this cost / 1 s.
TEST(MetricsCollector, SamplerCostUnderOnePercentOfACoreAtOneSecond) {
  auto sleeper = [](int in, int) { wait_byte(in); };
  Child a(sleeper), b(sleeper), d(sleeper);
  const fs::path dir = fresh_dir("overhead");
  ManualTicks clock;
  MetricsCollector c(
      fast_options(dir),
      [&] {
        MetricsSnapshot s = one_process("server", getpid());
        for (pid_t p : {a.pid, b.pid, d.pid}) s.processes.push_back({"consumer", "", p, 1, 0});
        return s;
      },
      clock.env());
  c.start();
  for (int i = 0; i < 40; ++i) {
    clock.now += 0.2;
    c.tick();
  }
  c.stop();
  json s = c.summary();
  const double per_tick = s["sampler"]["cpu_s"].get<double>() / s["ticks"].get<double>();
  std::printf("sampler: %lld ticks, %.3f ms CPU per tick -> %.3f%% of a core at 1 s\n",
              static_cast<long long>(s["ticks"].get<int64_t>()), per_tick * 1e3, per_tick * 100);
  RecordProperty("sampler_ms_per_tick", std::to_string(per_tick * 1e3));
  EXPECT_LT(per_tick, 0.01);
}

}  // namespace
}  // namespace batchcast
