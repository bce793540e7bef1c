// decoders/nvjpeg_decode.h: nvJPEG's pixels agree with the CPU decoder (TurboJPEG) within a few
// levels (IDCT and chroma upsampling differ: on the tiny corpus images, chroma edges dominate,
// mean 2-2.6 levels, p99 18 on the H100). Skips itself without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <iterator>

#include "common/cuda_check.h"
#include "decoders/jpeg_decode.h"
#include "decoders/nvjpeg_decode.h"
#include "shm/cuda_pool.h"

namespace batchcast {
namespace {

TEST(Nvjpeg, AgreesWithTheCpuDecoder) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: nvJPEG needs a GPU";
  NvjpegDecoder dec(0);
  std::printf("nvJPEG backend: %s\n", dec.backend());
  auto stream = CudaStream::create();
  for (std::string name : {"baseline_420.jpg", "q95_444.jpg", "odd_422.jpg", "progressive.jpg"}) {
    std::ifstream f(std::string(BATCHCAST_SOURCE_DIR) + "/tests/fuzz/corpus/decode/" + name,
                    std::ios::binary);
    std::vector<uint8_t> jpeg{std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
    JpegBytes in{jpeg.data(), jpeg.size(), name};
    int w = 0, h = 0;
    dec.dimensions(in, &w, &h);
    auto out = DeviceBuffer::allocate(static_cast<size_t>(w) * h * 3);
    dec.decode_batch({in}, {out.data()}, stream.get());
    std::vector<uint8_t> gpu(static_cast<size_t>(w) * h * 3);
    cuda_check(
        cudaMemcpyAsync(gpu.data(), out.data(), gpu.size(), cudaMemcpyDeviceToHost, stream.get()),
        "copy");
    cuda_check(cudaStreamSynchronize(stream.get()), "sync");
    RgbView cpu = decode_jpeg_full_turbo(jpeg.data(), jpeg.size(), name, ScalingFactor{});
    ASSERT_EQ(cpu.width, w) << name;
    ASSERT_EQ(cpu.height, h) << name;
    std::vector<int> diffs;
    double sum = 0;
    for (int y = 0; y < h; ++y)
      for (int x = 0; x < w * 3; ++x) {
        int d = std::abs(int(gpu[size_t(y) * w * 3 + x]) - int(cpu.pixels[y * cpu.stride + x]));
        diffs.push_back(d);
        sum += d;
      }
    std::sort(diffs.begin(), diffs.end());
    double mean = sum / diffs.size();
    int p99 = diffs[diffs.size() * 99 / 100];
    std::printf("%s %dx%d: mean |diff| %.3f, p99 %d, max %d\n", name.c_str(), w, h, mean, p99,
                diffs.back());
    EXPECT_LT(mean, 3.0) << name;
    EXPECT_LE(p99, 24) << name;
  }
}

}  // namespace
}  // namespace batchcast
