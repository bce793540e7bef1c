// Checks of a descriptor against the pool its consumer mapped (what decode() cannot check alone,
// docs/protocol.md "Validation"), and the byte extents of strided tensors they rest on.
// Every descriptor a consumer receives passes validate_descriptor() before the consumer reads pool
// memory through it, and the server checks its own before sending them: this is the protocol's
// trust boundary on memory (fuzzed with an independent oracle, tests/fuzz/fuzz_messages.cpp).
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "protocol/messages.h"

namespace batchcast::protocol {

// Checks a descriptor against the pool the consumer mapped: slot id, every tensor inside its
// slot (offset + extent of the strided view), sample counts matching dimension 0; with `take`,
// its rows strictly ascending, below every tensor's dimension 0, one per sample, and every
// tensor's rows apart (a row's extent within the stride of dimension 0), so each can be copied
// out alone.
// Returns an empty string when valid, else the reason.
std::string validate_descriptor(const ChunkDescriptor& d, uint32_t slot_count, uint64_t slot_bytes);

// Bytes spanned by a strided tensor view (0 for an empty one); nullopt on overflow.
std::optional<uint64_t> tensor_extent_bytes(const TensorSpec& t);
// Of a tensor of a valid descriptor: bytes from one row (sample) to the next, and bytes spanned
// by one row (at most the former when the rows are apart).
uint64_t row_stride_bytes(const TensorSpec& t);
uint64_t row_extent_bytes(const TensorSpec& t);

}  // namespace batchcast::protocol
