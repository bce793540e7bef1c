// GPU pool end to end, with real processes: `batchcast serve --device cuda:0` and consumer
// processes (cuda_probe_consumer) that read each batch with a delayed kernel after releasing it.
// Checks: every byte right (synthetic source), no slot rewritten while a kernel still read it,
// consumers with the same batch size get identical bytes, spanning batches are copied on the
// device, and a GPU image server's normalised output equals the CPU server's bit for bit.
// Each test skips itself ("no CUDA device: ...") where no GPU is usable.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <memory>
#include <set>

#include "shm/cuda_pool.h"
#include "tests/cpp/support/processes.h"

namespace batchcast::testing {
namespace {

std::string cuda_probe_bin() { return build_path("tests/cpp/cuda/cuda_probe_consumer"); }

#define REQUIRE_GPU()                                                                \
  if (cuda_device_count() == 0)                                                      \
  GTEST_SKIP() << "no CUDA device: GPU transport tests need one (they run on the GPU " \
                  "machine, see scripts/README.md)"

std::vector<std::string> batch_lines(const ChildProcess& p) {
  std::vector<std::string> out;
  for (const auto& l : p.out_lines())
    if (l.rfind("B ", 0) == 0) out.push_back(l);
  return out;
}

TEST(CudaTransport, TwoConsumersSeeIdenticalBytesAndNoOverwrite) {
  REQUIRE_GPU();
  auto ep = unique_endpoint("cuda2");
  // 4 slots, 16-sample chunks, 2 epochs: every slot is reused many times while consumers'
  // kernels still read (500 us delay each).
  ChildProcess server({batchcast_bin(), "serve", "--synthetic", "300", "--sample-bytes", "3000",
                       "--batch-size", "16", "--ring", "4", "--device", "cuda:0", "--epochs", "2",
                       "--min-consumers", "2", "--workers", "4", "--endpoint", ep,
                       "--status-interval", "0"});
  ChildProcess a({cuda_probe_bin(), "--endpoint", ep, "--synthetic", "--delay-us", "500"});
  ChildProcess b({cuda_probe_bin(), "--endpoint", ep, "--synthetic", "--delay-us", "500"});
  EXPECT_EQ(a.wait(120), 0) << a.err();
  EXPECT_EQ(b.wait(120), 0) << b.err();
  EXPECT_EQ(server.wait(30), 0) << server.err();
  auto la = batch_lines(a), lb = batch_lines(b);
  EXPECT_EQ(la, lb);
  EXPECT_EQ(la.size(), 2u * ((300 + 15) / 16));
  for (const auto& l : la) EXPECT_NE(l.find(" 0 cuda "), std::string::npos) << l;  // zero-copy
}

TEST(CudaTransport, SpanningBatchesAreCopiedOnTheDevice) {
  REQUIRE_GPU();
  auto ep = unique_endpoint("cudacopy");
  ChildProcess server({batchcast_bin(), "serve", "--synthetic", "200", "--sample-bytes", "1000",
                       "--batch-size", "16", "--ring", "4", "--device", "cuda:0", "--epochs", "1",
                       "--endpoint", ep, "--status-interval", "0"});
  ChildProcess c({cuda_probe_bin(), "--endpoint", ep, "--synthetic", "--batch-size", "24",
                  "--max-held", "1", "--delay-us", "200"});
  EXPECT_EQ(c.wait(120), 0) << c.err();
  EXPECT_EQ(server.wait(30), 0) << server.err();
  auto lines = batch_lines(c);
  EXPECT_EQ(lines.size(), (200u + 23) / 24);
  size_t copied = 0;
  for (const auto& l : lines) copied += l.find(" 1 cuda ") != std::string::npos;
  EXPECT_GT(copied, 0u);
}

// `--device all`: the pool on every GPU; one consumer per GPU, each reading on its own, all get
// the same bytes (on a one-GPU machine, the one GPU: the list form and the arena choice run).
TEST(CudaTransport, APoolOnEveryGpuServesEachConsumerOnItsOwn) {
  REQUIRE_GPU();
  const int gpus = cuda_device_count();
  auto ep = unique_endpoint("cudaall");
  ChildProcess server({batchcast_bin(), "serve", "--synthetic", "200", "--sample-bytes", "3000",
                       "--batch-size", "16", "--ring", "4", "--device", "all", "--epochs", "1",
                       "--min-consumers", std::to_string(gpus), "--endpoint", ep,
                       "--status-interval", "0"});
  std::vector<std::unique_ptr<ChildProcess>> consumers;
  for (int g = 0; g < gpus; ++g)
    consumers.push_back(std::make_unique<ChildProcess>(
        std::vector<std::string>{cuda_probe_bin(), "--endpoint", ep, "--synthetic", "--delay-us",
                                 "200", "--cuda-device", std::to_string(g)}));
  std::vector<std::string> first;
  for (int g = 0; g < gpus; ++g) {
    EXPECT_EQ(consumers[g]->wait(120), 0) << consumers[g]->err();
    auto lines = batch_lines(*consumers[g]);
    EXPECT_EQ(lines.size(), (200u + 15) / 16) << "consumer on cuda:" << g;
    if (g == 0) first = lines;
    EXPECT_EQ(lines, first) << "consumer on cuda:" << g;
  }
  EXPECT_EQ(server.wait(30), 0) << server.err();
  if (gpus > 1) {
    EXPECT_NE(server.err().find("every chunk copied"), std::string::npos) << server.err();
  }
}

TEST(CudaTransport, ConsumerOnAnotherGpuIsAClearError) {
  REQUIRE_GPU();
  auto ep = unique_endpoint("cudaother");
  ChildProcess server({batchcast_bin(), "serve", "--synthetic", "32", "--batch-size", "16",
                       "--device", "cuda:0", "--endpoint", ep, "--status-interval", "0"});
  ChildProcess c({cuda_probe_bin(), "--endpoint", ep, "--cuda-device", "7"});
  EXPECT_EQ(c.wait(60), 4);
  EXPECT_NE(c.err().find("zero-copy tensors only on the pool's GPUs"), std::string::npos)
      << c.err();
  server.signal(SIGTERM);
  server.wait(30);
}

// Builds an ImageFolder of the JPEGs in the fuzz corpus (2 classes).
std::string make_image_folder() {
  namespace fs = std::filesystem;
  fs::path root = fs::temp_directory_path() / ("bc-cuda-images-" + std::to_string(::getpid()));
  fs::remove_all(root);
  int n = 0;
  for (const auto& e : fs::directory_iterator(std::string(BATCHCAST_SOURCE_DIR) +
                                              "/tests/fuzz/corpus/decode")) {
    if (e.path().extension() != ".jpg") continue;
    for (const char* cls : {"a", "b"}) {
      fs::create_directories(root / cls);
      fs::copy_file(e.path(), root / cls / (std::to_string(n++) + ".jpg"));
    }
  }
  return root.string();
}

TEST(CudaTransport, GpuNormalisationMatchesCpuServer) {
  REQUIRE_GPU();
  auto dir = make_image_folder();
  for (std::string output : {"float32", "float16", "bfloat16", "uint8"}) {
    std::map<std::string, std::vector<std::string>> hashes;
    for (std::string device : {"cpu", "cuda:0"}) {
      auto ep = unique_endpoint("img");
      ChildProcess server({batchcast_bin(), "serve", "--data", dir, "--batch-size", "4",
                           "--image-size", "64", "--output", output, "--device", device,
                           "--no-shuffle", "--seed", "3", "--endpoint", ep, "--status-interval",
                           "0"});
      ChildProcess c({cuda_probe_bin(), "--endpoint", ep});
      ASSERT_EQ(c.wait(120), 0) << c.err() << server.err();
      EXPECT_EQ(server.wait(30), 0) << server.err();
      for (auto l : batch_lines(c)) {
        auto cut = l.find(device == "cpu" ? " cpu " : " cuda ");
        ASSERT_NE(cut, std::string::npos) << l;
        hashes[device].push_back(l.substr(0, cut) + l.substr(l.rfind(' ')));
      }
    }
    EXPECT_FALSE(hashes["cpu"].empty());
    EXPECT_EQ(hashes["cpu"], hashes["cuda:0"]) << "output " << output;
  }
  std::filesystem::remove_all(dir);
}

// --decoder nvjpeg with the corpus's JPEGs (baseline, 4:4:4, 4:2:2, progressive, gray, CMYK: the
// hardware engine, the hybrid backend and the CPU fallback all take part), 2 slots reused while
// two consumers' delayed kernels read them. Pixel agreement with the CPU decoder is checked in
// tests/python/test_cuda.py.
TEST(CudaTransport, NvjpegDecoderServesEveryConsumerTheSameBatches) {
  REQUIRE_GPU();
#ifndef BATCHCAST_TEST_NVJPEG
  GTEST_SKIP() << "this build has no nvJPEG (no nvjpeg.h in its CUDA toolkit)";
#endif
  auto dir = make_image_folder();
  size_t images = 0;
  for (auto it = std::filesystem::recursive_directory_iterator(dir);
       it != std::filesystem::recursive_directory_iterator(); ++it)
    images += it->is_regular_file();
  auto ep = unique_endpoint("nvjpeg");
  ChildProcess server({batchcast_bin(), "serve", "--data", dir, "--batch-size", "4",
                       "--image-size", "64", "--device", "cuda:0", "--decoder", "nvjpeg",
                       "--epochs", "2", "--ring", "2", "--min-consumers", "2", "--endpoint", ep,
                       "--status-interval", "0"});
  ChildProcess a({cuda_probe_bin(), "--endpoint", ep, "--delay-us", "300"});
  ChildProcess b({cuda_probe_bin(), "--endpoint", ep, "--delay-us", "300"});
  EXPECT_EQ(a.wait(120), 0) << a.err() << server.err();
  EXPECT_EQ(b.wait(120), 0) << b.err();
  EXPECT_EQ(server.wait(30), 0) << server.err();
  EXPECT_NE(server.err().find("nvJPEG decoder on cuda:0"), std::string::npos) << server.err();
  auto la = batch_lines(a), lb = batch_lines(b);
  EXPECT_EQ(la, lb);
  EXPECT_EQ(la.size(), 2 * ((images + 3) / 4));
  for (const auto& l : la) EXPECT_NE(l.find(" 0 cuda "), std::string::npos) << l;  // zero-copy
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace batchcast::testing
