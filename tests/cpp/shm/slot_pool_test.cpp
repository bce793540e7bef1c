// SlotPool, SharedSegment and SlotWrites: real POSIX shared memory, its mode, consumers' mappings
// (shared and read-only while they only read; a slot written into becomes the writer's own
// copy-on-write copy until discarded, also with several threads writing at once), the fatal mode
// of a page-locked pool (and the message a write prints), geometry checks, and removal of a dead
// server's segment.
#include "shm/slot_pool.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <thread>
#include <vector>

#include "common/error.h"

namespace batchcast {
namespace {

std::string test_name(const char* tag) {
  return segment_name_for(std::string("test://") + tag + std::to_string(::getpid()));
}

bool exists(const std::string& name) { return ::access(("/dev/shm/" + name).c_str(), F_OK) == 0; }

// The permissions of the mapping holding `p`, as /proc/self/maps says them: "r--s" (shared,
// read-only) or "rw-p" (private: copy-on-write).
std::string mapping_of(const void* p) {
  std::ifstream maps("/proc/self/maps");
  const auto at = reinterpret_cast<uintptr_t>(p);
  for (std::string line; std::getline(maps, line);) {
    unsigned long begin = 0, end = 0;
    char perms[5] = {};
    if (std::sscanf(line.c_str(), "%lx-%lx %4s", &begin, &end, perms) == 3 && at >= begin &&
        at < end)
      return perms;
  }
  return "unmapped";
}

// How many pages of [p, p + bytes) have a page-table entry in this process (/proc/self/pagemap's
// "present" bit): a range re-mapped, or dropped with madvise, has none until it is read again.
size_t pages_present(const uint8_t* p, size_t bytes) {
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const int fd = ::open("/proc/self/pagemap", O_RDONLY);
  EXPECT_GE(fd, 0);
  size_t present = 0;
  for (auto a = reinterpret_cast<uintptr_t>(p); a < reinterpret_cast<uintptr_t>(p) + bytes;
       a += page) {
    uint64_t entry = 0;
    EXPECT_EQ(::pread(fd, &entry, sizeof(entry), static_cast<off_t>(a / page * sizeof(entry))),
              static_cast<ssize_t>(sizeof(entry)));
    present += entry >> 63;
  }
  ::close(fd);
  return present;
}

uint64_t sum(const uint8_t* p, size_t bytes) {
  uint64_t s = 0;
  for (size_t i = 0; i < bytes; ++i) s += p[i];
  return s;
}

TEST(SlotPool, CreatedOwnerOnlyAndRemovedByItsOwner) {
  auto name = test_name("mode");
  {
    auto pool = SlotPool::create(name, 4, 1000);
    struct stat st {};
    ASSERT_EQ(::stat(("/dev/shm/" + name).c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    EXPECT_EQ(pool.slot_bytes() % ::sysconf(_SC_PAGESIZE), 0) << "slots are page aligned";
    EXPECT_EQ(pool.slot_seq(3), SlotPool::kNoChunk);
  }
  EXPECT_FALSE(exists(name)) << "the owner unlinks its segment";
}

TEST(SlotPool, ConsumersSeeTheProducersBytesAndWriteOnlyTheirOwnCopy) {
  auto name = test_name("view");
  auto pool = SlotPool::create(name, 2, 3 * 4096);
  std::memset(pool.slot_data(1), 7, pool.slot_bytes());
  pool.set_slot_seq(1, 9);
  auto a = SlotPool::attach(name, 2, pool.slot_bytes(), pool.slots_offset());
  auto b = SlotPool::attach(name, 2, pool.slot_bytes(), pool.slots_offset());
  EXPECT_EQ(a.slot_data(1)[7], 7);
  EXPECT_EQ(a.slot_seq(1), 9u);
  // A writes into the middle page of slot 1: only A sees it.
  a.slot_data(1)[4096 + 5] = 99;
  EXPECT_EQ(a.slot_data(1)[4096 + 5], 99);
  EXPECT_EQ(b.slot_data(1)[4096 + 5], 7) << "another consumer saw a write";
  EXPECT_EQ(pool.slot_data(1)[4096 + 5], 7) << "the server saw a consumer's write";
  // The server refills the slot: pages A never wrote follow it, the page A wrote is A's own...
  std::memset(pool.slot_data(1), 8, pool.slot_bytes());
  pool.set_slot_seq(1, 10);
  EXPECT_EQ(a.slot_seq(1), 10u);
  EXPECT_EQ(a.slot_data(1)[0], 8);
  EXPECT_EQ(a.slot_data(1)[2 * 4096], 8);
  EXPECT_EQ(a.slot_data(1)[4096 + 5], 99);
  EXPECT_EQ(b.slot_data(1)[4096 + 5], 8);
  // ...until A discards its writes: then A reads the server's bytes, every one of them.
  a.discard_writes(1);
  for (uint64_t i = 0; i < pool.slot_bytes(); ++i) ASSERT_EQ(a.slot_data(1)[i], 8) << i;
  // Discarding is per slot: a write into slot 0 survives discarding slot 1.
  a.slot_data(0)[3] = 5;
  a.discard_writes(1);
  EXPECT_EQ(a.slot_data(0)[3], 5);
  a.discard_writes(0);
  EXPECT_EQ(a.slot_data(0)[3], 0);
}

// The common case costs nothing: a consumer that only reads keeps the server's pages mapped
// shared, chunk after chunk, and discarding (at every release) re-maps nothing.
TEST(SlotPool, AConsumerThatOnlyReadsKeepsTheServersPagesMapped) {
  auto name = test_name("reader");
  auto pool = SlotPool::create(name, 3, 4 * 4096);
  const size_t bytes = pool.slot_bytes();
  auto a = SlotPool::attach(name, 3, bytes, pool.slots_offset());
  for (int round = 1; round <= 3; ++round) {
    for (uint32_t slot = 0; slot < 3; ++slot) std::memset(pool.slot_data(slot), round, bytes);
    for (uint32_t slot = 0; slot < 3; ++slot) {
      ASSERT_EQ(sum(a.slot_data(slot), bytes), round * bytes) << "slot " << slot;
      a.discard_writes(slot);
      EXPECT_EQ(mapping_of(a.slot_data(slot)), "r--s");
      EXPECT_EQ(pages_present(a.slot_data(slot), bytes), bytes / ::sysconf(_SC_PAGESIZE))
          << "discarding a slot never written dropped its pages (slot " << slot << ")";
    }
  }
}

// A write makes only the written slot the writer's copy; once discarded, the slot is the server's
// again (its next chunk reads as written), and the next write into it is private again.
TEST(SlotPool, WriteDiscardRefillWriteAgain) {
  auto name = test_name("rewrite");
  auto pool = SlotPool::create(name, 3, 2 * 4096);
  const size_t bytes = pool.slot_bytes();
  for (uint32_t slot = 0; slot < 3; ++slot) std::memset(pool.slot_data(slot), 1, bytes);
  auto a = SlotPool::attach(name, 3, bytes, pool.slots_offset());
  auto b = SlotPool::attach(name, 3, bytes, pool.slots_offset());
  for (int round = 2; round <= 4; ++round) {
    a.slot_data(1)[bytes - 1] = 99;
    EXPECT_EQ(a.slot_data(1)[bytes - 1], 99);
    EXPECT_EQ(mapping_of(a.slot_data(1)), "rw-p") << "round " << round;
    EXPECT_EQ(mapping_of(a.slot_data(0)), "r--s") << "a neighbour slot was re-mapped";
    EXPECT_EQ(mapping_of(a.slot_data(2)), "r--s") << "a neighbour slot was re-mapped";
    EXPECT_EQ(b.slot_data(1)[bytes - 1], round - 1) << "another consumer saw a write";
    EXPECT_EQ(pool.slot_data(1)[bytes - 1], round - 1) << "the server saw a consumer's write";
    a.discard_writes(1);
    EXPECT_EQ(mapping_of(a.slot_data(1)), "r--s");
    std::memset(pool.slot_data(1), round, bytes);  // the server refills the released slot
    ASSERT_EQ(sum(a.slot_data(1), bytes), round * bytes) << "round " << round;
  }
}

// Threads of one consumer (torch's intra-op pool) write into one slot at once: every write
// survives (one thread re-maps the slot, the others wait for it instead of re-mapping again).
TEST(SlotPool, ConcurrentWritersIntoOneSlotKeepEveryWrite) {
  auto name = test_name("threads");
  constexpr int kThreads = 4;
  auto pool = SlotPool::create(name, 1, kThreads * 4096);
  const size_t bytes = pool.slot_bytes();
  auto a = SlotPool::attach(name, 1, bytes, pool.slots_offset());
  for (int round = 0; round < 50; ++round) {
    std::vector<std::thread> writers;
    for (int t = 0; t < kThreads; ++t)
      writers.emplace_back([&, t] {
        uint8_t* slot = a.slot_data(0);
        slot[t] = static_cast<uint8_t>(t + 1);  // the same first page
        for (size_t i = std::max<size_t>(t * 4096, kThreads); i < (t + 1) * 4096u; ++i)
          slot[i] = 7;  // its own page
      });
    for (auto& w : writers) w.join();
    for (int t = 0; t < kThreads; ++t) ASSERT_EQ(a.slot_data(0)[t], t + 1) << "round " << round;
    ASSERT_EQ(sum(a.slot_data(0) + kThreads, bytes - kThreads), 7 * (bytes - kThreads))
        << "round " << round;
    EXPECT_EQ(sum(pool.slot_data(0), bytes), 0u) << "the server saw a consumer's write";
    a.discard_writes(0);
    ASSERT_EQ(sum(a.slot_data(0), bytes), 0u) << "round " << round;
  }
}

TEST(SlotPool, ReadOnlyMappingNamesTheFixOnWrite) {
  // The mapping a consumer page-locks for DMA (pin_memory) is never re-mapped: the write dies,
  // after naming the segment and the fix.
  auto name = test_name("ro");
  auto pool = SlotPool::create(name, 2, 4096);
  pool.slot_data(1)[7] = 42;
  auto view = SlotPool::attach(name, 2, pool.slot_bytes(), pool.slots_offset(), OnWrite::kFail);
  EXPECT_EQ(view.slot_data(1)[7], 42);
  EXPECT_DEATH(view.slot_data(0)[0] = 1, "read-only shared memory /dev/shm/" + name + ".*clone");
}

TEST(SlotPool, AttachChecksGeometryAndNamesTheSegment) {
  auto name = test_name("geom");
  auto pool = SlotPool::create(name, 2, 4096);
  try {
    SlotPool::attach(name, 3, pool.slot_bytes(), pool.slots_offset());
    FAIL() << "attached with the wrong slot count";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(name), std::string::npos);
  }
  try {
    SlotPool::attach(test_name("missing"), 2, 4096, 4096);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not exist"), std::string::npos);
  }
  EXPECT_THROW(SlotPool::create(name, 2, 4096), Error) << "a live owner's name is taken";
}

TEST(SlotPool, StaleSegmentOfADeadOwnerIsRemoved) {
  auto name = test_name("stale");
  pid_t child = ::fork();
  if (child == 0) {
    auto pool = SlotPool::create(name, 2, 4096);
    ::_exit(exists(name) ? 0 : 1);  // dies without running destructors, like a SIGKILLed server
  }
  int status;
  ::waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the owner made its segment";
  auto live = SlotPool::create(test_name("live"), 2, 4096);
  // Any batchcast process of this user running in parallel (a server starting, a consumer
  // attaching or leaving) may have removed it already: either way it is gone now.
  remove_stale_segments();
  EXPECT_FALSE(exists(name));
  EXPECT_TRUE(exists(live.segment_name())) << "a live owner's segment is kept";
}

// A slot whose memory is given back takes no /dev/shm any more; the others keep theirs.
TEST(SlotPool, AReleasedSlotsMemoryLeavesDevShm) {
  auto name = test_name("release");
  auto pool = SlotPool::create(name, 4, 8 * 4096);
  const auto blocks = [&] {
    struct stat st {};
    EXPECT_EQ(::stat(("/dev/shm/" + name).c_str(), &st), 0);
    return static_cast<uint64_t>(st.st_blocks) * 512;
  };
  std::memset(pool.slot_data(0), 1, 4 * pool.slot_bytes());
  const uint64_t before = blocks();
  pool.release_slot_memory(2);
  EXPECT_EQ(before - blocks(), pool.slot_bytes());
  EXPECT_EQ(sum(pool.slot_data(1), pool.slot_bytes()), pool.slot_bytes()) << "a neighbour's bytes";
  EXPECT_EQ(sum(pool.slot_data(3), pool.slot_bytes()), pool.slot_bytes()) << "a neighbour's bytes";
}

}  // namespace
}  // namespace batchcast
