// /proc readers: parsing, the descendant walk, system CPU and memory.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>

#include "metrics/proc_stats.h"

namespace batchcast::metrics {
namespace {

TEST(ProcStats, ParsesCommWithSpacesAndParentheses) {
  // pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime
  // cutime cstime prio nice threads itreal starttime vsize rss ...
  const char* text =
      "4242 (we) ird) name) S 17 4242 4242 0 -1 4194560 100 0 0 0 250 50 30 20 20 0 3 0 "
      "987654 123456789 1000 18446744073709551615 0 0";
  auto st = parse_proc_stat(text, std::strlen(text));
  ASSERT_TRUE(st);
  const double hz = static_cast<double>(sysconf(_SC_CLK_TCK));
  EXPECT_EQ(st->pid, 4242);
  EXPECT_EQ(st->ppid, 17);
  EXPECT_EQ(st->state, 'S');
  EXPECT_DOUBLE_EQ(st->utime_s, 250 / hz);
  EXPECT_DOUBLE_EQ(st->stime_s, 50 / hz);
  EXPECT_DOUBLE_EQ(st->cpu_s(), 350 / hz);
  EXPECT_EQ(st->starttime, 987654u);
  EXPECT_EQ(st->rss_bytes, 1000 * sysconf(_SC_PAGESIZE));
}

TEST(ProcStats, RejectsTruncatedText) {
  const char* text = "12 (x) S 1 2 3";
  EXPECT_FALSE(parse_proc_stat(text, std::strlen(text)));
  EXPECT_FALSE(parse_proc_stat("", 0));
}

TEST(ProcStats, ReadsOwnProcess) {
  auto st = read_proc_stat(getpid());
  ASSERT_TRUE(st);
  EXPECT_EQ(st->pid, getpid());
  EXPECT_EQ(st->ppid, getppid());
  EXPECT_GT(st->rss_bytes, 0);
  EXPECT_FALSE(read_proc_stat(0x7ffffff0));
}

ProcStat fake(pid_t pid, pid_t ppid, double cpu, int64_t rss) {
  ProcStat s;
  s.pid = pid;
  s.ppid = ppid;
  s.utime_s = cpu;
  s.rss_bytes = rss;
  return s;
}

TEST(ProcStats, TreeSumsDescendantsAndStopsAtWatchedOnes) {
  // 10 -> 11 -> 12, 10 -> 13 (watched itself) -> 14; 20 unrelated.
  ProcessTable t({fake(10, 1, 1.0, 100), fake(11, 10, 2.0, 10), fake(12, 11, 4.0, 1),
                  fake(13, 10, 8.0, 1000), fake(14, 13, 16.0, 1000), fake(20, 1, 32.0, 5)});
  auto u = t.tree_usage(10, {10, 13});
  ASSERT_TRUE(u);
  EXPECT_DOUBLE_EQ(u->cpu_s, 7.0);
  EXPECT_EQ(u->rss_bytes, 100);
  EXPECT_EQ(u->tree_rss_bytes, 111);
  EXPECT_EQ(u->procs, 3);
  auto v = t.tree_usage(13, {10, 13});
  ASSERT_TRUE(v);
  EXPECT_DOUBLE_EQ(v->cpu_s, 24.0);
  EXPECT_FALSE(t.tree_usage(99, {}));
}

TEST(ProcStats, ScanFindsThisProcess) {
  auto t = ProcessTable::scan();
  EXPECT_GT(t.size(), 1u);
  EXPECT_TRUE(t.tree_usage(getpid(), {}));
}

TEST(ProcStats, SystemCpuAndMemory) {
  auto cpu = read_system_cpu();
  ASSERT_TRUE(cpu);
  EXPECT_GT(cpu->total, 0u);
  EXPECT_LE(cpu->busy, cpu->total);
  auto mem = read_system_memory();
  ASSERT_TRUE(mem);
  EXPECT_GT(mem->total_mb, 0);
  EXPECT_GT(mem->used_mb, 0);
  EXPECT_LE(mem->used_mb, mem->total_mb);
}

}  // namespace
}  // namespace batchcast::metrics
