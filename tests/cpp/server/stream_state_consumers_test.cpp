// The stream rules of a consumer's life and the stream's end (docs/stream.md), against
// StreamState alone (stream_state_fixture.h): the stall policies wait and skip, dead local and
// silent remote consumers, goodbye, forged and duplicate releases, finish, fail and an invalid
// chunk.
#include <gtest/gtest.h>

#include "tests/cpp/server/stream_state_fixture.h"

namespace batchcast {
namespace {

using namespace batchcast::testing;

// Two consumers on a ring of 2: "a" takes everything, "b" took chunk 0 then stopped asking.
void stall_b(Stream& s) {
  s.join("a", 1000);
  s.join("b", 1);
  s.produce(2);
  s.tick();
  s.consume("a");
  EXPECT_EQ(s.consume("b"), Seqs{0});
}

TEST(StreamState, UnderStallPolicyWaitAStalledConsumerHoldsTheProducerForever) {
  Stream s(rules(2));
  stall_b(s);
  EXPECT_TRUE(s.fill()) << "chunk 0 was passed by both";
  s.now += 1e6;
  EXPECT_FALSE(s.fill()) << "chunk 1 was never sent to b";
}

TEST(StreamState, UnderStallPolicySkipAStalledConsumerIsLeftBehindAfterTheTimeout) {
  auto r = rules(2);
  r.stall_policy = StallPolicy::kSkip;
  Stream s(r);
  stall_b(s);
  ASSERT_TRUE(s.fill());  // chunk 2 into chunk 0's slot (not published yet)
  s.now += 9.9;
  EXPECT_FALSE(s.fill()) << "b has not been idle for stall_timeout yet";
  s.now += 0.2;
  ASSERT_TRUE(s.fill()) << "b stopped pinning cursors";
  s.credit("b", 10);  // b comes back: it resumes from the oldest retained chunk
  s.tick();
  EXPECT_EQ(s.seqs("b"), Seqs{}) << "chunks 2 and 3 are being filled, 1 is gone";
}

TEST(StreamState, ASkippedConsumerResumesAtTheOldestRetainedChunkAndSeesTheGap) {
  auto r = rules(2);
  r.stall_policy = StallPolicy::kSkip;
  Stream s(r);
  stall_b(s);
  s.now += 11;
  s.produce(2);  // chunks 2 and 3 replace 0 and 1
  s.tick();
  s.consume("a");
  s.credit("b", 10);
  s.tick();
  auto ds = s.take<ChunkDescriptor>("b");
  ASSERT_EQ(ds.size(), 2u);
  EXPECT_EQ(ds[0].seq, 2u);
  EXPECT_EQ(ds[0].position.stream_position, 2 * kChunk)
      << "consumers count skips from stream positions";
}

TEST(StreamState, ALocalConsumerWhoseProcessDiedIsDroppedAndItsSlotsFreed) {
  Stream s(rules(2));
  s.join("a", 10);
  s.produce(2);
  s.tick();
  EXPECT_EQ(s.take<ChunkDescriptor>("a").size(), 2u);  // held, never released
  EXPECT_FALSE(s.fill());
  s.dead.insert(s.pid_of("a"));
  s.now += 0.2;
  s.tick();
  EXPECT_EQ(s.state.consumers_now(), 0u);
  EXPECT_EQ(s.state.stats().consumers_died, 1u);
  EXPECT_TRUE(s.fill()) << "a dead consumer's holds are released";
}

TEST(StreamState, ALocalConsumerIsJudgedByItsPidNotByItsSilence) {
  Stream s(rules(2));
  s.hello("a");
  s.tick();
  s.now += 3600;  // silent (e.g. SIGSTOPped), but its process exists
  s.tick();
  EXPECT_EQ(s.state.consumers_now(), 1u);
}

TEST(StreamState, ARemoteConsumerIsDroppedAfterTheHeartbeatTimeout) {
  Stream s(rules(2));
  s.hello("remote", protocol::LateJoin::kReplay, /*local=*/false);
  s.dead.insert(s.pid_of("remote"));  // a pid of another host means nothing here
  for (int i = 0; i < 10; ++i) {
    s.now += 1.5;
    s.send("remote", protocol::Heartbeat{});
    s.tick();
  }
  EXPECT_EQ(s.state.consumers_now(), 1u) << "heartbeats keep it";
  s.now += 1.9;
  s.tick();
  EXPECT_EQ(s.state.consumers_now(), 1u);
  s.now += 0.2;
  s.tick();
  EXPECT_EQ(s.state.consumers_now(), 0u) << "silent past heartbeat_timeout";
}

TEST(StreamState, GoodbyeKeepsTheSlotsStillHeldUntilTheyAreReleased) {
  Stream s(rules(2));
  s.join("a", 1);
  s.produce(2);
  s.tick();
  auto held = s.take<ChunkDescriptor>("a");
  ASSERT_EQ(held.size(), 1u);
  s.send("a", protocol::Goodbye{});
  s.credit("a", 10);
  s.tick();
  EXPECT_EQ(s.seqs("a"), Seqs{}) << "nothing is sent after Goodbye";
  EXPECT_EQ(s.state.consumers_now(), 1u) << "kept while it holds a slot";
  EXPECT_EQ(s.state.consumers_reading(), 0u) << "but it reads no more (a share producer may go)";
  EXPECT_FALSE(s.fill());
  s.release("a", held[0]);
  EXPECT_EQ(s.state.consumers_now(), 0u);
  EXPECT_TRUE(s.fill());
}

TEST(StreamState, GoodbyeIsAnsweredWithEndAfterEverythingSentBefore) {
  // Chunks sent just before the server reads a Goodbye are still on their way to the consumer,
  // which cannot know of them: End, after them in the same order, tells its session that
  // nothing follows, so it releases what arrives until then instead of leaving it held.
  Stream s(rules(4));
  s.join("a", 3);
  s.produce(2);
  s.tick();
  s.send("a", protocol::Goodbye{});
  std::vector<Message> box;
  for (const auto& m : s.inbox["a"])
    if (!std::holds_alternative<protocol::Heartbeat>(m)) box.push_back(m);
  ASSERT_EQ(box.size(), 4u) << "Welcome, two chunks, End";
  EXPECT_TRUE(std::holds_alternative<ChunkDescriptor>(box[1]));
  EXPECT_TRUE(std::holds_alternative<ChunkDescriptor>(box[2]));
  EXPECT_TRUE(std::holds_alternative<protocol::End>(box[3]));
  EXPECT_EQ(s.state.consumers_now(), 1u) << "kept while it holds its two chunks";
  s.inbox["a"].clear();
  s.produce(1);
  s.now += 1;
  s.tick();
  EXPECT_TRUE(s.take<ChunkDescriptor>("a").empty()) << "nothing follows End";
  EXPECT_TRUE(s.take<protocol::End>("a").empty()) << "which is sent once";
}

TEST(StreamState, ForgedAndDuplicateReleasesAreDroppedAndCounted) {
  Stream s(rules(2));
  s.hello("a");
  s.hello("evil");
  s.credit("a", 10);
  s.produce(1);
  s.tick();
  auto a = s.take<ChunkDescriptor>("a");
  ASSERT_EQ(a.size(), 1u);
  s.release("evil", a[0]);                         // never sent it
  s.send("evil", protocol::Release{a[0].seq, 7});  // no such slot
  s.release("a", a[0]);
  s.release("a", a[0]);                     // twice
  s.send("stranger", protocol::Credit{1});  // before hello
  s.hello("a");                             // second hello
  std::string garbage(32, '\xff');
  s.state.receive("a", garbage.data(), garbage.size(), s.now);
  EXPECT_EQ(s.state.stats().messages_dropped, 6u);
  s.send("evil", protocol::Goodbye{});  // its cursor no longer pins chunk 0
  EXPECT_TRUE(s.fill());
  EXPECT_TRUE(s.fill()) << "a's one genuine release freed chunk 0";
}

TEST(StreamState, AForgedReleaseCannotFreeAnotherConsumersSlot) {
  Stream s(rules(2));
  s.join("a", 10);
  s.join("evil", 10);
  s.produce(2);
  s.tick();
  auto a = s.take<ChunkDescriptor>("a");
  for (const auto& d : s.take<ChunkDescriptor>("evil")) {
    s.release("evil", d);
    s.release("evil", d);
  }
  EXPECT_FALSE(s.fill()) << "a still holds both chunks";
  EXPECT_EQ(s.state.stats().messages_dropped, 2u);
}

TEST(StreamState, EveryConsumerIsSentEndAfterFinish) {
  Stream s(rules(4));
  s.join("a", 10);
  s.join("b", 1);
  s.produce(2, /*per_epoch=*/2);
  s.state.finish();
  s.tick();
  EXPECT_EQ(s.take<protocol::End>("a").size(), 1u);
  EXPECT_EQ(s.take<protocol::End>("b").size(), 0u) << "b has not been sent chunk 1 yet";
  EXPECT_FALSE(s.state.all_ended());
  s.credit("b", 1);
  s.tick();
  EXPECT_EQ(s.seqs("b"), (Seqs{0, 1}));
  auto end = s.take<protocol::End>("b");
  ASSERT_EQ(end.size(), 1u);
  EXPECT_EQ(end[0].epochs, 2u);
  EXPECT_TRUE(s.state.all_ended());
}

TEST(StreamState, FinishWaitsForChunksStillBeingFilled) {
  Stream s(rules(4));
  s.join("a", 10);
  auto f0 = s.fill();
  ASSERT_TRUE(f0);
  s.state.finish();
  s.tick();
  EXPECT_TRUE(s.take<protocol::End>("a").empty());
  EXPECT_FALSE(s.state.all_ended());
  s.publish(*f0, 1);
  s.tick();
  EXPECT_EQ(s.seqs("a"), Seqs{0});
  EXPECT_EQ(s.take<protocol::End>("a").size(), 1u);
  EXPECT_TRUE(s.state.all_ended());
}

TEST(StreamState, FailTellsAttachedConsumersAndThoseThatAttachLater) {
  Stream s(rules(4));
  s.hello("a");
  s.produce(3);  // retained chunks a later joiner would otherwise replay
  s.state.fail("sample 7: bad JPEG");
  s.state.fail("a second failure");
  s.tick();
  auto errors = s.take<protocol::ErrorMessage>("a");
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].message, "sample 7: bad JPEG") << "the first failure wins";
  s.tick();
  EXPECT_TRUE(s.take<protocol::ErrorMessage>("a").empty()) << "sent once";
  EXPECT_EQ(s.seqs("a"), Seqs{}) << "nothing is delivered after the failure";
  s.join("later", 10);
  s.tick();
  ASSERT_EQ(s.take<protocol::ErrorMessage>("later").size(), 1u);
  EXPECT_EQ(s.seqs("later"), Seqs{}) << "a joiner of a failed stream gets the failure, no replay";
  EXPECT_FALSE(s.fill()) << "a failed stream takes no more chunks";
}

TEST(StreamState, AnInvalidChunkFailsTheStreamInsteadOfReachingConsumers) {
  Stream s(rules(2));
  s.join("a", 10);
  auto f = s.fill();
  ASSERT_TRUE(f);
  protocol::ChunkPosition p;
  p.sample_count = kChunk;
  s.state.publish(f->seq, f->slot, p, {{"#", DType::kUInt8, {kChunk}, {1}, 1 << 20}});
  EXPECT_TRUE(s.state.failed());
  s.tick();
  EXPECT_EQ(s.seqs("a"), Seqs{});
  EXPECT_EQ(s.take<protocol::ErrorMessage>("a").size(), 1u);
}

}  // namespace
}  // namespace batchcast
