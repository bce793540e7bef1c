// End-to-end stream semantics with real processes: the batchcast server serving synthetic
// samples, probe consumers that verify every byte against the sample index (see
// tests/cpp/support/probe_consumer.cpp), real ZeroMQ sockets and real shared memory.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <sstream>

#include "shm/slot_pool.h"
#include "tests/cpp/support/probe_output.h"
#include "tests/cpp/support/processes.h"

namespace batchcast::testing {
namespace {

class StreamTest : public ::testing::Test {
 protected:
  void TearDown() override {
    servers_.clear();
    probes_.clear();
    for (const auto& ep : endpoints_) {
      EXPECT_FALSE(segment_exists(ep)) << "leaked the segment of " << ep;
      EXPECT_NE(::access(ep.substr(6).c_str(), F_OK), 0) << "ipc socket file left: " << ep;
    }
  }
  static bool segment_exists(const std::string& ep) {
    return ::access(("/dev/shm/" + segment_name_for(ep)).c_str(), F_OK) == 0;
  }
  ChildProcess& server(const std::string& ep, std::vector<std::string> extra) {
    endpoints_.insert(ep);
    std::vector<std::string> args = {batchcast_bin(), "serve", "--endpoint", ep, "--status-interval", "0"};
    args.insert(args.end(), extra.begin(), extra.end());
    servers_.push_back(std::make_unique<ChildProcess>(args));
    return *servers_.back();
  }
  ChildProcess& probe(const std::string& ep, std::vector<std::string> extra) {
    std::vector<std::string> args = {probe_bin(), "--endpoint", ep, "--timeout", "30"};
    args.insert(args.end(), extra.begin(), extra.end());
    probes_.push_back(std::make_unique<ChildProcess>(args));
    return *probes_.back();
  }
  std::vector<std::unique_ptr<ChildProcess>> servers_, probes_;
  std::set<std::string> endpoints_;
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
  for (auto* c : {&c7, &c32, &c100a, &c100b}) ASSERT_EQ(c->wait(60), 0) << c->err();
  ASSERT_EQ(srv.wait(10), 0) << srv.err();

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
  ASSERT_EQ(c.wait(30), 0) << c.err();
  ASSERT_EQ(srv.wait(10), 0) << srv.err();
  auto run = parse_probe(c);
  ASSERT_EQ(run.batches.size(), 4u);  // 2 per epoch; the 50-sample tails dropped
  EXPECT_EQ(run.per_epoch()[0], iota(200));
}

TEST_F(StreamTest, KilledConsumerIsDroppedWithinTwoSecondsAndOthersFinish) {
  auto ep = unique_endpoint("kill");
  auto& srv = server(ep, {"--synthetic", "2000", "--sample-bytes", "32", "--batch-size", "32",
                          "--epochs", "1", "--min-consumers", "2", "--ring", "4"});
  auto& victim = probe(ep, {"--batch-size", "32", "--max-batches", "3"});
  auto& other = probe(ep, {"--batch-size", "32"});
  ASSERT_TRUE(victim.wait_for_lines("P", 1, 20)) << victim.err();
  // The victim holds its slots: the other consumer can get at most a ring ahead, then stalls.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  size_t before = parse_probe(other).batches.size();
  EXPECT_LT(before, 20u) << "the producer ran more than a ring ahead of a paused consumer";
  victim.signal(SIGKILL);
  double killed_at = now_s();
  ASSERT_TRUE(other.wait_for_lines("B", before + 1, 10));
  double stalled = now_s() - killed_at;
  EXPECT_LT(stalled, 2.5) << "the dead consumer held the others for " << stalled << " s";
  ASSERT_EQ(other.wait(30), 0) << other.err();
  EXPECT_EQ(sorted(parse_probe(other).per_epoch()[0]), iota(2000));
  ASSERT_EQ(srv.wait(10), 0) << srv.err();
  EXPECT_NE(srv.err().find("died"), std::string::npos);
}

TEST_F(StreamTest, StoppedConsumerHoldsProducerUnderWaitPolicy) {
  auto ep = unique_endpoint("stopwait");
  auto& srv = server(ep, {"--synthetic", "1024", "--sample-bytes", "32", "--batch-size", "32",
                          "--epochs", "1", "--min-consumers", "2", "--ring", "4"});
  auto& frozen = probe(ep, {"--batch-size", "32", "--sleep-ms", "20"});
  auto& other = probe(ep, {"--batch-size", "32"});
  ASSERT_TRUE(frozen.wait_for_lines("B", 2, 20));
  frozen.signal(SIGSTOP);
  std::this_thread::sleep_for(std::chrono::milliseconds(800));
  size_t held = parse_probe(other).batches.size();
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));
  EXPECT_EQ(parse_probe(other).batches.size(), held) << "wait policy must not leave a consumer behind";
  frozen.signal(SIGCONT);
  ASSERT_EQ(frozen.wait(30), 0) << frozen.err();
  ASSERT_EQ(other.wait(30), 0) << other.err();
  for (auto* c : {&frozen, &other}) {
    auto run = parse_probe(*c);
    EXPECT_EQ(run.skipped, 0u);
    EXPECT_EQ(sorted(run.per_epoch()[0]), iota(1024));
  }
  ASSERT_EQ(srv.wait(10), 0);
}

