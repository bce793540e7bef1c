// MetricsCollector's GPU figures: NVML absent (the columns left out, no error) and faked (the fake
// NVML of fake_nvml.c: GPM, energy, process lists) as MLflow's GPU columns and per-process rows.
#include <gtest/gtest.h>

#include "tests/cpp/metrics/collector_fixture.h"

namespace batchcast {
namespace {

using namespace batchcast::testing;

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

}  // namespace
}  // namespace batchcast
