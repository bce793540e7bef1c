// StreamPlan's sharding against torch's DistributedSampler (torch/utils/data/distributed.py,
// drop_last=False, the only mode StreamPlan has): the epoch's order padded by wrapping around to
// a multiple of world_size, then rank r takes positions r, r + world_size, ... The epoch's order
// is the world_size=1 plan of the same (seed, epoch): every rank of every job agrees on it.
#include "server/stream/stream_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "common/error.h"

namespace batchcast {
namespace {

// DistributedSampler.__iter__, transcribed: indices += (indices * ceil(pad / n))[:pad], then
// indices[rank:total_size:num_replicas].
std::vector<uint64_t> distributed_sampler(std::vector<uint64_t> indices, uint32_t rank,
                                          uint32_t world) {
  const uint64_t n = indices.size();
  const uint64_t num_samples = (n + world - 1) / world;  // math.ceil(len / num_replicas)
  const uint64_t total_size = num_samples * world;
  const uint64_t padding = total_size - n;
  std::vector<uint64_t> repeated;
  for (uint64_t k = 0; k < (padding + n - 1) / n; ++k)
    repeated.insert(repeated.end(), indices.begin(), indices.end());
  indices.insert(indices.end(), repeated.begin(), repeated.begin() + padding);
  std::vector<uint64_t> shard;
  for (uint64_t i = rank; i < total_size; i += world) shard.push_back(indices[i]);
  EXPECT_EQ(shard.size(), num_samples);
  return shard;
}

struct Case {
  uint64_t n;
  uint32_t world;
  uint64_t seed;
};

TEST(StreamPlan, EveryRankGetsDistributedSamplersShardOfTheEpochsOrder) {
  for (Case c : {Case{10, 1, 0}, Case{10, 2, 1}, Case{10, 3, 7}, Case{11, 4, 42}, Case{2, 5, 3},
                 Case{1, 3, 9}, Case{1000, 8, 123}, Case{97, 97, 5}}) {
    for (bool shuffle : {true, false}) {
      for (uint64_t epoch : {0, 1, 5}) {
        SCOPED_TRACE("n=" + std::to_string(c.n) + " world=" + std::to_string(c.world) +
                     " seed=" + std::to_string(c.seed) + " epoch=" + std::to_string(epoch) +
                     (shuffle ? " shuffled" : " in order"));
        auto order = StreamPlan(c.n, {c.seed, shuffle, 0, 1}).epoch_order(epoch);
        for (uint32_t rank = 0; rank < c.world; ++rank) {
          StreamPlan plan(c.n, {c.seed, shuffle, rank, c.world});
          EXPECT_EQ(plan.epoch_samples(), (c.n + c.world - 1) / c.world);
          EXPECT_EQ(plan.epoch_order(epoch), distributed_sampler(order, rank, c.world))
              << "rank " << rank;
        }
      }
    }
  }
}

TEST(StreamPlan, AnEpochIsAPermutationDrawnFromSeedAndEpochOnly) {
  std::vector<uint64_t> identity(100);
  for (uint64_t i = 0; i < identity.size(); ++i) identity[i] = i;
  EXPECT_EQ(StreamPlan(100, {7, false, 0, 1}).epoch_order(3), identity);
  auto e0 = StreamPlan(100, {7, true, 0, 1}).epoch_order(0);
  auto e1 = StreamPlan(100, {7, true, 0, 1}).epoch_order(1);
  EXPECT_EQ(e0, StreamPlan(100, {7, true, 0, 1}).epoch_order(0)) << "reproducible";
  EXPECT_NE(e0, e1) << "each epoch reshuffles";
  EXPECT_NE(e0, StreamPlan(100, {8, true, 0, 1}).epoch_order(0)) << "the seed matters";
  std::sort(e1.begin(), e1.end());
  EXPECT_EQ(e1, identity);
}

TEST(StreamPlan, RanksTogetherCoverTheDatasetWithOnlyThePaddingRepeated) {
  const uint64_t n = 103;
  const uint32_t world = 4;  // 26 each: 104 positions, one sample repeated
  std::vector<uint64_t> all;
  for (uint32_t r = 0; r < world; ++r) {
    auto shard = StreamPlan(n, {11, true, r, world}).epoch_order(2);
    all.insert(all.end(), shard.begin(), shard.end());
  }
  ASSERT_EQ(all.size(), 104u);
  std::sort(all.begin(), all.end());
  all.erase(std::unique(all.begin(), all.end()), all.end());
  EXPECT_EQ(all.size(), n);
}

TEST(StreamPlan, BadShardingIsRefusedWithTheFix) {
  EXPECT_THROW(StreamPlan(10, {0, true, 2, 2}), Error);
  EXPECT_THROW(StreamPlan(10, {0, true, 0, 0}), Error);
  EXPECT_THROW(StreamPlan(0, {}), Error);
}

}  // namespace
}  // namespace batchcast
