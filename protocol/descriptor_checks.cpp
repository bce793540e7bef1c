#include "protocol/descriptor_checks.h"

#include <limits>

namespace batchcast::protocol {

std::optional<uint64_t> tensor_extent_bytes(const TensorSpec& t) {
  // The view spans [offset, offset + (sum over dims of (shape-1)*stride + 1) * itemsize).
  // Every dimension is checked before an empty one returns 0 (a negative dimension after a zero
  // one was accepted), and `last` is bounded at each step so the sum cannot wrap 128 bits.
  for (size_t i = 0; i < t.shape.size(); ++i)
    if (t.shape[i] < 0 || t.strides[i] < 0) return std::nullopt;
  unsigned __int128 last = 0;
  for (size_t i = 0; i < t.shape.size(); ++i) {
    if (t.shape[i] == 0) return 0;
    last += static_cast<unsigned __int128>(t.shape[i] - 1) * static_cast<uint64_t>(t.strides[i]);
    if (last > std::numeric_limits<uint64_t>::max()) return std::nullopt;
  }
  unsigned __int128 bytes = (last + 1) * dtype_size(t.dtype);
  if (bytes > std::numeric_limits<uint64_t>::max()) return std::nullopt;
  return static_cast<uint64_t>(bytes);
}

std::string validate_descriptor(const ChunkDescriptor& d, uint32_t slot_count,
                                uint64_t slot_bytes) {
  if (d.slot >= slot_count)
    return "slot " + std::to_string(d.slot) + " outside the pool of " + std::to_string(slot_count);
  const ChunkPosition& p = d.position;
  if (p.sample_count == 0) return "empty chunk";
  if (p.epoch_samples != 0 && (p.sample_count > p.epoch_samples ||
                               p.sample_start > p.epoch_samples - p.sample_count))  // no wrap
    return "chunk samples beyond the epoch's end";
  if (!d.take.empty()) {
    if (d.take.size() != p.sample_count)
      return "take lists " + std::to_string(d.take.size()) + " rows for a chunk of " +
             std::to_string(p.sample_count) + " samples";
    for (size_t i = 1; i < d.take.size(); ++i)
      if (d.take[i] <= d.take[i - 1]) return "take's rows are not strictly ascending";
  }
  for (const auto& t : d.tensors) {
    if (t.shape.size() != t.strides.size() || t.shape.empty())
      return "tensor " + t.name + ": bad rank";
    if (d.take.empty() && t.shape[0] != static_cast<int64_t>(p.sample_count))
      return "tensor " + t.name + ": dimension 0 is not the chunk's sample count";
    if (!d.take.empty() && d.take.back() >= t.shape[0])
      return "tensor " + t.name + ": take's row " + std::to_string(d.take.back()) +
             " beyond its dimension 0 of " + std::to_string(t.shape[0]);
    auto extent = tensor_extent_bytes(t);
    if (!extent) return "tensor " + t.name + ": negative or overflowing shape/strides";
    if (t.offset > slot_bytes || *extent > slot_bytes - t.offset)
      return "tensor " + t.name + ": extends outside its slot";
    if (t.offset % dtype_size(t.dtype) != 0) return "tensor " + t.name + ": misaligned offset";
    if (!d.take.empty() && row_extent_bytes(t) > row_stride_bytes(t))
      return "tensor " + t.name +
             ": its rows overlap (a row spans more than dimension 0's stride), so rows cannot be "
             "taken apart";
  }
  return "";
}

uint64_t row_stride_bytes(const TensorSpec& t) {
  return static_cast<uint64_t>(t.strides[0]) * dtype_size(t.dtype);
}

uint64_t row_extent_bytes(const TensorSpec& t) {
  TensorSpec row = t;
  row.shape[0] = 1;
  return tensor_extent_bytes(row).value_or(0);
}

}  // namespace batchcast::protocol
