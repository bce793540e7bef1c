// The collector's CPU figures against the kernel's: a real process tree (threads, a reaped
// grandchild) counted from its start against wait4(), the owner's exact total replacing the
// /proc readings, and no CPU rate above what the machine's cores can spend.
// CPU time is compared, not wall time, so a busy machine only makes the tests slower.
#include <time.h>

#include <algorithm>
#include <optional>

#include "tests/cpp/metrics/collector_fixture.h"

namespace batchcast {
namespace {

using namespace batchcast::testing;

double cpu_of(const rusage& ru) {
  return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + ru.ru_stime.tv_sec +
         ru.ru_stime.tv_usec * 1e-6;
}

double thread_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// Spins until the calling thread has used `seconds` of CPU.
void burn_thread_cpu(double seconds) {
  const double until = thread_cpu_s() + seconds;
  volatile uint64_t x = 0;
  while (thread_cpu_s() < until)
    for (int i = 0; i < 100000; ++i) x = x + i;
}

MetricsSnapshot since_start(const std::string& role, pid_t pid,
                            std::optional<double> exact = std::nullopt) {
  MetricsSnapshot s;
  MetricsSnapshot::Process p{role, "", pid, 0, 0};
  p.since_start = true;
  p.exact_cpu_s = exact;
  s.processes.push_back(p);
  return s;
}

// A child that burns CPU in two threads that exit, and in a grandchild it reaps, then waits on
// `hold` (its CPU is final) until the test closes it.
pid_t start_tree(const int hold[2]) {
  const pid_t pid = fork();
  if (pid != 0) return pid;
  ::close(hold[1]);
  std::thread a([] { burn_thread_cpu(0.5); }), b([] { burn_thread_cpu(0.5); });
  const pid_t grandchild = fork();
  if (grandchild == 0) {
    burn_thread_cpu(0.6);
    _exit(0);
  }
  a.join();
  b.join();
  waitpid(grandchild, nullptr, 0);
  char c;
  while (::read(hold[0], &c, 1) > 0) {
  }
  _exit(0);
}

TEST(KernelCpu, ProcessTreeFromItsStartMatchesWait4) {
  int hold[2];
  ASSERT_EQ(pipe(hold), 0);
  const pid_t child = start_tree(hold);
  ::close(hold[0]);
  const fs::path dir = fresh_dir("kernel_tree");
  MetricsCollector c(fast_options(dir), [&] { return since_start("trainer", child); });
  // Started late on purpose: the child's CPU before the first tick counts too.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  c.start();
  // Its CPU is final once its /proc reading has the threads' and the grandchild's 1.6 s.
  for (;;) {
    std::ifstream st("/proc/" + std::to_string(child) + "/stat");
    std::string line;
    std::getline(st, line);
    std::istringstream in(line.substr(line.rfind(')') + 2));
    std::vector<std::string> f;
    for (std::string x; in >> x;) f.push_back(x);
    ASSERT_GT(f.size(), 15u);
    double ticks = 0;
    for (int i = 11; i <= 14; ++i) ticks += std::stod(f[i]);  // utime stime cutime cstime
    if (ticks / static_cast<double>(sysconf(_SC_CLK_TCK)) >= 1.55) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  c.stop();
  ::close(hold[1]);
  rusage ru{};
  ASSERT_EQ(wait4(child, nullptr, 0, &ru), child);
  const double kernel = cpu_of(ru);
  const double recorded = c.summary()["processes"][0]["cpu_core_s"].get<double>();
  EXPECT_GT(kernel, 1.5);
  EXPECT_NEAR(recorded, kernel, 0.1 * kernel + 0.05) << "recorded " << recorded;
}

// The /proc seam, a tree the test writes: a jump no core could have spent in the span gets no
// rate (the cumulative cell keeps it), and the owner's exact total replaces the readings, even
// where they were higher (a descendant that left the tree still running).
struct Tree {
  pid_t pid = 0x7ffffff0;
  double cpu = 1.0;
  metrics::ProcessTable table() const {
    metrics::ProcStat s;
    s.pid = pid;
    s.ppid = 1;
    s.utime_s = cpu;
    return metrics::ProcessTable({s});
  }
};

TEST(KernelCpu, NoRateAboveTheMachinesCoresAndExactTotalReplacesReadings) {
  Tree tree;
  ManualTicks clock;
  std::optional<double> exact;
  const fs::path dir = fresh_dir("kernel_seam");
  MetricsCollector c(
      fast_options(dir), [&] { return since_start("command", tree.pid, exact); },
      clock.env([&] { return tree.table(); }));
  c.start();
  clock.now += 1.0;
  tree.cpu += 0.5;  // half a core: a rate
  c.tick();
  clock.now += 1.0;
  tree.cpu += 1000.0;  // more than any machine's cores in a second: a total, no rate
  c.tick();
  clock.now += 1.0;
  exact = 600.0;  // the kernel's total at the end, below the readings
  c.stop();
  const auto rows = read_csv(dir / "processes.csv");
  ASSERT_EQ(rows.size(), 5u);
  const auto& header = rows[0];
  const size_t cpu_s = std::find(header.begin(), header.end(), "cpu_s") - header.begin();
  const size_t pct = std::find(header.begin(), header.end(), "cpu_percent") - header.begin();
  EXPECT_DOUBLE_EQ(std::stod(rows[2][pct]), 50.0);
  EXPECT_DOUBLE_EQ(std::stod(rows[3][cpu_s]), 1000.5 + 1.0);
  EXPECT_EQ(rows[3][pct], "");
  EXPECT_DOUBLE_EQ(std::stod(rows[4][cpu_s]), 600.0);
  EXPECT_EQ(rows[4][pct], "");  // the total went down: no rate either
  json p = c.summary()["processes"][0];
  EXPECT_DOUBLE_EQ(p["cpu_core_s"].get<double>(), 600.0);
  EXPECT_EQ(p["cpu_exact"], true);
  EXPECT_GE(c.summary()["system"]["cpu_cores"].get<double>(), 1.0);
}

}  // namespace
}  // namespace batchcast