TEST_F(StreamTest, StoppedConsumerIsLeftBehindUnderSkipPolicyAndReportsWhatItSkipped) {
  auto ep = unique_endpoint("stopskip");
  auto& srv = server(ep, {"--synthetic", "4096", "--sample-bytes", "32", "--batch-size", "32",
                          "--epochs", "1", "--min-consumers", "2", "--ring", "6",
                          "--stall-policy", "skip", "--stall-timeout", "0.5"});
  auto& frozen = probe(ep, {"--batch-size", "32", "--sleep-ms", "5"});
  auto& other = probe(ep, {"--batch-size", "32", "--sleep-ms", "2"});
  ASSERT_TRUE(frozen.wait_for_lines("B", 2, 20));
  frozen.signal(SIGSTOP);
  ASSERT_EQ(other.wait(60), 0) << "skip policy must let the others go on: " << other.err();
  EXPECT_EQ(sorted(parse_probe(other).per_epoch()[0]), iota(4096));
  frozen.signal(SIGCONT);
  ASSERT_EQ(frozen.wait(30), 0) << frozen.err();  // exit 0: no wrong byte was ever seen
  auto run = parse_probe(frozen);
  EXPECT_GT(run.skipped, 0u);
  std::set<int64_t> seen;
  auto epochs = run.per_epoch();
  for (auto i : epochs[0]) EXPECT_TRUE(seen.insert(i).second) << "sample " << i << " twice";
  EXPECT_EQ(seen.size() + run.skipped, 4096u) << "skipped count must account for every sample";
  ASSERT_EQ(srv.wait(10), 0);
}

TEST_F(StreamTest, LateJoinerInsideRetentionReplaysTheWholeEpoch) {
  auto ep = unique_endpoint("latein");
  // 10 chunks and 16 slots: the whole epoch stays retained while the first consumer pauses.
  auto& srv = server(ep, {"--synthetic", "640", "--sample-bytes", "32", "--batch-size", "64",
                          "--epochs", "1", "--ring", "16"});
  auto& first = probe(ep, {"--batch-size", "64", "--max-batches", "3"});
  ASSERT_TRUE(first.wait_for_lines("P", 1, 20));
  auto& late = probe(ep, {"--batch-size", "64"});
  ASSERT_EQ(late.wait(30), 0) << late.err();
  first.signal(SIGKILL);
  auto run = parse_probe(late);
  EXPECT_EQ(run.skipped, 0u);
  auto epochs = run.per_epoch();
  auto seen_by_first = parse_probe(first).per_epoch()[0];
  ASSERT_EQ(seen_by_first.size(), 192u);
  EXPECT_TRUE(std::equal(seen_by_first.begin(), seen_by_first.end(), epochs[0].begin()))
      << "the late joiner must replay the same stream from the epoch's start";
  EXPECT_EQ(sorted(epochs[0]), iota(640));
  ASSERT_EQ(srv.wait(10), 0);
}

TEST_F(StreamTest, LateJoinerOutsideRetentionGetsAPartialEpochOrWaitsForTheNext) {
  for (bool next_epoch : {false, true}) {
    SCOPED_TRACE(next_epoch ? "late_join=next_epoch" : "late_join=replay");
    auto ep = unique_endpoint("lateout");
    auto& srv = server(ep, {"--synthetic", "640", "--sample-bytes", "32", "--batch-size", "64",
                            "--epochs", "2", "--ring", "3"});
    auto& first = probe(ep, {"--batch-size", "64", "--max-batches", "6"});
    ASSERT_TRUE(first.wait_for_lines("P", 1, 20));
    std::vector<std::string> args = {"--batch-size", "64", "--hold-all"};
    if (next_epoch) args.push_back("--next-epoch");
    auto& late = probe(ep, args);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    first.signal(SIGKILL);
    ASSERT_EQ(late.wait(30), 0) << late.err();
    auto run = parse_probe(late);
    auto epochs = run.per_epoch();
    if (next_epoch) {
      EXPECT_EQ(epochs.count(0), 0u);
      EXPECT_EQ(sorted(epochs[1]), iota(640));
    } else {
      ASSERT_EQ(epochs.count(0), 1u);
      EXPECT_LT(epochs[0].size(), 640u);
      EXPECT_EQ(run.skipped, 640u - epochs[0].size()) << "missed samples must be reported";
      EXPECT_EQ(sorted(epochs[1]), iota(640));
    }
    ASSERT_EQ(srv.wait(10), 0);
    servers_.clear();
    probes_.clear();
  }
}

