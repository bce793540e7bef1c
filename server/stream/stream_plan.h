// StreamPlan: which samples an epoch visits, in which order. Epoch e is a permutation of the
// dataset drawn from (seed, e) (identity without shuffle), then cut to one rank's shard with
// torch's DistributedSampler semantics: padded by wrapping to a multiple of world_size, rank r
// taking positions r, r + world_size, ... Pure function of its inputs; thread-safe.
#pragma once

#include <cstdint>
#include <vector>

namespace batchcast {

struct StreamPlanOptions {
  uint64_t seed = 0;
  bool shuffle = true;
  uint32_t rank = 0;        // this server's shard
  uint32_t world_size = 1;  // number of shards
};

class StreamPlan {
 public:
  StreamPlan(uint64_t dataset_size, StreamPlanOptions options);
  uint64_t epoch_samples() const;  // samples per epoch for this rank
  std::vector<uint64_t> epoch_order(uint64_t epoch) const;

 private:
  uint64_t dataset_size_;
  StreamPlanOptions options_;
};

}  // namespace batchcast
