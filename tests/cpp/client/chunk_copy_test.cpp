// Chunks copied out of their slot on arrival (client/chunk_copy.h): a relaxed consumer's rows,
// gathered from a real host pool into a compact copy, byte for byte, and described as a chunk
// of those rows alone.
#include "client/chunk_copy.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "protocol/descriptor_checks.h"
#include "shm/slot_pool.h"

namespace batchcast {
namespace {

// A chunk of 6 samples in slot 1: "#0" 6 rows of 3x5 uint8 with a byte of padding after each
// (stride 16), "#1" 6 int64 labels.
protocol::ChunkDescriptor six_samples() {
  protocol::ChunkDescriptor d;
  d.seq = protocol::kRelaxedSeqBase + 3;
  d.slot = 1;
  d.position = {0, 1, 3, 3, 12, false};
  d.tensors = {{"#0", DType::kUInt8, {6, 3, 5}, {16, 5, 1}, 0},
               {"#1", DType::kInt64, {6}, {1}, 104}};
  return d;
}

TEST(ChunkCopy, TakenRowsAreGatheredIntoACompactCopyByteForByte) {
  SlotMemory memory = SlotMemory::create(
      segment_name_for("ipc:///tmp/bctest-chunk-copy-" + std::to_string(::getpid())), 2, 4096, {});
  uint8_t* slot = memory.slot_data(1);
  for (int i = 0; i < 4096; ++i) slot[i] = static_cast<uint8_t>(i * 7 + 3);
  for (int64_t row = 0; row < 6; ++row) {
    const int64_t label = 100 + row;
    std::memcpy(slot + 104 + row * 8, &label, 8);
  }
  auto d = six_samples();
  d.take = {0, 2, 5};
  ASSERT_EQ(protocol::validate_descriptor(d, 2, 4096), "");

  auto copier = ChunkCopier::create(memory);
  auto copied = copier->copy(d);
  const auto& c = copied.desc;
  EXPECT_TRUE(copied.release_after.empty()) << "a host copy is done when copy() returns";
  EXPECT_TRUE(c.take.empty());
  EXPECT_EQ(c.seq, d.seq);
  EXPECT_EQ(c.slot, d.slot);
  EXPECT_EQ(c.position.sample_count, 3u);
  ASSERT_EQ(c.tensors.size(), 2u);
  for (size_t ti = 0; ti < 2; ++ti) {
    EXPECT_EQ(c.tensors[ti].shape[0], 3);
    EXPECT_EQ(c.tensors[ti].strides, d.tensors[ti].strides) << "strides unchanged";
    EXPECT_EQ(c.tensors[ti].offset % kCopyAlignment, 0u);
  }
  const uint8_t* copy = copied.copy->data();
  for (size_t k = 0; k < d.take.size(); ++k) {
    EXPECT_EQ(std::memcmp(copy + c.tensors[0].offset + k * 16, slot + d.take[k] * 16, 15), 0)
        << "row " << d.take[k] << " of #0";
    int64_t label = 0;
    std::memcpy(&label, copy + c.tensors[1].offset + k * 8, 8);
    EXPECT_EQ(label, 100 + static_cast<int64_t>(d.take[k])) << "row " << d.take[k] << " of #1";
  }
  // The copy is a valid chunk of its own: the rebatcher and assemblers read it as any other.
  EXPECT_EQ(protocol::validate_descriptor(c, 2, c.tensors[1].offset + 3 * 8), "");
}

TEST(ChunkCopy, ConsecutiveRowsAreCopiedAtOnce) {
  auto d = six_samples();
  d.take = {1, 2, 3, 5};
  d.position.sample_count = 4;
  const CopyPlan plan = plan_copy(d);
  ASSERT_EQ(plan.runs.size(), 4u) << "rows 1-3 and row 5 of each tensor";
  EXPECT_EQ(plan.runs[0].from, 16u);
  EXPECT_EQ(plan.runs[0].bytes, 2 * 16u + 15) << "a run ends at its last row's last byte";
  EXPECT_EQ(plan.runs[1].from, 5 * 16u);
  EXPECT_EQ(plan.runs[1].to, 3 * 16u);
  EXPECT_EQ(plan.runs[2].to, kCopyAlignment);
  EXPECT_EQ(plan.runs[2].from, 104 + 8u);
  EXPECT_EQ(plan.runs[2].bytes, 3 * 8u);
  EXPECT_EQ(plan.bytes, kCopyAlignment + 4 * 8);

  d.take.clear();  // a private chunk: its slot's bytes as they are
  d.position.sample_count = 6;
  const CopyPlan whole = plan_copy(d);
  ASSERT_EQ(whole.runs.size(), 1u);
  EXPECT_EQ(whole.runs[0].bytes, 104 + 6 * 8u);
  EXPECT_EQ(whole.desc.tensors, d.tensors);
}

}  // namespace
}  // namespace batchcast
