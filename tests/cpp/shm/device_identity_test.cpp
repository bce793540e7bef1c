// The identity rules of GPU pools (shm/device_identity.h) without a GPU: what --device accepts,
// how UUIDs are printed, and what a consumer on another device or MIG instance is told.
#include "shm/device_identity.h"

#include <gtest/gtest.h>

namespace batchcast {
namespace {

const char* kUuid = "5b7c2f1e-0a9d-4c3b-8e21-aa00ff12cd34";

DeviceUuid uuid_of(const std::string& text) { return parse_device_spec("GPU-" + text)->uuid; }

TEST(DeviceIdentity, AcceptsCpuCudaIndexAndUuids) {
  EXPECT_EQ(parse_device_spec("cpu")->kind, DeviceSpec::Kind::kCpu);
  EXPECT_EQ(parse_device_spec("cuda")->index, 0);
  EXPECT_EQ(parse_device_spec("cuda:3")->index, 3);
  auto mig = parse_device_spec(std::string("MIG-") + kUuid);
  ASSERT_TRUE(mig);
  EXPECT_EQ(mig->kind, DeviceSpec::Kind::kUuid);
  EXPECT_TRUE(mig->mig);
  EXPECT_EQ(mig->uuid[0], 0x5b);
  EXPECT_EQ(mig->uuid[15], 0x34);
  auto gpu = parse_device_spec(std::string("GPU-") + kUuid);
  ASSERT_TRUE(gpu);
  EXPECT_FALSE(gpu->mig);
  EXPECT_EQ(gpu->uuid, mig->uuid);
}

TEST(DeviceIdentity, RefusesMalformedNamesWithTheForms) {
  for (const char* bad :
       {"tpu:0", "cuda:", "cuda:x", "cuda:123456", "MIG-", "MIG-5b7c2f1e",
        "MIG-5b7c2f1e0a9d-4c3b-8e21-aa00ff12cd34-", "GPU-zz7c2f1e-0a9d-4c3b-8e21-aa00ff12cd34"}) {
    EXPECT_FALSE(parse_device_spec(bad)) << bad;
    std::string err = device_spec_error(bad);
    EXPECT_NE(err.find(bad), std::string::npos) << err;
    EXPECT_NE(err.find("MIG-<uuid>"), std::string::npos) << err;
    EXPECT_NE(err.find("cuda:K"), std::string::npos) << err;
  }
  EXPECT_EQ(device_spec_error("cuda:1"), "");
  // Drivers before R470 named instances MIG-GPU-<uuid>/gi/ci: point to the current name.
  std::string old = device_spec_error(std::string("MIG-GPU-") + kUuid + "/1/0");
  EXPECT_NE(old.find("nvidia-smi -L"), std::string::npos) << old;
}

TEST(DeviceIdentity, FormatsUuidsAsNvidiaSmi) {
  EXPECT_EQ(format_device_uuid(uuid_of(kUuid), true), std::string("MIG-") + kUuid);
  EXPECT_EQ(format_device_uuid(uuid_of(kUuid), false), std::string("GPU-") + kUuid);
  EXPECT_TRUE(is_mig_device("NVIDIA H100 80GB HBM3 MIG 1g.10gb"));
  EXPECT_FALSE(is_mig_device("NVIDIA H100 80GB HBM3"));
  EXPECT_EQ(describe_device({1, "NVIDIA H100 80GB HBM3 MIG 1g.10gb", uuid_of(kUuid)}),
            std::string("cuda:1 = NVIDIA H100 80GB HBM3 MIG 1g.10gb (MIG-") + kUuid + ")");
}

TEST(DeviceIdentity, AConsumerInAnotherMigInstanceIsToldBothAndTheFix) {
  const DeviceUuid pool = uuid_of(kUuid);
  const DeviceUuid mine = uuid_of("11111111-2222-3333-4444-555555555555");
  std::string msg =
      unreachable_pool_message({pool}, {{0, "NVIDIA H100 80GB HBM3 MIG 3g.40gb", mine}});
  EXPECT_NE(msg.find(kUuid), std::string::npos) << msg;
  EXPECT_NE(msg.find("MIG-11111111-2222-3333-4444-555555555555"), std::string::npos) << msg;
  EXPECT_NE(msg.find("cannot cross MIG instances"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--device cpu"), std::string::npos) << msg;
  EXPECT_NE(msg.find("one server per instance"), std::string::npos) << msg;
}

TEST(DeviceIdentity, AConsumerOnAnotherGpuOrNoneIsToldTheFix) {
  const DeviceUuid pool = uuid_of(kUuid);
  std::string other = unreachable_pool_message(
      {pool}, {{0, "NVIDIA H100 80GB HBM3", uuid_of("11111111-2222-3333-4444-555555555555")}});
  EXPECT_NE(other.find("GPU-11111111-2222-3333-4444-555555555555"), std::string::npos) << other;
  EXPECT_NE(other.find("CUDA_VISIBLE_DEVICES"), std::string::npos) << other;
  EXPECT_EQ(other.find("cannot cross MIG"), std::string::npos) << other;
  std::string none = unreachable_pool_message({pool}, {});
  EXPECT_NE(none.find("sees no CUDA device"), std::string::npos) << none;
  EXPECT_NE(none.find("--device cpu"), std::string::npos) << none;
}

TEST(DeviceIdentity, AServerDeviceListNamesGpusOrAll) {
  auto two = parse_device_list("cuda:0,cuda:1");
  ASSERT_TRUE(two);
  ASSERT_EQ(two->devices.size(), 2u);
  EXPECT_EQ(two->devices[1].index, 1);
  EXPECT_FALSE(two->all);
  EXPECT_TRUE(parse_device_list("all")->all);
  auto mixed = parse_device_list(std::string("cuda:0,GPU-") + kUuid);
  ASSERT_TRUE(mixed);
  EXPECT_EQ(mixed->devices[1].kind, DeviceSpec::Kind::kUuid);
  EXPECT_EQ(parse_device_list("cpu")->devices.front().kind, DeviceSpec::Kind::kCpu);
  EXPECT_TRUE(device_list_error("cuda:1").empty());
  EXPECT_NE(device_list_error("cuda:0,cpu").find("cpu stands alone"), std::string::npos);
  EXPECT_NE(device_list_error("cuda:0,gpu7").find("gpu7 is not a device"), std::string::npos)
      << device_list_error("cuda:0,gpu7");
  EXPECT_FALSE(device_list_error("cuda:0,").empty());
}

// A pool on GPUs A and B, seen by a consumer as cuda:0 = B, cuda:1 = C, cuda:2 = A.
TEST(DeviceIdentity, AConsumerReadsThePoolsArenaOnItsOwnGpu) {
  const DeviceUuid a = uuid_of(kUuid);
  const DeviceUuid b = uuid_of("11111111-2222-3333-4444-555555555555");
  const DeviceUuid c = uuid_of("66666666-7777-8888-9999-aaaaaaaaaaaa");
  const std::vector<VisibleDevice> visible = {
      {0, "NVIDIA H100 80GB HBM3", b}, {1, "NVIDIA H100 80GB HBM3", c}, {2, "NVIDIA H100", a}};
  auto on = choose_pool_arena({a, b}, visible, /*wanted=*/2, /*current=*/0);
  EXPECT_EQ(on.arena, 0);
  EXPECT_EQ(on.device, 2);
  // Not asked: the current device's arena, else the pool's first GPU this process sees.
  EXPECT_EQ(choose_pool_arena({a, b}, visible, -1, 0).arena, 1);
  auto fallback = choose_pool_arena({a, b}, visible, -1, 1);
  EXPECT_EQ(fallback.arena, 0);
  EXPECT_EQ(fallback.device, 2);
  // Asked for a GPU the pool is not on: the error names the pool's GPUs here and the fix.
  auto off = choose_pool_arena({a, b}, visible, 1, 0);
  EXPECT_EQ(off.arena, -1);
  EXPECT_NE(off.error.find("cuda:0, cuda:2"), std::string::npos) << off.error;
  EXPECT_NE(off.error.find("--device all"), std::string::npos) << off.error;
  // None of the pool's GPUs visible at all.
  auto none = choose_pool_arena({a}, {{0, "NVIDIA H100", c}}, -1, 0);
  EXPECT_EQ(none.arena, -1);
  EXPECT_NE(none.error.find("CUDA_VISIBLE_DEVICES"), std::string::npos) << none.error;
}

}  // namespace
}  // namespace batchcast
