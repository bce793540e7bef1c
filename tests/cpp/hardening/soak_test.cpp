// Soak: one `batchcast serve --synthetic` server streams epochs while probe consumers (real
// processes that check every byte against the sample index) join, leave, are SIGKILLed and
// SIGSTOPped/SIGCONTed at random. Churn is where the slot lifecycle breaks: a release lost with a
// dead consumer, a slot reused while a frozen one still holds it, a late joiner replaying a chunk
// that was already overwritten. At the end: no consumer saw a wrong byte or a duplicated sample,
// every epoch a consumer saw end was whole, the server's RSS and fd count stayed flat, the
// server exits 0 on SIGTERM leaving no /dev/shm segment, no ipc socket file, no zombie.
//
// Knobs (environment): BATCHCAST_SOAK_SECONDS (default 60), BATCHCAST_SOAK_SEED (default: random;
// the seed is printed first, rerun with it to replay the same schedule of actions).
// ctest label: soak.
#include <gtest/gtest.h>

#include <cstdlib>
#include <iostream>
#include <memory>
#include <random>

#include "shm/slot_pool.h"
#include "tests/cpp/hardening/hardening.h"

namespace batchcast::testing {
namespace {

struct Probe {
  std::unique_ptr<ChildProcess> proc;
  std::string args;  // for failure messages
  uint64_t batch = 0;
  bool drop_last = false;
  bool killed = false;
  bool stopped = false;
  double cont_at = 0;
};

double env_double(const char* name, double fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atof(v) : fallback;
}

TEST(Soak, ChurningConsumersNeverSeeWrongDataAndNothingLeaks) {
  const double seconds = env_double("BATCHCAST_SOAK_SECONDS", 60);
  const uint64_t seed = std::getenv("BATCHCAST_SOAK_SEED")
                            ? std::strtoull(std::getenv("BATCHCAST_SOAK_SEED"), nullptr, 10)
                            : std::random_device{}();
  std::cout << "soak: seed=" << seed << " seconds=" << seconds
            << " (replay: BATCHCAST_SOAK_SEED=" << seed << ")" << std::endl;
  RecordProperty("seed", std::to_string(seed));
  std::mt19937_64 rng(seed);
  auto uniform = [&](double a, double b) {
    return std::uniform_real_distribution<double>(a, b)(rng);
  };
  auto pick = [&](int a, int b) { return std::uniform_int_distribution<int>(a, b)(rng); };

  const int64_t n = 3000;
  const auto ep = unique_endpoint("soak");
  ChildProcess server({batchcast_bin(), "serve", "--endpoint", ep, "--status-interval", "1",
                       "--synthetic", std::to_string(n), "--sample-bytes", "64", "--batch-size",
                       "32", "--epochs", "0", "--ring", "8", "--workers", "2"});
  ASSERT_TRUE(server.wait_for_err("serving on", 20)) << server.err();
  const std::string segment = segment_name_for(ep);
  ASSERT_TRUE(file_exists("/dev/shm/" + segment)) << "pool segment " << segment << " not found";

  std::vector<Probe> live;
  struct Counts {
    int spawned = 0, killed = 0, stopped = 0, left = 0, finished = 0, whole_epochs = 0;
  } counts;
  std::vector<std::string> failures;
  auto check_done = [&](Probe& p) {
    int rc = p.proc->wait(0.01);
    auto run = parse_probe(*p.proc);
    if (!p.killed && rc != 0)
      failures.push_back("probe " + p.args + " exited " + std::to_string(rc) + ": " +
                         p.proc->err());
    if (rc == 3) failures.push_back("probe " + p.args + " saw a wrong byte: " + p.proc->err());
    auto why = check_epochs(run, n, p.drop_last, p.batch);
    if (!why.empty()) failures.push_back("probe " + p.args + ": " + why);
    for (auto e : run.ended_epochs) counts.whole_epochs += run.per_epoch().count(e) > 0;
    if (!p.killed) ++counts.finished;
  };
  auto spawn = [&] {
    Probe p;
    p.batch = std::vector<uint64_t>{1, 7, 32, 33, 64, 100, 250}[pick(0, 6)];
    std::vector<std::string> args = {probe_bin(),
                                     "--endpoint",
                                     ep,
                                     "--timeout",
                                     "30",
                                     "--batch-size",
                                     std::to_string(p.batch),
                                     "--epochs",
                                     std::to_string(pick(1, 3)),
                                     "--max-held",
                                     std::to_string(pick(1, 3))};
    if (p.batch >= 32) {  // small batches get no sleeps: an epoch must stay within seconds
      args.insert(args.end(), {"--sleep-ms", std::to_string(pick(0, 4))});
      if (pick(0, 4) == 0)
        args.insert(args.end(), {"--verify-delay-ms", std::to_string(pick(1, 3))});
    }
    if (pick(0, 4) == 0) args.push_back("--next-epoch");
    if (pick(0, 6) == 0) {
      args.push_back("--drop-last");
      p.drop_last = true;
    }
    if (pick(0, 6) == 0) {
      args.insert(args.end(), {"--leave-after", std::to_string(pick(1, 60))});
      ++counts.left;
    }
    for (size_t i = 1; i < args.size(); ++i) p.args += args[i] + " ";
    p.proc = std::make_unique<ChildProcess>(args);
    live.push_back(std::move(p));
    ++counts.spawned;
  };

  const double start = now_s(), early_at = start + std::min(10.0, 0.2 * seconds);
  long rss_early = -1, rss_late = -1, rss_max = 0;
  int fds_early = -1;
  while (now_s() - start < seconds) {
    ASSERT_TRUE(server.running()) << "server died (seed " << seed << "): " << server.err();
    double now = now_s();
    for (auto& p : live)
      if (p.stopped && now >= p.cont_at) {
        p.proc->signal(SIGCONT);
        p.stopped = false;
      }
    for (size_t i = 0; i < live.size();) {
      if (!live[i].proc->running()) {
        check_done(live[i]);
        live.erase(live.begin() + i);
      } else {
        ++i;
      }
    }
    int action = pick(0, 99);
    if (action < 45 && live.size() < 6) {
      spawn();
    } else if (action < 60 && !live.empty()) {
      auto& p = live[pick(0, static_cast<int>(live.size()) - 1)];
      p.proc->signal(SIGKILL);  // a stopped one too: the server must notice either way
      p.killed = true;
      ++counts.killed;
    } else if (action < 75 && !live.empty()) {
      auto& p = live[pick(0, static_cast<int>(live.size()) - 1)];
      if (!p.stopped && !p.killed) {
        p.proc->signal(SIGSTOP);
        p.stopped = true;
        p.cont_at = now + uniform(0.1, 1.5);
        ++counts.stopped;
      }
    }
    long rss = proc_status_kb(server.pid(), "VmRSS");
    rss_max = std::max(rss_max, rss);
    if (rss_early < 0 && now >= early_at) {
      rss_early = rss;
      fds_early = open_fds(server.pid());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(pick(50, 400)));
  }

  // Drain: no more churn; every live probe must finish its epochs.
  for (auto& p : live) {
    if (p.stopped) p.proc->signal(SIGCONT);
    p.stopped = false;
  }
  for (auto& p : live) {
    if (p.proc->wait(60) < 0) {
      failures.push_back("probe " + p.args + " did not finish within 60 s after the churn");
      p.killed = true;
    }
    check_done(p);
  }
  rss_late = proc_status_kb(server.pid(), "VmRSS");
  int fds_late = open_fds(server.pid());
  auto zombies = zombies_of({::getpid(), server.pid()});
  live.clear();

  server.signal(SIGTERM);
  EXPECT_EQ(server.wait(15), 0) << "server did not shut down cleanly: " << server.err();
  std::cout << "soak: " << counts.spawned << " consumers spawned, " << counts.finished
            << " finished, " << counts.killed << " SIGKILLed, " << counts.stopped << " SIGSTOPped, "
            << counts.left << " left early; " << counts.whole_epochs
            << " consumer-epochs checked whole; server RSS " << rss_early << " kB early, "
            << rss_late << " kB late (max " << rss_max << "), fds " << fds_early << " -> "
            << fds_late << std::endl;

  for (const auto& f : failures) ADD_FAILURE() << f << " (seed " << seed << ")";
  if (!failures.empty()) {
    std::string keep = "/tmp/batchcast-soak-" + std::to_string(seed) + ".server.log";
    std::ofstream(keep) << server.err();
    std::cout << "server log kept in " << keep << std::endl;
  }
  EXPECT_GT(counts.whole_epochs, 0) << "the soak checked no whole epoch: it proves nothing";
  EXPECT_GT(counts.killed, 0);
  ASSERT_GT(rss_early, 0);
  EXPECT_LT(rss_late, rss_early * 3 / 2 + 32 * 1024)
      << "server RSS grew from " << rss_early << " kB to " << rss_late << " kB (seed " << seed
      << ")";
  EXPECT_LE(fds_late, fds_early + 16) << "server fds grew (seed " << seed << ")";
  EXPECT_TRUE(zombies.empty()) << zombies.size() << " zombie process(es), e.g. pid "
                               << zombies.front();
  EXPECT_FALSE(file_exists("/dev/shm/" + segment)) << "leaked segment " << segment;
  EXPECT_FALSE(file_exists(ipc_path(ep))) << "leaked ipc socket file " << ipc_path(ep);
}

}  // namespace
}  // namespace batchcast::testing
