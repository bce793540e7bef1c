// A ring that shrinks (StreamState::shrink_ring, docs/stream.md): what a stream with a memory
// budget does when a view is added, against StreamState alone (stream_state_fixture.h): no chunk
// is filled in a retired slot, a retired slot is handed over once its chunk may go and never
// while it is held, and the ring's rules count the usable slots.
#include <gtest/gtest.h>

#include <algorithm>

#include "tests/cpp/server/stream_state_fixture.h"

namespace batchcast {
namespace {

using namespace batchcast::testing;

TEST(StreamStateBudget, NoChunkIsFilledInARetiredSlot) {
  Stream s(rules(16));
  s.join("a", 100);
  s.produce(16);  // every slot holds a chunk
  s.tick();
  s.consume("a");
  s.state.shrink_ring(8);
  EXPECT_EQ(s.state.usable_slots(), 8u);
  EXPECT_EQ(s.state.stats().ring_slots, 8u);
  for (int i = 0; i < 40; ++i) {
    auto f = s.fill();
    ASSERT_TRUE(f);
    EXPECT_LT(f->slot, 8u) << "chunk " << f->seq;
    s.publish(*f, 100);
    s.tick();
    s.consume("a");
  }
  s.state.shrink_ring(12);  // never grows
  EXPECT_EQ(s.state.usable_slots(), 8u);
}

TEST(StreamStateBudget, ARetiredSlotIsHandedOverOnceItsChunkMayGoNeverWhileHeld) {
  Stream s(rules(16));
  s.join("a", 100);
  s.produce(12);  // slots 0..11
  s.tick();
  auto held = s.take<ChunkDescriptor>("a");
  ASSERT_EQ(held.size(), 12u);
  s.state.shrink_ring(8);
  // Slots 12..15 never held a chunk: theirs at once; 8..11 are held by "a".
  EXPECT_EQ(s.state.take_retired_slots(s.now), (std::vector<uint32_t>{12, 13, 14, 15}));
  EXPECT_TRUE(s.state.take_retired_slots(s.now).empty());
  for (const auto& d : held)
    if (d.slot != 9) s.release("a", d);
  EXPECT_EQ(s.state.take_retired_slots(s.now), (std::vector<uint32_t>{8, 10, 11}));
  for (const auto& d : held)
    if (d.slot == 9) s.release("a", d);
  EXPECT_EQ(s.state.take_retired_slots(s.now), (std::vector<uint32_t>{9}));
  EXPECT_TRUE(s.state.take_retired_slots(s.now).empty()) << "each slot once";
  // A late joiner replays no chunk of a retired slot.
  s.hello("b");
  s.credit("b", 100);
  s.tick();
  for (const auto& d : s.take<ChunkDescriptor>("b")) EXPECT_LT(d.slot, 8u) << "chunk " << d.seq;
}

TEST(StreamStateBudget, AChunkNobodyWasSentKeepsItsRetiredSlot) {
  Stream s(rules(16));
  s.join("a", 0);  // attached, asks for nothing yet
  s.produce(12);
  s.tick();
  s.state.shrink_ring(8);
  EXPECT_EQ(s.state.take_retired_slots(s.now), (std::vector<uint32_t>{12, 13, 14, 15}));
  EXPECT_TRUE(s.state.take_retired_slots(s.now).empty()) << "chunks 8..11 are still to be read";
  s.credit("a", 100);
  s.tick();
  auto got = s.consume("a");
  EXPECT_EQ(got.size(), 12u) << "the chunks in retired slots are still sent";
  EXPECT_EQ(s.state.take_retired_slots(s.now), (std::vector<uint32_t>{8, 9, 10, 11}));
}

TEST(StreamStateBudget, TheRingAndTheCatchUpReserveCountTheUsableSlots) {
  {
    Stream s(rules(16));
    s.join("a", 0);  // pins every chunk
    s.state.shrink_ring(10);
    EXPECT_EQ(s.produce_until_refused(), 10);
  }
  // A regenerating producer keeps max(3, a quarter ring) for catch-ups: 8 of 32, 3 of 8.
  {
    Stream s(regenerating(32, 100));
    s.join("a", 0);
    EXPECT_EQ(s.produce_until_refused(), 32 - 8);
  }
  {
    Stream s(regenerating(32, 100));
    s.join("a", 0);
    s.state.shrink_ring(8);
    EXPECT_EQ(s.produce_until_refused(), 8 - 3);
  }
}

}  // namespace
}  // namespace batchcast
