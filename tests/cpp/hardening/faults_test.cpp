// Fault injection with real processes:
// - the server dies (SIGKILL) or is stopped (SIGTERM) while consumers wait in next(): each gets
//   ServerGoneError ("is gone") within the heartbeat timeout, never hangs; a new server on the
//   same endpoint removes the stale segment and serves new consumers; /dev/shm ends clean.
// - image data changes under a running server (`batchcast serve --data DIR`): a file deleted or
//   truncated mid-epoch. --on-error raise: the consumer's error names the file, the server exits
//   1 after --fail-linger and leaves the failure, naming the file, in "<socket>.failed" (0600)
//   for consumers that come later (the Python tests check they read it). --on-error skip:
//   the stream completes with whole epochs (the gap filled from the next sample), and the
//   server logs the skip count (once per epoch that read the bad file) and names the file.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>

#include "shm/slot_pool.h"
#include "tests/cpp/hardening/hardening.h"

namespace batchcast::testing {
namespace {

namespace fs = std::filesystem;

TEST(Faults, ServerRestartWhileConsumersWait) {
  for (int sig : {SIGKILL, SIGTERM}) {
    SCOPED_TRACE(sig == SIGKILL ? "SIGKILL" : "SIGTERM");
    auto ep = unique_endpoint("restart");
    const std::string segment = segment_name_for(ep);
    {
      // min-consumers 3 and only 2 come: both wait in next() for a stream that never starts.
      ChildProcess server(serve_args(ep, {"--synthetic", "1000", "--sample-bytes", "32", "--epochs",
                                          "1", "--min-consumers", "3"}));
      ASSERT_TRUE(server.wait_for_err("serving on", 20)) << server.err();
      ChildProcess a({probe_bin(), "--endpoint", ep, "--timeout", "60"});
      ChildProcess b({probe_bin(), "--endpoint", ep, "--timeout", "60", "--batch-size", "7"});
      // The consumers' own word that the handshake is done: the server logs "attached" as it
      // queues the welcome, which its I/O thread may not have sent yet when the kill lands,
      // and a consumer never welcomed waits for a server as for one not started yet.
      ASSERT_TRUE(a.wait_for_lines("W", 1, 20)) << a.err() << server.err();
      ASSERT_TRUE(b.wait_for_lines("W", 1, 20)) << b.err() << server.err();
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      server.signal(sig);
      // "is gone" within 10 s: found dead (by pid, or by silence past the heartbeat timeout),
      // not the 60 s wait for data running out. How fast is not a test's business.
      for (auto* p : {&a, &b}) {
        EXPECT_EQ(p->wait(10), 4) << "a waiting consumer must fail, not hang: " << p->err();
        EXPECT_NE(p->err().find("is gone"), std::string::npos) << p->err();
      }
      server.wait(10);
    }
    // SIGTERM removes the segment. SIGKILL leaves it until a server starts: the next one at this
    // endpoint, or any other of this user, whose sweep of dead servers' segments
    // (remove_stale_segments, tested in slot_pool_test) may run first; so only its absence
    // after the restart below is asserted.
    if (sig == SIGTERM) {
      EXPECT_FALSE(file_exists("/dev/shm/" + segment)) << "SIGTERM removes it";
    }
    ChildProcess again(
        serve_args(ep, {"--synthetic", "300", "--sample-bytes", "32", "--epochs", "1"}));
    ChildProcess c({probe_bin(), "--endpoint", ep, "--timeout", "30", "--batch-size", "10"});
    ASSERT_EQ(c.wait(30), 0) << c.err() << again.err();
    auto run = parse_probe(c);
    EXPECT_EQ(run.ended_epochs.size(), 1u);
    EXPECT_EQ(check_epochs(run, 300), "");
    EXPECT_EQ(again.wait(10), 0) << again.err();
    EXPECT_FALSE(file_exists("/dev/shm/" + segment));
    EXPECT_FALSE(file_exists(ipc_path(ep)));
  }
}

class ImageFaults : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {
 protected:
  // The dataset is made once, by the first test that needs it (an ASSERT in SetUpTestSuite would
  // only mark the tests skipped, hiding a broken make-dataset).
  static const std::string& source() {
    static std::string dir = [] {
      std::string d = "/tmp/bchard-ds-" + std::to_string(::getpid());
      fs::remove_all(d);
      ChildProcess make(
          {batchcast_bin(), "make-dataset", "--out", d, "--classes", "2", "--per-class", "20"});
      int rc = make.wait(120);
      if (rc != 0) {
        ADD_FAILURE() << "make-dataset exited " << rc << ": " << make.err();
        return std::string();
      }
      return d;
    }();
    return dir;
  }
  static void TearDownTestSuite() {
    if (!source().empty()) fs::remove_all(source());
  }
};

// 40 images, no shuffle, chunks of 4, ring of 3: the producer is at most 12 samples ahead of a
// consumer that sleeps 150 ms per batch, so class_001 (samples 20..39) is not read yet when the
// consumer has its first batch; the fault hits epoch 0 (and again epoch 1 for a deleted file).
TEST_P(ImageFaults, FileDeletedOrTruncatedMidEpoch) {
  const auto& [fault, on_error] = GetParam();
  ASSERT_FALSE(source().empty()) << "no dataset";
  std::string dir = source() + "-" + fault + "-" + on_error;
  fs::remove_all(dir);
  fs::copy(source(), dir, fs::copy_options::recursive);
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(fs::path(dir) / "class_001"))
    files.push_back(e.path());
  std::sort(files.begin(), files.end());
  ASSERT_EQ(files.size(), 20u);
  const fs::path victim = files[10];

