// libFuzzer target over the wire codec (protocol::decode, protocol::encode,
// protocol::validate_descriptor). Every frame a peer sends reaches decode() first, and every
// descriptor a consumer receives passes validate_descriptor() before the consumer reads pool
// memory through it, so these two functions are the trust boundary of the protocol.
// Properties checked on every input (a violation aborts, so libFuzzer reports it):
//   1. decode() never crashes, throws or reads out of bounds (ASan/UBSan), whatever the bytes.
//   2. A frame that decodes re-encodes to the same bytes (the codec is canonical), and the
//      re-encoded frame decodes again.
//   3. A descriptor that validate_descriptor() accepts for a pool really lies inside it: an
//      independent oracle (checked 128-bit arithmetic) recomputes every strided tensor's last
//      byte and the chunk's sample range; a view reaching outside its slot is a finding. So are
//      rows to take (ChunkDescriptor::take) that a tensor does not have, or that the consumer
//      could not copy apart (a row reaching into the next).
// Built only with clang and BATCHCAST_FUZZ=ON; run with tests/fuzz/run_fuzz.sh. Seeds in
// corpus/messages/ (real encoded messages, written by make_message_corpus).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "protocol/descriptor_checks.h"
#include "protocol/messages.h"

namespace {

using batchcast::protocol::ChunkDescriptor;

[[noreturn]] void finding(const char* what) {
  std::fprintf(stderr, "fuzz_messages: %s\n", what);
  std::abort();
}

// The oracle: does every byte addressed by descriptor `d`'s tensors lie inside one slot of
// `slot_bytes`, and its sample range inside the epoch? Written independently of
// tensor_extent_bytes(), with overflow-checked arithmetic: an overflow means "outside".
bool oracle_inside(const ChunkDescriptor& d, uint32_t slot_count, uint64_t slot_bytes) {
  using U = unsigned __int128;
  if (d.slot >= slot_count) return false;
  const auto& p = d.position;
  if (p.epoch_samples != 0 &&
      static_cast<U>(p.sample_start) + p.sample_count > static_cast<U>(p.epoch_samples))
    return false;
  for (const auto& t : d.tensors) {
    if (t.shape.empty() || t.shape.size() != t.strides.size()) return false;
    bool empty = false;
    for (auto s : t.shape) empty |= s == 0;
    U last = 0;  // offset of the last element, in elements
    for (size_t i = 0; i < t.shape.size(); ++i) {
      if (t.shape[i] < 0 || t.strides[i] < 0) return false;
      if (empty) continue;
      U term;
      if (__builtin_mul_overflow(static_cast<U>(t.shape[i] - 1), static_cast<U>(t.strides[i]),
                                 &term))
        return false;
      if (__builtin_add_overflow(last, term, &last)) return false;
    }
    size_t item = batchcast::dtype_size(t.dtype);
    for (auto row : d.take)
      if (static_cast<int64_t>(row) >= t.shape[0]) return false;
    if (!d.take.empty() && !empty) {
      U row_last = 0;  // a row's last element, in elements from its first
      for (size_t i = 1; i < t.shape.size(); ++i)
        row_last += static_cast<U>(t.shape[i] - 1) * static_cast<U>(t.strides[i]);
      U row_bytes;
      if (__builtin_mul_overflow(row_last + 1, static_cast<U>(item), &row_bytes)) return false;
      if (row_bytes > static_cast<U>(t.strides[0]) * item) return false;
    }
    if (empty) {
      if (t.offset > slot_bytes) return false;
      continue;
    }
    U end_byte;  // one past the last byte of the view, from the slot's start
    if (__builtin_mul_overflow(last + 1, static_cast<U>(item), &end_byte)) return false;
    if (__builtin_add_overflow(end_byte, static_cast<U>(t.offset), &end_byte)) return false;
    if (end_byte > slot_bytes) return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace p = batchcast::protocol;
  auto result = p::decode(data, size);
  if (!result.message) {
    if (result.error.empty()) finding("a rejected frame carries no reason");
    return 0;
  }
  std::string again = p::encode(*result.message);
  if (again.size() != size || std::string(reinterpret_cast<const char*>(data), size) != again)
    finding("a decoded frame does not re-encode to the same bytes");
  if (!p::decode(again.data(), again.size()).message) finding("a re-encoded frame does not decode");

  if (auto* d = std::get_if<ChunkDescriptor>(&*result.message)) {
    // A few pools: tiny, page-sized, the server's usual sizes, and the largest slot possible.
    static const struct {
      uint32_t slots;
      uint64_t bytes;
    } pools[] = {{1, 1}, {2, 4096}, {8, 1 << 20}, {64, 64ull << 20}, {~0u, ~0ull}};
    for (const auto& pool : pools) {
      bool valid = p::validate_descriptor(*d, pool.slots, pool.bytes).empty();
      if (valid && !oracle_inside(*d, pool.slots, pool.bytes))
        finding("validate_descriptor accepted a descriptor that reaches outside its pool");
    }
  }
  return 0;
}
