// SlotRing: the slot lifecycle, reuse order and the holder checks that stop forged releases.
#include "server/stream/slot_ring.h"

#include <gtest/gtest.h>

namespace batchcast {
namespace {

// The server's rule for chunks nobody received is tested in StreamHost; here: delivered only.
const auto kDeliveredOnly = [](uint64_t, bool delivered) { return delivered; };

TEST(SlotRing, FreeSlotsFirstThenOldestReleasedChunk) {
  SlotRing ring(3);
  for (uint64_t seq = 0; seq < 3; ++seq) {
    auto s = ring.begin_fill(seq, kDeliveredOnly);
    ASSERT_TRUE(s);
    EXPECT_EQ(ring.slot(*s).state, SlotState::kFilling);
    ring.finish_fill(*s);
    ring.add_holder(*s, 1);
  }
  EXPECT_FALSE(ring.begin_fill(3, kDeliveredOnly)) << "every slot is held";
  EXPECT_EQ(ring.occupied(), 3u);
  auto s1 = *ring.find_published(1), s0 = *ring.find_published(0);
  EXPECT_TRUE(ring.release(s1, 1, 1));
  EXPECT_TRUE(ring.release(s0, 0, 1));
  auto s = ring.begin_fill(3, kDeliveredOnly);
  ASSERT_TRUE(s);
  EXPECT_EQ(*s, s0) << "the oldest chunk is reused first";
  EXPECT_FALSE(ring.find_published(0)) << "chunk 0 is no longer retained";
  EXPECT_TRUE(ring.find_published(1)) << "chunk 1 is still retained for late joiners";
  EXPECT_EQ(ring.oldest_published_from(0), 1u);
}

TEST(SlotRing, UndeliveredOrRefusedChunksAreNeverReused) {
  SlotRing ring(1);
  auto s = *ring.begin_fill(0, kDeliveredOnly);
  ring.finish_fill(s);
  EXPECT_FALSE(ring.begin_fill(1, kDeliveredOnly))
      << "a chunk nobody received must not be discarded";
  ring.add_holder(s, 5);
  ASSERT_TRUE(ring.release(s, 0, 5));
  EXPECT_FALSE(ring.begin_fill(1, [](uint64_t, bool) { return false; })) << "server's rule says no";
  EXPECT_TRUE(ring.begin_fill(1, kDeliveredOnly));
}

TEST(SlotRing, ForgedAndRepeatedReleasesAreRefused) {
  SlotRing ring(2);
  auto s = *ring.begin_fill(0, kDeliveredOnly);
  ring.finish_fill(s);
  ring.add_holder(s, 1);
  ring.add_holder(s, 2);
  EXPECT_FALSE(ring.release(s, 0, 3)) << "consumer 3 never received it";
  EXPECT_FALSE(ring.release(s, 7, 1)) << "wrong chunk for that slot";
  EXPECT_FALSE(ring.release(99, 0, 1)) << "slot outside the ring";
  EXPECT_TRUE(ring.release(s, 0, 1));
  EXPECT_FALSE(ring.release(s, 0, 1)) << "released twice";
  EXPECT_EQ(ring.slot(s).holders, std::vector<uint64_t>{2}) << "consumer 2 still holds it";
  EXPECT_EQ(ring.held_by(2), 1u);
  EXPECT_EQ(ring.release_all(2), 1u);
  EXPECT_EQ(ring.held_by(2), 0u);
}

}  // namespace
}  // namespace batchcast
