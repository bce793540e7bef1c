// MetricsCollector's run directory: the documented CSV and summary layout, whole counters and why
// a run is incomplete, clear errors for bad directories, a source that throws.
#include <gtest/gtest.h>

#include "tests/cpp/metrics/collector_fixture.h"

namespace batchcast {
namespace {

using namespace batchcast::testing;

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

}  // namespace
}  // namespace batchcast
