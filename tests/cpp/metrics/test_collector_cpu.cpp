// MetricsCollector's CPU figures: forked processes (own, live child, reaped child) against their
// own getrusage, exact figures from an injected process table and clock, run-queue wait, CPU since
// a command's start, an unknown pid, ProcessTracker's own counts, and the sampler's cost.
// CPU comparisons are CPU time against CPU time, so a loaded machine only makes them slower.
// Tests that need ticks but not real CPU drive them through the seam (CollectorEnv: no sampler
// thread, a clock of their own), so none of them sleeps for the sampler.
#include <gtest/gtest.h>

#include "tests/cpp/metrics/collector_fixture.h"

namespace batchcast {
namespace {

using namespace batchcast::testing;

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
