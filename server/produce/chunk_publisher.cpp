#include "server/produce/chunk_publisher.h"

#include <cstring>
#include <set>

#include "common/error.h"
#include "protocol/messages.h"

namespace batchcast {
namespace {

std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (size_t i = shape.size(); i-- > 1;) strides[i - 1] = strides[i] * shape[i];
  return strides;
}

bool is_contiguous(const HostTensor& t) {
  if (t.strides.empty()) return true;
  if (t.strides.size() != t.shape.size()) return false;
  auto expect = contiguous_strides(t.shape);
  for (size_t i = 0; i < t.shape.size(); ++i)
    if (t.shape[i] > 1 && t.strides[i] != expect[i]) return false;  // size-1 dims: any stride
  return true;
}

}  // namespace

SlotLayout plan_batch(const std::vector<HostTensor>& tensors) {
  if (tensors.empty()) throw Error("a batch needs at least one tensor");
  if (tensors.size() > protocol::kMaxTensors)
    throw Error("a batch has " + std::to_string(tensors.size()) + " tensors; at most " +
                std::to_string(protocol::kMaxTensors) + " are supported");
  std::set<std::string> names;
  std::vector<SampleTensor> rows;
  const int64_t samples = tensors[0].shape.empty() ? -1 : tensors[0].shape[0];
  for (const auto& t : tensors) {
    if (t.name.empty() || t.name.size() > protocol::kMaxString || !names.insert(t.name).second)
      throw Error("tensor name '" + t.name + "' is empty, too long or repeated");
    if (t.shape.empty())
      throw Error("tensor '" + t.name + "' is a scalar; dimension 0 must count the samples");
    if (t.shape.size() > protocol::kMaxDims)
      throw Error("tensor '" + t.name + "' has " + std::to_string(t.shape.size()) +
                  " dimensions; at most " + std::to_string(protocol::kMaxDims) + " are supported");
    for (auto d : t.shape)
      if (d < 0) throw Error("tensor '" + t.name + "' has a negative dimension");
    if (t.shape[0] != samples)
      throw Error("tensor '" + t.name + "' has " + std::to_string(t.shape[0]) +
                  " samples but tensor '" + tensors[0].name + "' has " + std::to_string(samples) +
                  "; dimension 0 is the sample dimension");
    if (!is_contiguous(t))
      throw Error("tensor '" + t.name + "' is not C-contiguous; make it contiguous first");
    rows.push_back({t.name, t.dtype, std::vector<int64_t>(t.shape.begin() + 1, t.shape.end())});
  }
  if (samples == 0) throw Error("a batch has 0 samples");
  return SlotLayout::plan(rows, static_cast<uint32_t>(samples));
}

namespace {

// The slot layout of `tensors`, checked against the stream host's slots.
SlotLayout plan_for(const StreamHost& core, const std::vector<HostTensor>& tensors) {
  SlotLayout layout = plan_batch(tensors);
  if (layout.bytes > core.memory().pool().slot_bytes())
    throw Error("a batch of " + std::to_string(layout.bytes) + " bytes does not fit the " +
                std::to_string(core.memory().pool().slot_bytes()) +
                "-byte slots; give larger slots");
  return layout;
}

void copy_and_publish(StreamHost& core, const FillLease& lease, const SlotLayout& layout,
                      const std::vector<HostTensor>& tensors, protocol::ChunkPosition position) {
  position.sample_count = static_cast<uint32_t>(tensors[0].shape[0]);
  std::vector<protocol::TensorSpec> specs;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& t = tensors[i];
    specs.push_back({t.name, t.dtype, t.shape, contiguous_strides(t.shape), layout.offsets[i]});
    uint64_t bytes = dtype_size(t.dtype);
    for (auto d : t.shape) bytes *= static_cast<uint64_t>(d);
    if (bytes) std::memcpy(lease.data + layout.offsets[i], t.data, bytes);
  }
  core.publish(lease, position, std::move(specs));
}

}  // namespace

bool publish_chunk(StreamHost& core, const std::vector<HostTensor>& tensors,
                   protocol::ChunkPosition position) {
  SlotLayout layout = plan_for(core, tensors);
  auto lease = core.acquire();
  if (!lease) return false;
  copy_and_publish(core, *lease, layout, tensors, position);
  return true;
}

void publish_chunk_into(StreamHost& core, const FillLease& lease,
                        const std::vector<HostTensor>& tensors, protocol::ChunkPosition position) {
  copy_and_publish(core, lease, plan_for(core, tensors), tensors, position);
}

}  // namespace batchcast