TEST_F(StreamTest, AJoinerAfterTheOnlyConsumerDiedIsNotStalledByChunksNobodyReceived) {
  // The dead consumer leaves a ring of chunks that were never sent to anyone. A new consumer
  // that starts after them (replay from a later epoch start) or passes them (next_epoch) must
  // let the producer reuse them, or the stream stalls forever.
  for (bool next_epoch : {false, true}) {
    SCOPED_TRACE(next_epoch ? "late_join=next_epoch" : "late_join=replay");
    auto ep = unique_endpoint("orphans");
    // 5 chunks per epoch, 4 slots: the dead consumer leaves unsent chunks of epoch 0 behind the
    // retained start of epoch 1, and the joiner keeps its batches (2 zero-copy, then copies).
    auto& srv = server(ep, {"--synthetic", "320", "--sample-bytes", "32", "--batch-size", "64",
                            "--epochs", "3", "--ring", "4"});
    auto& first = probe(ep, {"--batch-size", "64", "--max-batches", "1"});
    ASSERT_TRUE(first.wait_for_lines("P", 1, 20));
    first.signal(SIGKILL);
    ASSERT_EQ(first.wait(5), 128 + SIGKILL);
    std::this_thread::sleep_for(std::chrono::milliseconds(500));  // the server drops it
    std::vector<std::string> args = {"--batch-size", "64", "--hold-all"};
    if (next_epoch) args.push_back("--next-epoch");
    auto& late = probe(ep, args);
    ASSERT_EQ(late.wait(30), 0) << late.err();
    auto epochs = parse_probe(late).per_epoch();
    EXPECT_EQ(sorted(epochs[2]), iota(320)) << "the last epoch must arrive whole";
    ASSERT_EQ(srv.wait(10), 0) << srv.err();
    servers_.clear();
    probes_.clear();
  }
}

TEST_F(StreamTest, KilledServerGivesConsumersAClearErrorAndARestartIsClean) {
  auto ep = unique_endpoint("srvkill");
  auto& srv = server(ep, {"--synthetic", "100000", "--sample-bytes", "32", "--batch-size", "32",
                          "--epochs", "0"});
  auto& c = probe(ep, {"--batch-size", "32", "--sleep-ms", "1"});
  ASSERT_TRUE(c.wait_for_lines("B", 3, 20)) << c.err();
  srv.signal(SIGKILL);
  double killed = now_s();
  EXPECT_EQ(c.wait(10), 4) << "the consumer must fail, not hang";
  EXPECT_LT(now_s() - killed, 3.0);
  EXPECT_NE(c.err().find("is gone"), std::string::npos) << c.err();

  // The SIGKILLed server left its segment; the next server start on this host removes it (this
  // one, or another test's server running in parallel), so the same endpoint serves again.
  auto& again = server(ep, {"--synthetic", "200", "--sample-bytes", "32", "--batch-size", "32"});
  auto& c2 = probe(ep, {"--batch-size", "32"});
  ASSERT_EQ(c2.wait(30), 0) << c2.err();
  EXPECT_EQ(sorted(parse_probe(c2).per_epoch()[0]), iota(200));
  ASSERT_EQ(again.wait(10), 0);
}

TEST_F(StreamTest, SigtermShutsTheServerDownCleanly) {
  auto ep = unique_endpoint("sigterm");
  auto& srv = server(ep, {"--synthetic", "100000", "--sample-bytes", "32", "--epochs", "0"});
  auto& c = probe(ep, {"--batch-size", "64", "--max-batches", "5"});
  ASSERT_TRUE(c.wait_for_lines("P", 1, 20));
  srv.signal(SIGTERM);
  EXPECT_EQ(srv.wait(10), 0) << srv.err();
  EXPECT_FALSE(segment_exists(ep));
  std::string path = ep.substr(6);
  EXPECT_NE(::access(path.c_str(), F_OK), 0) << "ipc socket file left behind";
}

}  // namespace
}  // namespace batchcast::testing
