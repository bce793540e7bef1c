// Writes the seed corpus of fuzz_messages: one real encoded frame of every message type
// (protocol::encode of typical values: a host and a CUDA Welcome, descriptors as the server
// sends them for image and synthetic pools), so libFuzzer starts from valid frames instead of
// having to discover the magic, version and layout.
//   make_message_corpus OUT_DIR
#include <cstdio>
#include <fstream>
#include <string>

#include "protocol/messages.h"

int main(int argc, char** argv) {
  namespace p = batchcast::protocol;
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_message_corpus OUT_DIR\n");
    return 2;
  }
  std::string out = argv[1];
  auto write = [&](const std::string& name, const p::Message& m) {
    std::ofstream(out + "/" + name, std::ios::binary) << p::encode(m);
  };
  write("hello", p::Hello{1234, "0b6f3c1e-boot", "trainer-0", p::LateJoin::kReplay, 0});
  write("hello_next_epoch", p::Hello{99, "", "", p::LateJoin::kNextEpoch, 1});
  write("hello_relaxed",
        p::Hello{77, "", "trainer-1", p::LateJoin::kReplay, 0, 2.0, "", p::Order::kRelaxed});
  p::Welcome w;
  w.consumer_id = 7;
  w.server_pid = 4321;
  w.boot_id = "0b6f3c1e-boot";
  w.segment_name = "batchcast.0.abcdef";
  w.segment_bytes = 8 * (1 << 20) + 4096;
  w.slot_count = 8;
  w.slot_bytes = 1 << 20;
  w.slots_offset = 4096;
  w.chunk_size = 64;
  w.epoch_samples = 1000;
  w.epochs = 3;
  write("welcome_host", w);
  w.order = p::Order::kRelaxed;
  write("welcome_relaxed", w);
  w.order = p::Order::kExact;
  w.device = p::DeviceKind::kCuda;
  w.slot_count = 3;
  w.cuda_arenas.resize(1);
  w.cuda_arenas[0].event_handles.resize(3);
  w.cuda_arenas[0].memory_handle[0] = 0x42;
  write("welcome_cuda", w);
  w.cuda_arenas.push_back(w.cuda_arenas[0]);  // a pool on two GPUs
  w.cuda_arenas[1].device_uuid[0] = 0x01;
  write("welcome_cuda_two_gpus", w);

  p::ChunkDescriptor d;
  d.seq = 17;
  d.position = {1, 2, 128, 64, 1000, false};
  d.position.stream_position = 1128;
  d.slot = 3;
  d.tensors.push_back({"#0", batchcast::DType::kFloat32, {64, 3, 32, 32}, {3072, 1024, 32, 1}, 0});
  d.tensors.push_back({"#1", batchcast::DType::kInt64, {64}, {1}, 64 * 3072 * 4});
  write("descriptor_image", d);
  d.position.epoch_end = true;
  d.position.sample_count = 40;
  d.position.sample_start = 960;
  d.tensors = {{"#0", batchcast::DType::kUInt8, {40, 48}, {48, 1}, 0},
               {"#1", batchcast::DType::kInt64, {40}, {1}, 1920}};
  write("descriptor_synthetic_last", d);
  d.tensors = {{"image", batchcast::DType::kUInt8, {40, 8, 8, 3}, {192, 24, 3, 1}, 0},
               {"#", batchcast::DType::kBFloat16, {40, 0}, {0, 1}, 7680}};
  write("descriptor_dict", d);
  // A relaxed consumer's: 3 rows of a slot's 40 and their samples, its own position.
  d.seq = p::kRelaxedSeqBase + 5;
  d.position = {2, 7, 21, 3, 1000, false};
  d.position.stream_position = 2021;
  d.tensors = {{"#0", batchcast::DType::kUInt8, {40, 48}, {48, 1}, 0},
               {"#1", batchcast::DType::kInt64, {40}, {1}, 1920}};
  d.take = {0, 17, 39};
  d.samples = {4711, 3, 999};
  write("descriptor_take", d);
  write("credit", p::Credit{2});
  write("release", p::Release{17, 3});
  write("heartbeat", p::Heartbeat{123456, 0.75});
  write("goodbye", p::Goodbye{});
  write("end", p::End{3});
  write("error", p::ErrorMessage{"/data/train/cat/001.jpg: truncated JPEG"});
  write("seek", p::Seek{1, 192});
  write("had_samples", p::HadSamples{1, 2, {0x8000000000000001ull, 0, 0xff}});
  write("seek_reply", p::SeekReply{1, 192, true, ""});
  write("seek_reply_unavailable",
        p::SeekReply{0, 64, false, "position unavailable: epoch 0 sample 64 is gone"});
  return 0;
}
