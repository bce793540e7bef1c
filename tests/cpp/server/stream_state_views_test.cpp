// Views in the stream (docs/views.md), against StreamState alone (stream_state_fixture.h): a view
// added at attach gets its epoch whole in its own pool; private chunks name their view.
#include <gtest/gtest.h>

#include "tests/cpp/server/stream_state_fixture.h"

namespace batchcast {
namespace {

using namespace batchcast::testing;

// Views: a consumer reads its view's pool and tensors; one whose view is added by its Hello
// mid-epoch gets that epoch whole, the chunks made before its view regenerated for it, then
// the shared stream from the first chunk made with its view; a view that cannot be made is
// refused with an ErrorMessage and nobody else notices.
TEST(StreamState, AViewAddedAtAttachGetsItsWholeEpochInItsOwnPool) {
  constexpr uint64_t kPerEpoch = 4;
  Stream s(regenerating(8, kPerEpoch));
  s.lead("a", 2, kPerEpoch);  // epoch 0 is two chunks along
  s.hello("bad", protocol::LateJoin::kReplay, true, "colour=red");
  auto refused = s.take<protocol::ErrorMessage>("bad");
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_NE(refused[0].message.find("colour=red"), std::string::npos);
  EXPECT_TRUE(s.take<protocol::Welcome>("bad").empty());
  EXPECT_EQ(s.state.consumers_now(), 1u);

  s.hello("b", protocol::LateJoin::kReplay, true, "size=6");
  auto welcome = s.take<protocol::Welcome>("b");
  ASSERT_EQ(welcome.size(), 1u);
  EXPECT_EQ(welcome[0].segment_name, "pool.v1");
  s.credit("b", 100);
  std::vector<ChunkDescriptor> got;
  for (int round = 0; round < 10 && got.size() < 2 * kPerEpoch; ++round) {
    s.regenerate(kPerEpoch);
    if (auto f = s.fill()) s.publish(*f, kPerEpoch);
    s.tick();
    s.consume("a");
    for (auto& d : s.take<ChunkDescriptor>("b")) {
      s.release("b", d);
      got.push_back(d);
    }
  }
  ASSERT_GE(got.size(), 2 * kPerEpoch);
  for (size_t i = 0; i < 2 * kPerEpoch; ++i) {
    EXPECT_EQ(got[i].position.epoch, i / kPerEpoch) << i;
    EXPECT_EQ(got[i].position.index_in_epoch, i % kPerEpoch) << i;
    ASSERT_EQ(got[i].tensors.size(), 2u);
    EXPECT_EQ(got[i].tensors[0].shape, (std::vector<int64_t>{kChunk, 6})) << "its view's tensor";
    EXPECT_EQ(got[i].tensors[1].offset, 256u) << "laid out in its view's slot";
  }
  EXPECT_TRUE(protocol::is_private_seq(got[0].seq)) << "made before its view: regenerated";
  EXPECT_FALSE(protocol::is_private_seq(got[2 * kPerEpoch - 1].seq)) << "merged: shared";
  // A second consumer of the same view reads the same pool.
  s.hello("c", protocol::LateJoin::kReplay, true, "size=6");
  EXPECT_EQ(s.take<protocol::Welcome>("c").at(0).segment_name, "pool.v1");
  EXPECT_EQ(s.state.view_count(), 2u);
}

TEST(StreamState, APrivateChunkNamesItsConsumersViewAndAStreamChunkNone) {
  constexpr uint64_t kPerEpoch = 4;
  Stream s(regenerating(8, kPerEpoch));
  s.lead("a", 2, kPerEpoch);
  s.hello("b", protocol::LateJoin::kReplay, true, "size=6");  // view 1, after two chunks
  s.credit("b", 100);
  s.tick();
  auto stream = s.fill();
  ASSERT_TRUE(stream);
  EXPECT_FALSE(stream->view) << "a stream chunk is filled in every view";
  auto mine = s.state.try_acquire_private(s.now);
  ASSERT_TRUE(mine) << "the chunks before its view are regenerated for it";
  EXPECT_EQ(mine->regenerate, (ChunkAddress{0, 0}));
  ASSERT_TRUE(mine->view);
  EXPECT_EQ(*mine->view, 1u) << "only b is sent it: filled in b's view alone";
}

}  // namespace
}  // namespace batchcast
