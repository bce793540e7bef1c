// End-to-end stream semantics with real processes: the batchcast server serving synthetic
// samples, probe consumers that verify every byte against the sample index (see
// tests/cpp/support/probe_consumer.cpp), real ZeroMQ sockets and real shared memory. Each rule
// is unit-tested against StreamState (tests/cpp/server/stream_state_test.cpp); these check that
// the processes put together keep them. They wait on events (process exits, output lines) with
// bounds a loaded machine meets, never on sleeps.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <sstream>

#include "tests/cpp/support/probe_output.h"
#include "tests/cpp/support/processes.h"
#include "tests/cpp/support/server_process.h"

namespace batchcast::testing {
namespace {

// Servers and probes are killed when a test ends; servers' segments and socket files are
// removed even when an assertion failed (ServerProcess), and checked when they exited alone.
class StreamTest : public ::testing::Test {
 protected:
  void TearDown() override {
    probes_.clear();
    servers_.clear();
  }
  ServerProcess& server(const std::string& ep, const std::vector<std::string>& extra) {
    servers_.push_back(std::make_unique<ServerProcess>(ep, extra));
    return *servers_.back();
  }
  ChildProcess& probe(const std::string& ep, std::vector<std::string> extra) {
    std::vector<std::string> args = {probe_bin(), "--endpoint", ep, "--timeout", "60"};
    args.insert(args.end(), extra.begin(), extra.end());
    probes_.push_back(std::make_unique<ChildProcess>(args));
    return *probes_.back();
  }
  std::vector<std::unique_ptr<ServerProcess>> servers_;
  std::vector<std::unique_ptr<ChildProcess>> probes_;
};

std::vector<int64_t> sorted(std::vector<int64_t> v) {
  std::sort(v.begin(), v.end());
  return v;
}

std::vector<int64_t> iota(int64_t n) {
  std::vector<int64_t> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = i;
  return v;
}

TEST_F(StreamTest, EveryConsumerSeesEverySampleOncePerEpochInStreamOrder) {
  auto ep = unique_endpoint("coverage");
  const int64_t n = 1000;
  auto& srv = server(ep, {"--synthetic", "1000", "--sample-bytes", "48", "--batch-size", "64",
                          "--epochs", "3", "--min-consumers", "4", "--ring", "6"});
  auto& c7 = probe(ep, {"--batch-size", "7"});
  auto& c32 = probe(ep, {"--batch-size", "32"});
  auto& c100a = probe(ep, {"--batch-size", "100"});
  auto& c100b = probe(ep, {"--batch-size", "100"});
  for (auto* c : {&c7, &c32, &c100a, &c100b}) ASSERT_EQ(c->wait(120), 0) << c->err();
  ASSERT_EQ(srv.wait(60), 0) << srv.err();

  std::map<uint64_t, std::vector<int64_t>> reference;
  for (auto* c : {&c7, &c32, &c100a, &c100b}) {
    auto run = parse_probe(*c);
    ASSERT_TRUE(run.finished);
    EXPECT_EQ(run.skipped, 0u);
    auto epochs = run.per_epoch();
    ASSERT_EQ(epochs.size(), 3u);
    for (const auto& [e, order] : epochs) {
      EXPECT_EQ(sorted(order), iota(n)) << "epoch " << e << " is not a permutation";
      if (reference.count(e)) {
        EXPECT_EQ(order, reference[e]) << "consumers disagree on the order of epoch " << e;
      } else {
        reference[e] = order;
      }
    }
    // Batches: b consecutive samples, the last one short, never spanning epochs.
    uint64_t b = c == &c7 ? 7 : c == &c32 ? 32 : 100;
    for (const auto& batch : run.batches) {
      EXPECT_EQ(batch.start % b, 0u);
      EXPECT_EQ(batch.size, std::min<uint64_t>(b, n - batch.start));
    }
  }
  EXPECT_NE(reference[0], reference[1]) << "epochs should be shuffled differently";
  auto a = parse_probe(c100a), bb = parse_probe(c100b);
  ASSERT_EQ(a.batches.size(), bb.batches.size());
  for (size_t i = 0; i < a.batches.size(); ++i)
    EXPECT_EQ(a.batches[i].hash, bb.batches[i].hash) << "batch " << i << " differs";
  // 32 divides 64: every batch of that consumer is a zero-copy view.
  for (const auto& batch : parse_probe(c32).batches) EXPECT_FALSE(batch.copied);
}

TEST_F(StreamTest, DropLastAndNoShuffle) {
  auto ep = unique_endpoint("droplast");
  auto& srv = server(ep, {"--synthetic", "250", "--sample-bytes", "16", "--batch-size", "64",
                          "--epochs", "2", "--no-shuffle"});
  auto& c = probe(ep, {"--batch-size", "100", "--drop-last"});
  ASSERT_EQ(c.wait(120), 0) << c.err();
  ASSERT_EQ(srv.wait(60), 0) << srv.err();
  auto run = parse_probe(c);
  ASSERT_EQ(run.batches.size(), 4u);  // 2 per epoch; the 50-sample tails dropped
  EXPECT_EQ(run.per_epoch()[0], iota(200));
}

TEST_F(StreamTest, AKilledConsumerIsDroppedAndTheOthersFinish) {
  auto ep = unique_endpoint("kill");
  auto& srv = server(ep, {"--synthetic", "2000", "--sample-bytes", "32", "--batch-size", "32",
                          "--epochs", "1", "--min-consumers", "2", "--ring", "4"});
  // The victim pauses holding its slots, which holds the other back until it is found dead.
  auto& victim = probe(ep, {"--batch-size", "32", "--max-batches", "3"});
  auto& other = probe(ep, {"--batch-size", "32"});
  ASSERT_TRUE(victim.wait_for_lines("P", 1, 60)) << victim.err();
  victim.signal(SIGKILL);
  ASSERT_EQ(other.wait(120), 0) << other.err();
  auto run = parse_probe(other);
  EXPECT_EQ(run.skipped, 0u);
  EXPECT_EQ(sorted(run.per_epoch()[0]), iota(2000));
  ASSERT_EQ(srv.wait(60), 0) << srv.err();
  EXPECT_NE(srv.err().find("died"), std::string::npos) << srv.err();
}

TEST_F(StreamTest, AConsumerLeftBehindUnderSkipPolicyReportsEverySampleItMissed) {
  auto ep = unique_endpoint("stopskip");
  auto& srv = server(ep, {"--synthetic", "4096", "--sample-bytes", "32", "--batch-size", "32",
                          "--epochs", "1", "--min-consumers", "2", "--ring", "6", "--stall-policy",
                          "skip", "--stall-timeout", "0.5"});
  // The frozen consumer stops itself after its second batch, so it is certain to be left behind
  // (an outside SIGSTOP could come after it had read the whole epoch on a busy machine).
  auto& frozen = probe(ep, {"--batch-size", "32", "--stop-after", "2"});
  auto& other = probe(ep, {"--batch-size", "32"});
  ASSERT_TRUE(frozen.wait_stopped(60)) << frozen.err();
  ASSERT_EQ(other.wait(120), 0) << "skip policy must let the others go on: " << other.err();
  frozen.signal(SIGCONT);
  ASSERT_EQ(frozen.wait(120), 0) << frozen.err();  // exit 0: no wrong byte was ever seen
  EXPECT_GT(parse_probe(frozen).skipped, 0u);
  // Each consumer saw no sample twice and reports every one it missed. `other` too may be left
  // behind for a moment when a busy machine stalls it longer than the stall timeout.
  for (auto* c : {&frozen, &other}) {
    auto run = parse_probe(*c);
    std::set<int64_t> seen;
    auto epochs = run.per_epoch();
    for (auto i : epochs[0]) EXPECT_TRUE(seen.insert(i).second) << "sample " << i << " twice";
    EXPECT_EQ(seen.size() + run.skipped, 4096u) << "skipped count must account for every sample";
  }
  ASSERT_EQ(srv.wait(60), 0) << srv.err();
}

TEST_F(StreamTest, AStoppedConsumerIsDecoupledAndLaterReadsEverySampleItMissed) {
  auto ep = unique_endpoint("decouple");
  const int64_t n = 4096;
  auto& srv = server(ep, {"--synthetic", "4096", "--sample-bytes", "32", "--batch-size", "32",
                          "--epochs", "2", "--min-consumers", "2", "--ring", "8", "--stall-timeout",
                          "0.5"});  // stall policy decouple: the default
  // Stopped by itself after its second batch: certain to hold the stream back.
  auto& frozen = probe(ep, {"--batch-size", "32", "--stop-after", "2"});
  auto& other = probe(ep, {"--batch-size", "32"});
  ASSERT_TRUE(frozen.wait_stopped(60)) << frozen.err();
  ASSERT_EQ(other.wait(120), 0) << "decouple must let the others go on: " << other.err();
  frozen.signal(SIGCONT);
  ASSERT_EQ(frozen.wait(120), 0) << frozen.err();  // exit 0: every regenerated byte was right
  for (auto* c : {&frozen, &other}) {
    auto run = parse_probe(*c);
    EXPECT_EQ(run.skipped, 0u) << "decoupling loses nothing";
    auto epochs = run.per_epoch();
    ASSERT_EQ(epochs.size(), 2u);
    for (const auto& [e, order] : epochs) EXPECT_EQ(sorted(order), iota(n)) << "epoch " << e;
  }
  EXPECT_EQ(parse_probe(frozen).per_epoch(), parse_probe(other).per_epoch())
      << "private chunks are the stream's: the same order";
  ASSERT_EQ(srv.wait(60), 0) << srv.err();
  EXPECT_NE(srv.err().find("decoupled"), std::string::npos) << srv.err();
}

TEST_F(StreamTest, LateJoinerInsideRetentionReplaysTheWholeEpoch) {
  auto ep = unique_endpoint("latein");
  // 10 chunks and 16 slots: the whole epoch stays retained while the first consumer pauses.
  auto& srv = server(ep, {"--synthetic", "640", "--sample-bytes", "32", "--batch-size", "64",
                          "--epochs", "1", "--ring", "16"});
  auto& first = probe(ep, {"--batch-size", "64", "--max-batches", "3"});
  ASSERT_TRUE(first.wait_for_lines("P", 1, 60)) << first.err();
  auto& late = probe(ep, {"--batch-size", "64"});
  ASSERT_EQ(late.wait(120), 0) << late.err();
  first.signal(SIGKILL);
  auto run = parse_probe(late);
  EXPECT_EQ(run.skipped, 0u);
  auto epochs = run.per_epoch();
  auto seen_by_first = parse_probe(first).per_epoch()[0];
  ASSERT_EQ(seen_by_first.size(), 192u);
  EXPECT_TRUE(std::equal(seen_by_first.begin(), seen_by_first.end(), epochs[0].begin()))
      << "the late joiner must replay the same stream from the epoch's start";
  EXPECT_EQ(sorted(epochs[0]), iota(640));
  ASSERT_EQ(srv.wait(60), 0);
}

TEST_F(StreamTest, KilledServerGivesConsumersAClearErrorAndARestartIsClean) {
  auto ep = unique_endpoint("srvkill");
  auto& srv = server(
      ep, {"--synthetic", "100000", "--sample-bytes", "32", "--batch-size", "32", "--epochs", "0"});
  auto& c = probe(ep, {"--batch-size", "32", "--sleep-ms", "1"});
  ASSERT_TRUE(c.wait_for_lines("B", 3, 60)) << c.err();
  srv.signal(SIGKILL);
  EXPECT_EQ(c.wait(30), 4) << "the consumer must fail, not hang";
  EXPECT_NE(c.err().find("is gone"), std::string::npos) << c.err();

  // The SIGKILLed server left its segment; the next server start on this host removes it (this
  // one, or another test's server running in parallel), so the same endpoint serves again.
  auto& again = server(ep, {"--synthetic", "200", "--sample-bytes", "32", "--batch-size", "32"});
  auto& c2 = probe(ep, {"--batch-size", "32"});
  ASSERT_EQ(c2.wait(120), 0) << c2.err();
  EXPECT_EQ(sorted(parse_probe(c2).per_epoch()[0]), iota(200));
  ASSERT_EQ(again.wait(60), 0);
}

TEST_F(StreamTest, SigtermShutsTheServerDownCleanly) {
  auto ep = unique_endpoint("sigterm");
  auto& srv = server(ep, {"--synthetic", "100000", "--sample-bytes", "32", "--epochs", "0"});
  auto& c = probe(ep, {"--batch-size", "64", "--max-batches", "5"});
  ASSERT_TRUE(c.wait_for_lines("P", 1, 60)) << c.err();
  srv.signal(SIGTERM);
  EXPECT_EQ(srv.wait(60), 0) << srv.err();
  EXPECT_FALSE(srv.segment_exists());
  EXPECT_FALSE(srv.socket_exists()) << "ipc socket file left behind";
}

}  // namespace
}  // namespace batchcast::testing
