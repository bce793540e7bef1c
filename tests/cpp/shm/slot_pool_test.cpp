// SlotPool and SharedSegment: real POSIX shared memory, its mode, copy-on-write mappings (a
// consumer's writes stay its own until discarded), read-only mapping (and the message a write
// into it prints), geometry checks, and removal of a dead server's segment.
#include "shm/slot_pool.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

#include "common/error.h"

namespace batchcast {
namespace {

std::string test_name(const char* tag) {
  return segment_name_for(std::string("test://") + tag + std::to_string(::getpid()));
}

bool exists(const std::string& name) { return ::access(("/dev/shm/" + name).c_str(), F_OK) == 0; }

TEST(SlotPool, CreatedOwnerOnlyAndRemovedByItsOwner) {
  auto name = test_name("mode");
  {
    auto pool = SlotPool::create(name, 4, 1000);
    struct stat st {};
    ASSERT_EQ(::stat(("/dev/shm/" + name).c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    EXPECT_EQ(pool.slot_bytes() % 4096, 0u) << "slots are page aligned";
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

TEST(SlotPool, ReadOnlyMappingNamesTheFixOnWrite) {
  // The mapping a consumer page-locks for DMA (pin_memory) is read-only: the write dies, after
  // naming the segment and the fix.
  auto name = test_name("ro");
  auto pool = SlotPool::create(name, 2, 4096);
  pool.slot_data(1)[7] = 42;
  auto view = SlotPool::attach(name, 2, pool.slot_bytes(), pool.slots_offset(),
                               SharedSegment::Access::kReadOnly);
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
    ::_exit(0);  // dies without running destructors, like a SIGKILLed server
  }
  int status;
  ::waitpid(child, &status, 0);
  ASSERT_TRUE(exists(name));
  auto live = SlotPool::create(test_name("live"), 2, 4096);
  remove_stale_segments();  // a server starting in parallel may have removed it already
  EXPECT_FALSE(exists(name));
  EXPECT_TRUE(exists(live.segment_name())) << "a live owner's segment is kept";
}

}  // namespace
}  // namespace batchcast
