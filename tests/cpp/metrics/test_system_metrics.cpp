// Machine-level readers on fakes: RAPL energy (zones, wraparound), schedstat parsing, the
// collocation mode (rule, MPS control socket, NVML's MIG and MPS evidence through the fake NVML).
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "metrics/collocation.h"
#include "metrics/nvml.h"
#include "metrics/proc_stats.h"
#include "metrics/rapl.h"

namespace batchcast::metrics {
namespace {

namespace fs = std::filesystem;

// A temporary directory removed at the end of the scope, whatever the assertions did.
struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& name)
      : path(fs::temp_directory_path() /
             ("bc_sysmetrics_" + name + "_" + std::to_string(getpid()))) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

void write_file(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << text;
}

TEST(Rapl, SumsPackageZonesAndUndoesWraparound) {
  TempDir root("rapl");
  write_file(root.path / "intel-rapl:0" / "energy_uj", "999000000\n");
  write_file(root.path / "intel-rapl:0" / "max_energy_range_uj", "1000000000\n");
  write_file(root.path / "intel-rapl:1" / "energy_uj", "5000000\n");
  write_file(root.path / "intel-rapl:1" / "max_energy_range_uj", "1000000000\n");
  // A subzone (part of package 0) must not count twice.
  write_file(root.path / "intel-rapl:0:0" / "energy_uj", "1\n");
  write_file(root.path / "intel-rapl:0:0" / "max_energy_range_uj", "1000000000\n");
  std::string why;
  auto rapl = Rapl::open(root.path.string(), &why);
  ASSERT_TRUE(rapl) << why;
  EXPECT_DOUBLE_EQ(rapl->joules(), 0.0);
  write_file(root.path / "intel-rapl:0" / "energy_uj", "1000000\n");  // wrapped: +2 J
  write_file(root.path / "intel-rapl:1" / "energy_uj", "8000000\n");  // +3 J
  EXPECT_DOUBLE_EQ(rapl->joules(), 5.0);
  write_file(root.path / "intel-rapl:1" / "energy_uj", "9000000\n");
  EXPECT_DOUBLE_EQ(rapl->joules(), 6.0);
}

TEST(Rapl, AbsentPowercapIsAnExpectedOutcomeWithAReason) {
  std::string why;
  EXPECT_FALSE(Rapl::open("/nonexistent/powercap", &why));
  EXPECT_NE(why.find("CPU energy is omitted"), std::string::npos) << why;
  TempDir empty("rapl_empty");
  EXPECT_FALSE(Rapl::open(empty.path.string(), &why));
  EXPECT_NE(why.find("no RAPL package zone"), std::string::npos) << why;
}

TEST(ProcStats, ParsesSchedstatWait) {
  auto w = parse_schedstat_wait("123456789 2500000000 42\n");
  ASSERT_TRUE(w);
  EXPECT_DOUBLE_EQ(*w, 2.5);
  EXPECT_FALSE(parse_schedstat_wait("garbage"));
  EXPECT_FALSE(parse_schedstat_wait("17"));
  EXPECT_TRUE(read_run_queue_wait(getpid()));  // this kernel has schedstat
  EXPECT_FALSE(read_run_queue_wait(0x7ffffff0));
}

TEST(Collocation, RuleMigOverMpsOverTimeSlicing) {
  EXPECT_EQ(classify_collocation({}), "none");
  EXPECT_EQ(classify_collocation({true, false, false, false}), "time-slicing");
  EXPECT_EQ(classify_collocation({true, false, true, false}), "mps");
  EXPECT_EQ(classify_collocation({true, false, false, true}), "mps");
  EXPECT_EQ(classify_collocation({true, true, true, true}), "mig");
  // Without a GPU, an MPS daemon changes nothing.
  EXPECT_EQ(classify_collocation({false, false, true, false}), "none");
}

// Sets an environment variable for one scope.
struct ScopedEnv {
  std::string name;
  ScopedEnv(const char* n, const std::string& v) : name(n) { ::setenv(n, v.c_str(), 1); }
  ~ScopedEnv() { ::unsetenv(name.c_str()); }
};

TEST(Collocation, MpsControlSocketIsLiveOnlyWhileSomeoneListens) {
  TempDir pipe_dir("mps");
  EXPECT_FALSE(mps_control_live(pipe_dir.path.string()));
  const std::string path = (pipe_dir.path / "control").string();
  int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(fd, 4), 0);
  EXPECT_TRUE(mps_control_live(pipe_dir.path.string()));
  ScopedEnv env("CUDA_MPS_PIPE_DIRECTORY", pipe_dir.path.string());
  EXPECT_EQ(mps_pipe_directory(), pipe_dir.path.string());
  EXPECT_EQ(detect_collocation(nullptr), "none");  // no GPU
  auto nvml = Nvml::open(BC_FAKE_NVML_PATH, nullptr);
  ASSERT_TRUE(nvml);
  EXPECT_EQ(detect_collocation(&*nvml), "mps");
  ::close(fd);  // a stale socket file with nobody listening is not a daemon
  EXPECT_FALSE(mps_control_live(pipe_dir.path.string()));
}

TEST(Collocation, NvmlEvidenceFromTheFake) {
  TempDir no_daemon("nodaemon");
  ScopedEnv pipe("CUDA_MPS_PIPE_DIRECTORY", no_daemon.path.string());
  {
    auto nvml = Nvml::open(BC_FAKE_NVML_PATH, nullptr);
    ASSERT_TRUE(nvml);
    EXPECT_EQ(detect_collocation(&*nvml), "time-slicing");
  }
  {
    ScopedEnv mps("FAKE_NVML_MPS", "1");  // this process listed as an MPS client
    auto nvml = Nvml::open(BC_FAKE_NVML_PATH, nullptr);
    ASSERT_TRUE(nvml);
    EXPECT_EQ(detect_collocation(&*nvml), "mps");
  }
  {
    ScopedEnv mig("FAKE_NVML_MIG", "1");
    auto nvml = Nvml::open(BC_FAKE_NVML_PATH, nullptr);
    ASSERT_TRUE(nvml);
    EXPECT_TRUE(nvml->capabilities().mig_enabled);
    EXPECT_EQ(detect_collocation(&*nvml), "mig");
  }
}

TEST(Nvml, FakeCapabilitiesAndMissingReadings) {
  auto nvml = Nvml::open(BC_FAKE_NVML_PATH, nullptr);
  ASSERT_TRUE(nvml);
  const NvmlCapabilities& caps = nvml->capabilities();
  EXPECT_TRUE(caps.energy);
  EXPECT_TRUE(caps.gpm);
  EXPECT_TRUE(caps.process_list);
  EXPECT_TRUE(caps.process_utilization);
  EXPECT_TRUE(nvml->missing().empty());
  auto procs = nvml->processes();
  ASSERT_EQ(procs.size(), 1u);
  EXPECT_EQ(procs[0].pid, static_cast<unsigned>(getpid()));
  EXPECT_EQ(procs[0].gpu, 0);
  EXPECT_DOUBLE_EQ(procs[0].memory_mb.value_or(-1), 1000.0);
  EXPECT_DOUBLE_EQ(procs[0].sm_percent.value_or(-1), 42.0);
  EXPECT_FALSE(procs[0].mps);
}

}  // namespace
}  // namespace batchcast::metrics
