// decoders/gpu_convert.h against the CPU pipeline: a sample decoded to uint8 on the CPU and
// normalised on the GPU equals the CPU pipeline's own float32/float16/bfloat16 output, bit for
// bit (the same table, the same rounding). Skips itself without a GPU.
#include "decoders/gpu_convert.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>

#include "common/error.h"
#include "shm/cuda_pool.h"

namespace batchcast {
namespace {

std::vector<uint8_t> read_corpus(const std::string& name) {
  std::ifstream f(std::string(BATCHCAST_SOURCE_DIR) + "/tests/fuzz/corpus/decode/" + name,
                  std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

TEST(GpuConvert, TableMatchesPipelineArithmetic) {
  auto t = make_convert_table(OutputType::kFloat32, {0.485f, 0.456f, 0.406f},
                              {0.229f, 0.224f, 0.225f});
  ASSERT_EQ(t.bytes.size(), 3u * 256 * 4);
  float v;
  std::memcpy(&v, t.bytes.data() + (1 * 256 + 200) * 4, 4);
  EXPECT_EQ(v, (200.0f / 255.0f - 0.456f) / 0.224f);
  EXPECT_THROW(make_convert_table(OutputType::kUInt8, {}, {1, 1, 1}), Error);
}

TEST(GpuConvert, MatchesCpuPipelineBitForBit) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: this test needs a GPU";
  const int size = 96;
  const std::vector<std::string> files = {"baseline_420.jpg", "q95_444.jpg", "progressive.jpg",
                                          "gray.jpg"};
  for (OutputType out : {OutputType::kFloat32, OutputType::kFloat16, OutputType::kBFloat16}) {
    PipelineOptions po;
    po.image_size = size;
    po.seed = 11;
    po.output = OutputType::kUInt8;
    ImagePipeline u8(po);
    po.output = out;
    ImagePipeline reference(po);
    const size_t n = files.size();
    std::vector<uint8_t> hwc(n * u8.sample_bytes());
    std::vector<uint8_t> expected(n * reference.sample_bytes());
    for (size_t i = 0; i < n; ++i) {
      auto bytes = read_corpus(files[i]);
      ASSERT_FALSE(bytes.empty()) << files[i];
      u8.process_bytes(bytes.data(), bytes.size(), files[i], 2, i, &hwc[i * u8.sample_bytes()]);
      reference.process_bytes(bytes.data(), bytes.size(), files[i], 2, i,
                              &expected[i * reference.sample_bytes()]);
    }
    auto table = make_convert_table(out, po.mean, po.std);
    auto d_in = DeviceBuffer::allocate(hwc.size());
    auto d_out = DeviceBuffer::allocate(expected.size());
    auto d_table = DeviceBuffer::allocate(table.bytes.size());
    auto stream = CudaStream::create();
    cuda_check(cudaMemcpy(d_in.data(), hwc.data(), hwc.size(), cudaMemcpyHostToDevice), "in");
    cuda_check(cudaMemcpy(d_table.data(), table.bytes.data(), table.bytes.size(),
                          cudaMemcpyHostToDevice),
               "table");
    launch_hwc_to_chw(d_in.data(), d_out.data(), static_cast<uint32_t>(n), size, size,
                      d_table.data(), table.element_bytes, stream.get());
    std::vector<uint8_t> got(expected.size());
    cuda_check(cudaMemcpyAsync(got.data(), d_out.data(), got.size(), cudaMemcpyDeviceToHost,
                               stream.get()),
               "out");
    cuda_check(cudaStreamSynchronize(stream.get()), "sync");
    EXPECT_EQ(got, expected) << "output " << output_type_name(out);
  }
}

}  // namespace
}  // namespace batchcast
