// The batchcast wire protocol: every message that crosses ZeroMQ between a server and its
// consumers, with a versioned binary codec.
//
// Framing: one ZeroMQ frame per message (plus the ROUTER identity frame on the server side).
// Each frame starts with a fixed header {magic u32, version u16, type u16}; fields follow in
// little-endian order; strings are u16 length + bytes. decode() checks the header, the exact
// size, every enum and every bound it can check alone (string lengths, tensor and dim counts,
// extents that would overflow); checks that need context (slot ids, offsets inside the pool,
// which slots a consumer holds) are done by the receiver with validate_descriptor()
// (protocol/descriptor_checks.h) and the server's SlotRing. A malformed message is a value
// (DecodeResult::error), never an exception, so callers can drop and count it.
//
// Only descriptors cross the wire: pixels stay in the shared pool.
// Thread-safety: plain values and pure functions.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "common/dtype.h"

namespace batchcast::protocol {

constexpr uint32_t kMagic = 0x53414342;  // "BCAS"
// 2: adds Seek and SeekReply; the messages of version 1 keep their layouts.
// 3: a CUDA Welcome lists one arena per GPU of the pool (serve --device cuda:0,cuda:1).
// 4: Hello carries the consumer's stall bound, a server's Heartbeat what the consumer waits for.
// 5: Hello carries the view the consumer reads; a refused Hello is answered with an ErrorMessage.
// 6: Hello carries the order the consumer reads in; a descriptor may list the rows to take.
// 7: a relaxed descriptor names the dataset index of each row it takes, Welcome the order the
//    consumer is served in, and HadSamples carries a relaxed consumer's samples had to its Seek;
//    a frame may be 64 KiB.
constexpr uint16_t kVersion = 7;
constexpr size_t kMaxTensors = 16;
constexpr size_t kMaxDims = 8;
constexpr size_t kMaxString = 1024;
// Large enough for a relaxed descriptor of a few thousand rows (8 bytes a row: its row and its
// dataset index), small enough that a peer's frame costs the receiver nothing worth bounding.
constexpr size_t kMaxMessageBytes = 64 * 1024;
constexpr size_t kCudaIpcHandleBytes = 64;
constexpr size_t kCudaUuidBytes = 16;
// A CUDA pool's Welcome carries one event handle per slot and GPU; this bounds their total under
// kMaxMessageBytes (a ring of 8 on 8 GPUs needs 64).
constexpr size_t kMaxCudaSlots = 192;
// A descriptor lists at most this many rows to take (ChunkDescriptor::take).
constexpr size_t kMaxTakeRows = 65536;

enum class LateJoin : uint8_t { kReplay = 0, kNextEpoch = 1 };
enum class DeviceKind : uint8_t { kCpu = 0, kCuda = 1 };
// The order a consumer reads its epochs in (docs/stream.md, "Order"). kServer: the server's
// default (`serve --order`). kExact: the stream's seeded order, chunk by chunk. kRelaxed: each
// epoch is its shard exactly once in an order the server chooses from what every relaxed
// consumer still needs, so that one decode serves every consumer that still needs the sample.
enum class Order : uint8_t { kServer = 0, kExact = 1, kRelaxed = 2 };

// One tensor of a batch inside a slot. Shapes and strides count elements; offset counts bytes
// from the start of the slot. Dimension 0 is the sample dimension.
struct TensorSpec {
  std::string name;
  DType dtype = DType::kUInt8;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
  uint64_t offset = 0;
  bool operator==(const TensorSpec& o) const {
    return name == o.name && dtype == o.dtype && shape == o.shape && strides == o.strides &&
           offset == o.offset;
  }
};

// consumer -> server: first message of a session.
struct Hello {
  uint32_t pid = 0;
  std::string boot_id;  // lets the server check `pid` when both run on one host
  std::string name;     // for logs and metrics
  LateJoin late_join = LateJoin::kReplay;
  uint32_t device_index = 0;  // CUDA consumers: the device they read on
  // Seconds this consumer may hold the stream back before the server decouples it (stall
  // policy decouple) or leaves it behind (skip); 0: the server's stall_timeout.
  double stall_timeout_s = 0;
  // The view it reads (docs/views.md): a view text (decoders/view_spec.h) over the server's
  // transform; empty: the server's own.
  std::string view;
  Order order = Order::kServer;
};

// One GPU's copy of a CUDA pool: the GPU's UUID (indices differ under CUDA_VISIBLE_DEVICES), the
// arena's memory handle and one interprocess event per slot, recorded once the slot's chunk is
// on that GPU.
struct CudaArena {
  std::array<uint8_t, kCudaUuidBytes> device_uuid{};
  std::array<uint8_t, kCudaIpcHandleBytes> memory_handle{};
  std::vector<std::array<uint8_t, kCudaIpcHandleBytes>> event_handles;
};

// server -> consumer: the answer to Hello; everything needed to map the pool once.
struct Welcome {
  uint64_t consumer_id = 0;
  uint32_t server_pid = 0;
  std::string boot_id;
  std::string segment_name;  // POSIX shared-memory name of the pool (host slots or header)
  uint64_t segment_bytes = 0;
  uint32_t slot_count = 0;
  uint64_t slot_bytes = 0;
  uint64_t slots_offset = 0;  // byte offset of slot 0 in the segment (host pools)
  uint32_t chunk_size = 0;
  uint64_t epoch_samples = 0;  // samples per epoch; 0 when not known yet
  uint64_t epochs = 0;         // 0: unbounded
  uint64_t first_epoch = 0;
  DeviceKind device = DeviceKind::kCpu;
  // CUDA pools: one arena per GPU the server places every chunk on; a consumer reads the one on
  // its own GPU. Empty for host pools.
  std::vector<CudaArena> cuda_arenas;
  double heartbeat_interval_s = 0.25;
  double heartbeat_timeout_s = 3.0;
  // The order this consumer is served in: what its Hello asked, else the server's default; exact
  // where the producer cannot decode chosen samples. Never kServer.
  Order order = Order::kExact;
};

// Where a chunk sits in its epoch. The one name for it from the producer to the consumer: the
// server's publish(), the Python Producer's batches and ChunkDescriptor all carry it.
struct ChunkPosition {
  uint64_t epoch = 0;
  uint64_t index_in_epoch = 0;  // chunk number inside the epoch
  uint64_t sample_start = 0;    // first sample's position inside the epoch
  uint32_t sample_count = 0;
  uint64_t epoch_samples = 0;  // samples in this epoch; 0 when unknown
  bool epoch_end = false;      // last chunk of its epoch (on the wire: flag bit kFlagEpochEnd)
  // Samples before this chunk since the stream began; set by the server when it publishes the
  // chunk (what a producer passes is ignored). Consumers count what they missed from it.
  uint64_t stream_position = 0;
};

constexpr uint8_t kFlagEpochEnd = 1;
constexpr uint8_t kFlagAllFlags = 1;

// Chunk numbers from here up are private chunks: regenerated for one consumer alone (it sought a
// position the ring no longer holds), never shared, far above any stream's length. Their
// consumer copies them out of the slot on arrival and releases the slot at once
// (docs/stream.md, "Catch-up").
constexpr uint64_t kPrivateSeqBase = uint64_t{1} << 62;
inline bool is_private_seq(uint64_t seq) { return seq >= kPrivateSeqBase; }
// Chunk numbers from here up (inside the private range: never a stream chunk, copied on arrival)
// are chunks decoded for relaxed readers: each goes to every relaxed reader that needs rows of it.
constexpr uint64_t kRelaxedSeqBase = kPrivateSeqBase + (uint64_t{1} << 61);
inline bool is_relaxed_seq(uint64_t seq) { return seq >= kRelaxedSeqBase; }

// server -> consumer: one chunk of the stream, decoded once into one slot.
struct ChunkDescriptor {
  uint64_t seq = 0;  // position of the chunk in the stream (0, 1, 2, ...), or a private chunk's
  ChunkPosition position;
  uint32_t slot = 0;
  std::vector<TensorSpec> tensors;
  // Relaxed order: the rows of the slot's tensors this consumer takes (strictly ascending, below
  // the tensors' dimension 0; position.sample_count of them), and `position` is then this
  // consumer's own (its epoch, the samples it had in it before). The consumer copies those rows
  // out on arrival and releases the slot at once. Empty: every row, as the tensors say.
  std::vector<uint32_t> take;
  // With take: the dataset index of each row taken (one per row, in take's order), so that a
  // relaxed consumer knows which samples it had (what its resume state keeps). Else empty.
  std::vector<uint32_t> samples;
};

struct Credit {  // consumer -> server: may send `chunks` more descriptors
  uint32_t chunks = 0;
};
struct Release {  // consumer -> server: done with the chunk `seq` held in `slot`
  uint64_t seq = 0;
  uint32_t slot = 0;
};
struct Heartbeat {  // both ways; consumers add their cumulative counters for the metrics
  uint64_t samples = 0;
  double wait_s = 0;
  // server -> consumer: what holds its data back right now (min_consumers not met, a named
  // consumer holding the stream); empty when nothing does.
  std::string waiting_for;
};
struct Goodbye {};  // consumer -> server: leaving; release everything I hold
struct End {        // server -> consumer: no chunk follows
  uint64_t epochs = 0;
};
struct ErrorMessage {  // server -> consumer: the stream failed (e.g. a bad sample with
                       // on_error=raise)
  std::string message;
};

// consumer -> server: the next chunk this consumer is sent is the one holding sample `sample` of
// epoch `epoch`. Descriptors that arrive before the SeekReply were sent for the old cursor.
struct Seek {
  uint64_t epoch = 0;
  uint64_t sample = 0;
};
// server -> consumer: the answer to the last Seek, in order with the descriptors: every
// descriptor after it starts at the sought position. available=false ("position unavailable",
// not fatal: the consumer stays attached and may seek again): `message` names the position,
// what the server still has and the fix.
struct SeekReply {
  uint64_t epoch = 0;
  uint64_t sample = 0;
  bool available = true;
  std::string message;
};

// consumer -> server, relaxed order: part of the set of samples the consumer had in epoch
// `epoch` before it left, sent ahead of the Seek that resumes that epoch after them
// (docs/stream.md, "Order"): bit i of words[k] is dataset index 64 * (first_word + k) + i. A set
// that one frame cannot hold goes in several parts; words without a bit may be left out
// (had_parts). The server checks the set against the consumer's shard at the Seek.
struct HadSamples {
  uint64_t epoch = 0;
  uint64_t first_word = 0;
  std::vector<uint64_t> words;
};
// The most words one HadSamples frame carries.
constexpr size_t kMaxHadWords = (kMaxMessageBytes - 64) / sizeof(uint64_t);

// The type code on the wire is the index in this variant + 1: append, never reorder.
using Message = std::variant<Hello, Welcome, ChunkDescriptor, Credit, Release, Heartbeat, Goodbye,
                             End, ErrorMessage, Seek, SeekReply, HadSamples>;

std::string encode(const Message& message);

struct DecodeResult {
  std::optional<Message> message;
  std::string error;  // why the frame was rejected, when message is empty
};
DecodeResult decode(const void* data, size_t size);

// The HadSamples frames that carry `bits` (a bit per dataset index) of epoch `epoch`, in order:
// each at most kMaxHadWords words, starting and ending with a word that has a bit (the empty
// words between parts left out); none for an empty set.
std::vector<HadSamples> had_parts(uint64_t epoch, const std::vector<uint64_t>& bits);

}  // namespace batchcast::protocol
