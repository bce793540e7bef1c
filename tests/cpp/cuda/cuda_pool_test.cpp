// shm/cuda_pool.h: "no GPU" is a value, RAII owners move, the arena exports what consumers need.
// Tests that need a device skip themselves ("no CUDA device: ...") where there is none.
#include "shm/cuda_pool.h"

#include <gtest/gtest.h>

#include <vector>

#include "common/cuda_check.h"
#include "common/error.h"
#include "shm/arena_set.h"

namespace batchcast {
namespace {

#define REQUIRE_GPU() \
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: this test needs a GPU"

TEST(CudaPool, DeviceCountIsAValueNeverAnError) { EXPECT_GE(cuda_device_count(), 0); }

TEST(CudaPool, WithoutGpuArenaCreationFailsClearly) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "a GPU is present: this checks the no-GPU path";
  try {
    DeviceArena::create(0, 2, 4096);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no CUDA device"), std::string::npos) << e.what();
  }
}

TEST(CudaPool, DeviceIndexOutOfRangeNamesTheRange) {
  REQUIRE_GPU();
  int n = cuda_device_count();
  try {
    require_cuda_device(n);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("CUDA_VISIBLE_DEVICES"), std::string::npos) << e.what();
  }
}

// --device GPU-<uuid> (or MIG-<uuid> inside an instance) finds the device CUDA numbers.
TEST(CudaPool, ADeviceNamedByItsUuidIsFoundAndAnUnseenOneNamesTheFix) {
  REQUIRE_GPU();
  auto devices = visible_cuda_devices();
  ASSERT_FALSE(devices.empty());
  const VisibleDevice& first = devices.front();
  EXPECT_EQ(first.uuid, cuda_device_uuid(0));
  auto spec = parse_device_spec(format_device_uuid(first.uuid, is_mig_device(first.name)));
  ASSERT_TRUE(spec);
  EXPECT_EQ(require_cuda_device(*spec), 0);
  DeviceSpec unseen = *spec;
  unseen.uuid[0] ^= 0xff;
  try {
    require_cuda_device(unseen);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("CUDA_VISIBLE_DEVICES="), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(describe_device(first)), std::string::npos) << e.what();
  }
}

// pin_memory: a read-only host range is page-locked in place (or says why) and reads the same.
TEST(CudaPool, AReadOnlyHostRangeIsPageLockedOrSaysWhy) {
  REQUIRE_GPU();
  std::vector<uint8_t> host(1 << 20, 7);
  std::string why;
  auto reg = HostRegistration::try_register(host.data(), host.size(), 0, /*read_only=*/true, &why);
  EXPECT_NE(reg.has_value(), !why.empty()) << why;
  if (!reg) GTEST_SKIP() << "not page-locked here: " << why;
  auto dev = DeviceBuffer::allocate(host.size());
  cuda_check(cudaMemcpy(dev.data(), host.data(), host.size(), cudaMemcpyHostToDevice), "copy");
  uint8_t back = 0;
  cuda_check(cudaMemcpy(&back, dev.data() + 12345, 1, cudaMemcpyDeviceToHost), "copy back");
  EXPECT_EQ(back, 7);
}

TEST(CudaPool, ArenaExportsMemoryAndOneEventPerSlot) {
  REQUIRE_GPU();
  auto arena = DeviceArena::create(0, 3, 1 << 20);
  EXPECT_EQ(arena.slot_count(), 3u);
  EXPECT_EQ(arena.event_handles().size(), 3u);
  EXPECT_EQ(arena.slot_data(2) - arena.slot_data(0), 2 << 20);
  IpcHandleBytes zero{};
  EXPECT_NE(arena.memory_handle(), zero);
  EXPECT_EQ(cuda_device_by_uuid(arena.device_uuid()), 0);
  // The slots are real device memory.
  std::vector<uint8_t> in(1 << 20, 7), out(1 << 20, 0);
  cuda_check(cudaMemcpy(arena.slot_data(1), in.data(), in.size(), cudaMemcpyHostToDevice), "up");
  cuda_check(cudaMemcpy(out.data(), arena.slot_data(1), out.size(), cudaMemcpyDeviceToHost),
             "down");
  EXPECT_EQ(in, out);
  // A never-recorded event counts as complete (the producer relies on it for fresh slots).
  EXPECT_EQ(cudaEventQuery(arena.slot_event(0)), cudaSuccess);
}

TEST(CudaPool, OwnersMoveTheirHandles) {
  REQUIRE_GPU();
  auto pinned = PinnedBuffer::allocate(4096);
  uint8_t* p = pinned.data();
  PinnedBuffer moved = std::move(pinned);
  EXPECT_EQ(pinned.data(), nullptr);
  EXPECT_EQ(moved.data(), p);
  auto device = DeviceBuffer::allocate(4096);
  DeviceBuffer other;
  other = std::move(device);
  EXPECT_EQ(device.data(), nullptr);
  EXPECT_NE(other.data(), nullptr);
  auto stream = CudaStream::create();
  CudaStream s2 = std::move(stream);
  EXPECT_EQ(stream.get(), nullptr);
  auto e = CudaEvent::create(true);
  EXPECT_NO_THROW(e.ipc_handle());
}

// A pool on several GPUs: what the producer writes into the primary arena's slot reaches every
// other arena once replicate() ran, and wait_for_slot() covers the copies. On a machine with one
// GPU both arenas are on it (the server refuses that; the copy path is the same).
TEST(CudaPool, ASlotWrittenOnThePrimaryIsCopiedToEveryArena) {
  REQUIRE_GPU();
  const int second = cuda_device_count() > 1 ? 1 : 0;
  ArenaSet arenas({0, second}, 2, 1 << 20);
  ASSERT_EQ(arenas.arenas().size(), 2u);
  EXPECT_EQ(arenas.arenas()[1].device(), second);
  EXPECT_NE(arenas.describe_copies().find("cuda:0 -> cuda:" + std::to_string(second)),
            std::string::npos)
      << arenas.describe_copies();
  for (uint8_t round : {1, 2}) {  // the slot rewritten after its copy: the copy follows
    std::vector<uint8_t> in(1 << 20), out(1 << 20, 0);
    for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<uint8_t>(i * 31 + round);
    arenas.wait_for_slot(1);
    auto stream = CudaStream::create();
    const DeviceArena& primary = arenas.primary();
    cuda_check(cudaMemcpyAsync(primary.slot_data(1), in.data(), in.size(), cudaMemcpyHostToDevice,
                               stream.get()),
               "up");
    cuda_check(cudaEventRecord(primary.slot_event(1), stream.get()), "record");
    arenas.replicate(1, in.size(), stream.get());
    arenas.wait_for_slot(1);
    CudaDeviceGuard guard(second);
    cuda_check(
        cudaMemcpy(out.data(), arenas.arenas()[1].slot_data(1), out.size(), cudaMemcpyDeviceToHost),
        "down");
    EXPECT_EQ(in, out) << "round " << int(round);
  }
}

TEST(CudaPool, DeviceGuardRestoresTheCurrentDevice) {
  REQUIRE_GPU();
  cuda_check(cudaSetDevice(0), "cudaSetDevice");
  { CudaDeviceGuard g(cuda_device_count() - 1); }
  int d = -1;
  cuda_check(cudaGetDevice(&d), "cudaGetDevice");
  EXPECT_EQ(d, 0);
}

}  // namespace
}  // namespace batchcast
