// The wire codec: every message round-trips, and every kind of malformed frame is rejected with
// a reason instead of being trusted.
#include "protocol/messages.h"

#include <gtest/gtest.h>

#include <cstring>

#include "common/error.h"
#include "protocol/descriptor_checks.h"

namespace batchcast::protocol {
namespace {

ChunkDescriptor sample_descriptor() {
  ChunkDescriptor d;
  d.seq = 42;
  d.position = {3, 5, 320, 64, 1000, true};
  d.position.stream_position = 3320;
  d.slot = 2;
  d.tensors.push_back({"#0", DType::kFloat32, {64, 3, 8, 8}, {192, 64, 8, 1}, 0});
  d.tensors.push_back({"#1", DType::kInt64, {64}, {1}, 49152});
  return d;
}

template <typename T>
T round_trip(const T& m) {
  auto bytes = encode(m);
  auto r = decode(bytes.data(), bytes.size());
  EXPECT_TRUE(r.message) << r.error;
  return std::get<T>(*r.message);
}

TEST(Messages, EveryTypeRoundTrips) {
  Hello h{1234, "boot", "trainer-1", LateJoin::kNextEpoch, 1, 2.5, "size=160,crop=center"};
  h.order = Order::kRelaxed;
  auto h2 = round_trip(h);
  EXPECT_EQ(h2.order, Order::kRelaxed);
  EXPECT_EQ(round_trip(Hello{}).order, Order::kServer);
  EXPECT_EQ(h2.pid, 1234u);
  EXPECT_EQ(h2.name, "trainer-1");
  EXPECT_EQ(h2.late_join, LateJoin::kNextEpoch);
  EXPECT_EQ(h2.view, "size=160,crop=center");
  EXPECT_EQ(h2.stall_timeout_s, 2.5);

  Welcome w;
  w.consumer_id = 7;
  w.segment_name = "batchcast.0.abc";
  w.slot_count = 8;
  w.slot_bytes = 4096;
  w.order = Order::kRelaxed;
  auto w2 = round_trip(w);
  EXPECT_EQ(w2.order, Order::kRelaxed);
  Welcome plain;
  plain.slot_count = plain.slot_bytes = 1;
  EXPECT_EQ(round_trip(plain).order, Order::kExact);
  EXPECT_EQ(w2.consumer_id, 7u);
  EXPECT_EQ(w2.segment_name, w.segment_name);
  EXPECT_TRUE(w2.cuda_arenas.empty());
  // A GPU pool on two GPUs: an arena each, its UUID, memory handle and one event per slot.
  w.device = DeviceKind::kCuda;
  for (uint8_t gpu : {1, 2}) {
    CudaArena& a = w.cuda_arenas.emplace_back();
    a.device_uuid[0] = gpu;
    a.memory_handle[63] = gpu;
    a.event_handles.resize(8);
    a.event_handles[7][0] = gpu;
  }
  auto g = round_trip(w);
  ASSERT_EQ(g.cuda_arenas.size(), 2u);
  for (uint8_t gpu : {1, 2}) {
    EXPECT_EQ(g.cuda_arenas[gpu - 1].device_uuid[0], gpu);
    EXPECT_EQ(g.cuda_arenas[gpu - 1].memory_handle[63], gpu);
    ASSERT_EQ(g.cuda_arenas[gpu - 1].event_handles.size(), 8u);
    EXPECT_EQ(g.cuda_arenas[gpu - 1].event_handles[7][0], gpu);
  }
  // An arena short of one event per slot, or a GPU pool without arenas, is malformed.
  auto error_of = [](const Welcome& m) {
    const std::string bytes = encode(m);
    auto r = decode(bytes.data(), bytes.size());
    EXPECT_FALSE(r.message) << "accepted a malformed Welcome";
    return r.error;
  };
  w.cuda_arenas[1].event_handles.pop_back();
  EXPECT_NE(error_of(w).find("event handles"), std::string::npos) << error_of(w);
  w.cuda_arenas.clear();
  EXPECT_NE(error_of(w).find("without arenas"), std::string::npos) << error_of(w);

  auto d = sample_descriptor();
  auto d2 = round_trip(d);
  EXPECT_EQ(d2.seq, d.seq);
  EXPECT_EQ(d2.position.epoch, 3u);
  EXPECT_EQ(d2.position.index_in_epoch, 5u);
  EXPECT_EQ(d2.position.sample_start, 320u);
  EXPECT_EQ(d2.position.sample_count, 64u);
  EXPECT_EQ(d2.position.epoch_samples, 1000u);
  EXPECT_TRUE(d2.position.epoch_end);
  EXPECT_EQ(d2.position.stream_position, d.position.stream_position);
  ASSERT_EQ(d2.tensors.size(), 2u);
  EXPECT_EQ(d2.tensors[0], d.tensors[0]);
  EXPECT_EQ(d2.tensors[1], d.tensors[1]);
  EXPECT_TRUE(d2.take.empty());
  EXPECT_TRUE(d2.samples.empty());
  // A relaxed consumer's descriptor: the rows it takes of the slot's chunk, and their samples.
  d.take = {0, 2, 5, 63};
  d.samples = {900, 3, 4000000000u, 17};
  d.position.sample_count = 4;
  EXPECT_EQ(round_trip(d).take, d.take);
  EXPECT_EQ(round_trip(d).samples, d.samples);

  EXPECT_EQ(round_trip(Credit{3}).chunks, 3u);
  EXPECT_EQ(round_trip(Release{9, 1}).seq, 9u);
  EXPECT_EQ(round_trip(Heartbeat{100, 1.5}).samples, 100u);
  EXPECT_EQ(round_trip(Heartbeat{0, 0, "consumer 2 (pid 7)"}).waiting_for, "consumer 2 (pid 7)");
  round_trip(Goodbye{});
  EXPECT_EQ(round_trip(End{4}).epochs, 4u);
  EXPECT_EQ(round_trip(ErrorMessage{"img.jpg: truncated"}).message, "img.jpg: truncated");
  auto seek = round_trip(Seek{3, 130});
  EXPECT_EQ(seek.epoch, 3u);
  EXPECT_EQ(seek.sample, 130u);
  auto reply = round_trip(SeekReply{3, 130, false, "position unavailable"});
  EXPECT_EQ(reply.epoch, 3u);
  EXPECT_EQ(reply.sample, 130u);
  EXPECT_FALSE(reply.available);
  EXPECT_EQ(reply.message, "position unavailable");
  EXPECT_TRUE(round_trip(SeekReply{1, 0, true, ""}).available);
  auto had = round_trip(HadSamples{5, 2, {1, 0, ~uint64_t{0}}});
  EXPECT_EQ(had.epoch, 5u);
  EXPECT_EQ(had.first_word, 2u);
  EXPECT_EQ(had.words, (std::vector<uint64_t>{1, 0, ~uint64_t{0}}));
}

std::string rejected(const std::string& bytes) {
  auto r = decode(bytes.data(), bytes.size());
  EXPECT_FALSE(r.message) << "accepted a malformed frame";
  return r.error;
}

// Version 2 only added types: the frames of version 1's messages keep their bodies, and the
// new types take the next codes.
TEST(Messages, NewTypesAreAppended) {
  EXPECT_EQ(encode(Seek{}).substr(6, 2), std::string("\x0a\x00", 2));
  EXPECT_EQ(encode(SeekReply{}).substr(6, 2), std::string("\x0b\x00", 2));
  EXPECT_EQ(encode(HadSamples{}).substr(6, 2), std::string("\x0c\x00", 2));
  EXPECT_EQ(encode(End{4}).substr(4), std::string("\x07\x00\x08\x00\x04\0\0\0\0\0\0\0", 12))
      << "version 7, End's body unchanged";
}

// A peer of the previous version is refused, the message naming both versions and the fix.
TEST(Messages, AnOlderPeerIsToldWhichSideToUpgrade) {
  auto v6 = encode(Hello{});
  v6[4] = 6;
  const std::string error = rejected(v6);
  EXPECT_NE(error.find("protocol version 6 (this side speaks 7); upgrade the older side"),
            std::string::npos)
      << error;
}

TEST(Messages, MalformedFramesAreRejectedWithAReason) {
  auto good = encode(sample_descriptor());
  EXPECT_NE(rejected("").find("header"), std::string::npos);
  EXPECT_NE(rejected(good.substr(0, 5)).find("header"), std::string::npos);
  for (size_t cut = 8; cut < good.size(); cut += 7)
    EXPECT_FALSE(rejected(good.substr(0, cut)).empty()) << "truncated at " << cut;
  EXPECT_NE(rejected(good + "x").find("trailing"), std::string::npos);

  auto bad_magic = good;
  bad_magic[0] ^= 0xff;
  EXPECT_NE(rejected(bad_magic).find("magic"), std::string::npos);
  auto bad_version = good;
  bad_version[4] = 99;
  EXPECT_NE(rejected(bad_version).find("version"), std::string::npos);
  auto bad_type = good;
  bad_type[6] = 77;
  EXPECT_NE(rejected(bad_type).find("type"), std::string::npos);
  EXPECT_NE(rejected(std::string(kMaxMessageBytes + 1, 'x')).find("limit"), std::string::npos);
}

TEST(Messages, FieldsOutOfRangeAreRejected) {
  auto d = sample_descriptor();
  auto unknown_flag = encode(d);
  // The flags byte follows the header, seq, position fields and stream_position.
  unknown_flag[8 + 8 + (3 * 8 + 4 + 8) + 8] = '\x80';
  EXPECT_NE(rejected(unknown_flag).find("flags"), std::string::npos);
  d = sample_descriptor();
  d.tensors.clear();
  EXPECT_NE(rejected(encode(d)).find("tensor count"), std::string::npos);
  d = sample_descriptor();
  d.tensors.resize(kMaxTensors + 1, d.tensors[0]);
  EXPECT_NE(rejected(encode(d)).find("tensor count"), std::string::npos);
  d = sample_descriptor();
  d.tensors[0].shape.assign(9, 1);
  d.tensors[0].strides.assign(9, 1);
  EXPECT_NE(rejected(encode(d)).find("rank"), std::string::npos);

  auto bytes = encode(sample_descriptor());
  // dtype byte of the first tensor: after the fixed fields and the 2-byte name "#0".
  size_t dtype_at = 8 + 8 * 4 + 4 + 8 * 2 + 1 + 4 + 1 + 2 + 2;
  ASSERT_EQ(static_cast<uint8_t>(bytes[dtype_at]), static_cast<uint8_t>(DType::kFloat32));
  bytes[dtype_at] = static_cast<char>(200);
  EXPECT_NE(rejected(bytes).find("dtype"), std::string::npos);

  EXPECT_NE(rejected(encode(Credit{0})).find("credit"), std::string::npos);
  EXPECT_NE(rejected(encode(Heartbeat{1, -1.0})).find("wait_s"), std::string::npos);
  Hello h;
  auto hb = encode(h);
  hb[hb.size() - 16] = 7;  // late_join (then device_index, stall_timeout_s, an empty view, order)
  EXPECT_NE(rejected(hb).find("late_join"), std::string::npos);
  hb = encode(h);
  hb.back() = 3;  // order
  EXPECT_NE(rejected(hb).find("unknown order value 3"), std::string::npos);
  h.stall_timeout_s = -1;
  EXPECT_NE(rejected(encode(h)).find("stall_timeout_s"), std::string::npos);
  std::string long_name(kMaxString + 1, 'n');
  EXPECT_NE(rejected(encode(ErrorMessage{long_name})).find("string"), std::string::npos);
  auto reply = encode(SeekReply{1, 2, true, ""});
  reply[reply.size() - 3] = 2;  // available
  EXPECT_NE(rejected(reply).find("seek reply"), std::string::npos);

  Welcome w;
  w.slot_count = 1;
  w.slot_bytes = 1;
  auto wb = encode(w);
  wb.back() = static_cast<char>(Order::kServer);  // order: what the server serves, never kServer
  EXPECT_NE(rejected(wb).find("a welcome's order must be exact or relaxed, not 0"),
            std::string::npos)
      << rejected(wb);

  // take: its count is bounded, and no longer than the rows the message holds (the frame ends
  // with take's count, 0 rows, then samples' count, 0).
  auto take_count_at = [](const std::string& frame) { return frame.size() - 8; };
  auto taking = encode(sample_descriptor());
  const uint32_t too_many = kMaxTakeRows + 1;
  std::memcpy(&taking[take_count_at(taking)], &too_many, 4);
  EXPECT_NE(rejected(taking).find("exceeds 65536"), std::string::npos) << rejected(taking);
  const uint32_t three = 3;
  std::memcpy(&taking[take_count_at(taking)], &three, 4);
  EXPECT_NE(rejected(taking + std::string(4, '\0')).find("longer than the message"),
            std::string::npos);
  // samples: one per row taken.
  auto d3 = sample_descriptor();
  d3.take = {0, 1, 2};
  d3.position.sample_count = 3;
  d3.samples = {7, 8};
  EXPECT_NE(rejected(encode(d3)).find("samples lists 2 dataset indices for 3 rows taken"),
            std::string::npos)
      << rejected(encode(d3));

  // HadSamples: at most a frame's words, their indices within 64 bits.
  auto had = encode(HadSamples{1, 0, {1}});
  const uint32_t too_many_words = kMaxHadWords + 1;
  std::memcpy(&had[had.size() - 12], &too_many_words, 4);
  EXPECT_NE(rejected(had).find("more than a frame's"), std::string::npos) << rejected(had);
  EXPECT_NE(rejected(encode(HadSamples{1, uint64_t{1} << 58, {1}})).find("beyond 2^64"),
            std::string::npos);
  const auto last = encode(HadSamples{1, (uint64_t{1} << 58) - 2, {1}});
  EXPECT_TRUE(decode(last.data(), last.size()).message);
}

TEST(Messages, DescriptorsAreCheckedAgainstThePool) {
  auto d = sample_descriptor();
  EXPECT_EQ(validate_descriptor(d, 4, 1 << 20), "");
  EXPECT_NE(validate_descriptor(d, 2, 1 << 20).find("slot 2 outside"), std::string::npos);
  EXPECT_NE(validate_descriptor(d, 4, 49152).find("outside its slot"), std::string::npos);
  d.tensors[1].offset = 49153;
  EXPECT_NE(validate_descriptor(d, 4, 1 << 20).find("misaligned"), std::string::npos);
  d = sample_descriptor();
  d.tensors[0].strides[0] = INT64_MAX / 2;
  EXPECT_FALSE(validate_descriptor(d, 4, 1 << 20).empty());
  d = sample_descriptor();
  d.tensors[0].shape[1] = -1;
  EXPECT_NE(validate_descriptor(d, 4, 1 << 20).find("negative"), std::string::npos);
  d = sample_descriptor();
  d.tensors[0].shape[0] = 63;
  EXPECT_NE(validate_descriptor(d, 4, 1 << 20).find("dimension 0"), std::string::npos);
  d = sample_descriptor();
  d.position.sample_start = 990;
  EXPECT_NE(validate_descriptor(d, 4, 1 << 20).find("beyond"), std::string::npos);
}

// A relaxed consumer's descriptor: the tensors describe the slot's whole chunk, `take` the rows
// this consumer reads, one per sample of its position.
TEST(Messages, RowsTakenAreCheckedAgainstTheChunk) {
  auto d = sample_descriptor();
  d.take = {0, 2, 5};
  d.position.sample_count = 3;
  d.position.epoch_samples = 0;
  EXPECT_EQ(validate_descriptor(d, 4, 1 << 20), "") << "dimension 0 is the slot's chunk";
  auto error_with = [&](std::vector<uint32_t> take) {
    auto bad = d;
    bad.take = std::move(take);
    return validate_descriptor(bad, 4, 1 << 20);
  };
  EXPECT_NE(error_with({0, 5, 2}).find("not strictly ascending"), std::string::npos);
  EXPECT_NE(error_with({0, 2, 2}).find("not strictly ascending"), std::string::npos);
  EXPECT_NE(error_with({0, 2, 64}).find("take's row 64 beyond its dimension 0 of 64"),
            std::string::npos)
      << error_with({0, 2, 64});
  EXPECT_NE(error_with({0, 2}).find("take lists 2 rows for a chunk of 3 samples"),
            std::string::npos)
      << error_with({0, 2});
  auto shorter = d;
  shorter.tensors[1].shape[0] = 5;  // every tensor's dimension 0 bounds the rows
  EXPECT_NE(validate_descriptor(shorter, 4, 1 << 20).find("tensor #1: take's row 5"),
            std::string::npos);
  auto overlapping = d;
  overlapping.tensors[0].strides[0] = 100;  // a row spans 192 elements
  EXPECT_NE(validate_descriptor(overlapping, 4, 1 << 20).find("rows overlap"), std::string::npos);
}

// A set of samples had goes in frames of at most kMaxHadWords words, each from its first word
// with a bit to its last, the empty words between left out; every bit is in one part.
TEST(Messages, SamplesHadAreSplitIntoFrames) {
  EXPECT_TRUE(had_parts(3, {}).empty());
  EXPECT_TRUE(had_parts(3, std::vector<uint64_t>(5, 0)).empty());
  std::vector<uint64_t> bits(3 * kMaxHadWords, 0);
  bits[1] = 1;
  bits[kMaxHadWords] = 2;  // a full frame: words 1 to kMaxHadWords
  bits[kMaxHadWords + 5] = uint64_t{1} << 63;
  bits[2 * kMaxHadWords + 3] = 6;
  bits.back() = 8;
  auto parts = had_parts(3, bits);
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[0].epoch, 3u);
  EXPECT_EQ(parts[0].first_word, 1u);
  EXPECT_EQ(parts[0].words.size(), kMaxHadWords);
  EXPECT_EQ(parts[0].words.back(), 2u);
  EXPECT_EQ(parts[1].first_word, kMaxHadWords + 5);
  EXPECT_EQ(parts[1].words.size(), kMaxHadWords - 1);  // its trailing empty words left out
  EXPECT_EQ(parts[1].words.back(), 6u);
  EXPECT_EQ(parts[2].first_word, bits.size() - 1);
  EXPECT_EQ(parts[2].words, std::vector<uint64_t>{8});
  std::vector<uint64_t> joined(bits.size(), 0);
  for (const auto& p : parts) {
    EXPECT_LE(encode(p).size(), kMaxMessageBytes);
    for (size_t k = 0; k < p.words.size(); ++k) joined[p.first_word + k] |= p.words[k];
  }
  EXPECT_EQ(joined, bits);
}

}  // namespace
}  // namespace batchcast::protocol
