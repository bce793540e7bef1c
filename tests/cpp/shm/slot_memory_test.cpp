// SlotMemory: the server's create + describe and the consumer's attach meet on one real pool.
#include "shm/slot_memory.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include "common/error.h"

namespace batchcast {
namespace {

std::string test_name(const char* tag) {
  return segment_name_for(std::string("test://slot_memory/") + tag + std::to_string(::getpid()));
}

TEST(SlotMemory, AConsumerAttachedFromTheWelcomeSeesTheServersSlots) {
  auto server = SlotMemory::create(test_name("host"), 3, 5000, {});
  EXPECT_EQ(server.device(), protocol::DeviceKind::kCpu);
  EXPECT_EQ(server.cuda_device(), -1);
  server.slot_data(2)[11] = 77;
  server.pool().set_slot_seq(2, 5);

  protocol::Welcome w;
  server.describe(w);
  EXPECT_EQ(w.slot_count, 3u);
  EXPECT_EQ(w.slot_bytes, server.pool().slot_bytes());
  auto consumer = SlotMemory::attach(w);
  EXPECT_EQ(consumer.device(), protocol::DeviceKind::kCpu);
  EXPECT_EQ(consumer.slot_data(2)[11], 77);
  EXPECT_EQ(consumer.pool().slot_seq(2), 5u);
}

// pin_memory: a host pool's mapping is page-locked in place where CUDA allows it, and reads the
// same either way; where it cannot be (no CUDA build, no GPU), the consumer is told why.
TEST(SlotMemory, PinningAHostPoolEitherSucceedsOrSaysWhy) {
  auto server = SlotMemory::create(test_name("pin"), 2, 8192, {});
  server.slot_data(1)[100] = 42;
  protocol::Welcome w;
  server.describe(w);
  auto consumer = SlotMemory::attach(w, /*pin_host=*/true, /*pin_device=*/-1);
  EXPECT_EQ(consumer.slot_data(1)[100], 42);
  EXPECT_NE(consumer.host_pinned(), !consumer.pin_failure().empty()) << consumer.pin_failure();
#ifndef BATCHCAST_HAVE_CUDA
  EXPECT_NE(consumer.pin_failure().find("no CUDA support"), std::string::npos);
#else
  if (cuda_device_count() == 0) {
    EXPECT_NE(consumer.pin_failure().find("no CUDA device"), std::string::npos);
  }
#endif
  auto plain = SlotMemory::attach(w);
  EXPECT_FALSE(plain.host_pinned());
  EXPECT_TRUE(plain.pin_failure().empty());
}

// Consumers find slot k of a GPU arena at k * Welcome::slot_bytes, the pool's rounded size: the
// server's arena must use the same stride even when the size asked for is not aligned.
TEST(SlotMemory, AGpuArenaUsesTheSlotSizeTheWelcomeAnnounces) {
#ifndef BATCHCAST_HAVE_CUDA
  GTEST_SKIP() << "this build has no CUDA support";
#else
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: this test needs a GPU";
  auto server = SlotMemory::create(test_name("stride"), 3, 5000, {0});
  protocol::Welcome w;
  server.describe(w);
  EXPECT_GT(w.slot_bytes, 5000u) << "the pool rounds slot sizes up";
  EXPECT_EQ(static_cast<uint64_t>(server.slot_data(2) - server.slot_data(0)), 2 * w.slot_bytes);
#endif
}

TEST(SlotMemory, ABuildWithoutCudaRefusesGpuPoolsByName) {
#ifdef BATCHCAST_HAVE_CUDA
  GTEST_SKIP() << "this build has CUDA support";
#else
  auto name = test_name("gpu");
  try {
    SlotMemory::create(name, 2, 4096, {0});
    FAIL() << "created a GPU pool without CUDA";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no CUDA support"), std::string::npos) << e.what();
  }
  auto host = SlotMemory::create(name, 2, 4096, {});
  protocol::Welcome w;
  host.describe(w);
  w.device = protocol::DeviceKind::kCuda;  // what a GPU server would announce
  try {
    SlotMemory::attach(w);
    FAIL() << "attached to a GPU pool without CUDA";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no CUDA support"), std::string::npos) << e.what();
  }
#endif
}

}  // namespace
}  // namespace batchcast
