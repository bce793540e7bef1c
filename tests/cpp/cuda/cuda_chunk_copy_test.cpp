// CudaChunkCopier (client/cuda_assembler.h): the rows a relaxed consumer takes of a chunk in a
// GPU pool, gathered device to device into a compact copy, byte for byte, the slot's release
// fenced behind the copy. Skips itself ("no CUDA device: ...") where there is no GPU.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "client/chunk_copy.h"
#include "common/cuda_check.h"
#include "protocol/descriptor_checks.h"
#include "shm/cuda_pool.h"
#include "shm/slot_pool.h"

namespace batchcast {
namespace {

TEST(CudaChunkCopy, TakenRowsAreGatheredOnTheGpuByteForByte) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: this test needs a GPU";
  SlotMemory memory = SlotMemory::create(
      segment_name_for("ipc:///tmp/bctest-cuda-copy-" + std::to_string(::getpid())), 2, 4096, {0});
  std::vector<uint8_t> slot(4096);
  for (size_t i = 0; i < slot.size(); ++i) slot[i] = static_cast<uint8_t>(i * 13 + 1);
  cuda_check(cudaMemcpy(memory.slot_data(1), slot.data(), slot.size(), cudaMemcpyHostToDevice),
             "filling the slot");
  cuda_check(cudaEventRecord(memory.slot_event(1), nullptr), "recording the slot's event");
  protocol::ChunkDescriptor d;
  d.seq = protocol::kRelaxedSeqBase;
  d.slot = 1;
  d.position = {0, 0, 0, 3, 0, false};
  d.tensors = {{"#0", DType::kUInt8, {6, 3, 5}, {16, 5, 1}, 0},
               {"#1", DType::kInt64, {6}, {1}, 104}};
  d.take = {0, 2, 5};
  ASSERT_EQ(protocol::validate_descriptor(d, 2, 4096), "");

  auto copier = ChunkCopier::create(memory);
  auto copied = copier->copy(d);
  ASSERT_EQ(copied.release_after.size(), 1u) << "the slot goes back once the copy has completed";
  while (!copied.release_after[0]->passed()) {
  }
  const CopyPlan plan = plan_copy(d);
  std::vector<uint8_t> copy(plan.bytes);
  cuda_check(cudaMemcpy(copy.data(), copied.copy->data(), copy.size(), cudaMemcpyDeviceToHost),
             "reading the copy");
  const auto& c = copied.desc;
  for (size_t k = 0; k < d.take.size(); ++k) {
    EXPECT_EQ(std::memcmp(&copy[c.tensors[0].offset + k * 16], &slot[d.take[k] * 16], 15), 0)
        << "row " << d.take[k] << " of #0";
    EXPECT_EQ(std::memcmp(&copy[c.tensors[1].offset + k * 8], &slot[104 + d.take[k] * 8], 8), 0)
        << "row " << d.take[k] << " of #1";
  }
}

}  // namespace
}  // namespace batchcast