  auto ep = unique_endpoint("imgfault");
  ChildProcess server(
      serve_args(ep, {"--data", dir, "--batch-size", "4", "--image-size", "32", "--output", "uint8",
                      "--epochs", "2", "--ring", "3", "--workers", "1", "--no-shuffle",
                      "--on-error", on_error, "--fail-linger", "1"}));
  ChildProcess probe({probe_bin(), "--endpoint", ep, "--timeout", "30", "--no-verify",
                      "--batch-size", "4", "--sleep-ms", "150"});
  ASSERT_TRUE(probe.wait_for_lines("B", 1, 30)) << probe.err() << server.err();
  if (fault == "delete") {
    fs::remove(victim);
  } else {
    fs::resize_file(victim, fs::file_size(victim) / 2);
  }
  int rc = probe.wait(60);
  int server_rc = server.wait(20);
  auto run = parse_probe(probe);
  if (on_error == "raise") {
    EXPECT_EQ(rc, 4) << "the consumer must get the stream's error";
    EXPECT_NE(probe.err().find(victim.filename().string()), std::string::npos)
        << "the error must name the bad file: " << probe.err();
    EXPECT_EQ(server_rc, 1) << "the server must exit 1 after a failed stream and its linger";
    const std::string record = ipc_path(ep) + ".failed";
    std::ifstream in(record);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    struct stat st {};
    EXPECT_EQ(::stat(record.c_str(), &st), 0) << "no failure record " << record;
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    EXPECT_NE(text.find(victim.filename().string()), std::string::npos) << text;
    fs::remove(record);
  } else {
    EXPECT_EQ(rc, 0) << probe.err();
    EXPECT_EQ(server_rc, 0) << server.err();
    EXPECT_EQ(run.ended_epochs.size(), 2u);
    std::smatch m;
    std::string log = server.err();
    ASSERT_TRUE(std::regex_search(log, m, std::regex("(\\d+) bad samples skipped"))) << log;
    uint64_t skipped = std::stoull(m[1]);
    EXPECT_EQ(skipped, 2u) << "the victim is read once per epoch";
    uint64_t samples = 0;
    for (const auto& b : run.batches) samples += b.size;
    // DESIGN: a skipped sample's place is filled from the next sample; epochs keep their length.
    EXPECT_EQ(samples, 2u * 40u) << "the stream must still deliver every epoch whole";
    EXPECT_NE(log.find(victim.filename().string()), std::string::npos) << "the skip names the file";
  }
  EXPECT_FALSE(file_exists("/dev/shm/" + segment_name_for(ep)));
  EXPECT_FALSE(file_exists(ipc_path(ep)));
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Hardening, ImageFaults,
                         ::testing::Combine(::testing::Values("delete", "truncate"),
                                            ::testing::Values("raise", "skip")),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + std::get<1>(info.param);
                         });

}  // namespace
}  // namespace batchcast::testing
