#include "server/stream/stream_plan.h"

#include <numeric>
#include <utility>

#include "common/error.h"
#include "common/random.h"

namespace batchcast {

StreamPlan::StreamPlan(uint64_t dataset_size, StreamPlanOptions options)
    : dataset_size_(dataset_size), options_(options) {
  if (dataset_size == 0) throw Error("the dataset is empty");
  if (options_.world_size == 0 || options_.rank >= options_.world_size)
    throw Error("rank " + std::to_string(options_.rank) + " must be below world size " +
                std::to_string(options_.world_size));
}

uint64_t StreamPlan::epoch_samples() const {
  return (dataset_size_ + options_.world_size - 1) / options_.world_size;
}

std::vector<uint64_t> StreamPlan::epoch_order(uint64_t epoch) const {
  std::vector<uint64_t> order(dataset_size_);
  std::iota(order.begin(), order.end(), 0);
  if (options_.shuffle) {  // Fisher-Yates driven by (seed, epoch) only
    SampleRng rng(options_.seed, epoch, 0x5eedull);
    shuffle(order, rng);
  }
  if (options_.world_size == 1) return order;
  uint64_t total = epoch_samples() * options_.world_size;
  std::vector<uint64_t> shard;
  shard.reserve(epoch_samples());
  for (uint64_t p = options_.rank; p < total; p += options_.world_size)
    shard.push_back(order[p % dataset_size_]);
  return shard;
}

}  // namespace batchcast
