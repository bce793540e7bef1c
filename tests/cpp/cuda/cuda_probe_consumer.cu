// cuda_probe_consumer: a consumer process for the GPU transport tests (host pools work too). For
// every batch it makes its own stream wait for the server (Batch::use_on_stream), launches a
// kernel that first spins for --delay-us and only then copies the batch's bytes (so a slot the
// server rewrote too early would show up as wrong bytes), drops the batch at once (its release
// then waits for that kernel), copies the bytes back and checks them. One line per batch:
//   B <epoch> <sample_start> <size> <copied> <device> <fnv hash of every tensor's bytes>
//   E <epoch>                                  (epoch end)
//   S <batches> <samples> <skipped> <copies>   (at the end)
// --synthetic: also check every byte against synthetic_byte(label, j) (tensor 0 = payload).
// Exit code 0 on success, 3 on a byte mismatch, 4 on an error (message on stderr).
#include <cuda_runtime_api.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstring>
#include <vector>

#include "client/consumer.h"
#include "common/cuda_check.h"
#include "server/produce/synthetic_source.h"
#include "shm/cuda_pool.h"

namespace {

__global__ void delayed_copy(const uint8_t* src, uint8_t* dst, uint64_t bytes, long long cycles) {
  long long start = clock64();
  while (clock64() - start < cycles) {
  }
  for (uint64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < bytes;
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x)
    dst[i] = src[i];
}

uint64_t contiguous_bytes(const batchcast::TensorView& t) {
  uint64_t n = batchcast::dtype_size(t.dtype);
  for (auto d : t.shape) n *= static_cast<uint64_t>(d);
  return n;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace batchcast;
  ConsumerOptions o;
  int delay_us = 0;
  bool synthetic = false;
  CLI::App app{"CUDA probe consumer"};
  app.add_option("--endpoint", o.endpoint)->required();
  app.add_option("--batch-size", o.batch_size);
  app.add_option("--max-held", o.max_held);
  app.add_option("--timeout", o.timeout_s);
  app.add_option("--cuda-device", o.cuda_device);
  app.add_option("--delay-us", delay_us, "device-side delay before each batch is read");
  app.add_flag("--synthetic", synthetic, "check bytes against the synthetic source");
  CLI11_PARSE(app, argc, argv);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  try {
    Consumer consumer(o);
    CudaStream stream;
    int clock_khz = 1000000;
    bool on_gpu = consumer.welcome().device == protocol::DeviceKind::kCuda;
    if (on_gpu) {
      const int device = consumer.cuda_device();
      cuda_check(cudaSetDevice(device), "cudaSetDevice");
      stream = CudaStream::create();
      cuda_check(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, device), "clock rate");
    }
    bool in_epoch = false;
    while (!consumer.finished()) {
      auto b = consumer.next();
      if (!b) {
        if (in_epoch) std::printf("E %llu\n", static_cast<unsigned long long>(consumer.epoch()));
        in_epoch = false;
        continue;
      }
      in_epoch = true;
      std::vector<std::vector<uint8_t>> host(b->tensors.size());
      std::vector<DeviceBuffer> copies;
      if (on_gpu) b->use_on_stream(reinterpret_cast<uintptr_t>(stream.get()));
      for (size_t t = 0; t < b->tensors.size(); ++t) {
        const auto& v = b->tensors[t];
        uint64_t bytes = contiguous_bytes(v);
        host[t].resize(bytes);
        if (v.device != protocol::DeviceKind::kCuda) {
          std::memcpy(host[t].data(), v.data, bytes);
          continue;
        }
        copies.push_back(DeviceBuffer::allocate(std::max<uint64_t>(bytes, 1)));
        long long cycles = static_cast<long long>(delay_us) * clock_khz / 1000;
        delayed_copy<<<64, 256, 0, stream.get()>>>(static_cast<const uint8_t*>(v.data),
                                                   copies.back().data(), bytes, cycles);
        cuda_check(cudaGetLastError(), "delayed_copy launch");
      }
      bool copied = b->copied;
      uint64_t epoch = b->epoch, start = b->sample_start;
      uint32_t size = b->size;
      std::string device = on_gpu ? "cuda" : "cpu";
      b.reset();  // release now: the server must not rewrite the slot before the kernel ran
      if (on_gpu) {
        size_t c = 0;
        for (size_t t = 0; t < host.size(); ++t) {
          cuda_check(cudaMemcpyAsync(host[t].data(), copies[c++].data(), host[t].size(),
                                     cudaMemcpyDeviceToHost, stream.get()),
                     "copy back");
        }
        cuda_check(cudaStreamSynchronize(stream.get()), "stream synchronize");
      }
      if (synthetic) {
        const auto* labels = reinterpret_cast<const int64_t*>(host[1].data());
        uint64_t row = host[0].size() / size;
        for (uint32_t i = 0; i < size; ++i) {
          for (uint64_t j = 0; j < row; ++j) {
            if (host[0][i * row + j] != synthetic_byte(static_cast<uint64_t>(labels[i]), j)) {
              std::fprintf(stderr, "byte %llu of sample %lld is wrong\n",
                           static_cast<unsigned long long>(j), static_cast<long long>(labels[i]));
              return 3;
            }
          }
        }
      }
      uint64_t hash = 1469598103934665603ull;
      for (const auto& h : host)
        for (uint8_t x : h) hash = (hash ^ x) * 1099511628211ull;
      std::printf("B %llu %llu %u %d %s %016llx\n", static_cast<unsigned long long>(epoch),
                  static_cast<unsigned long long>(start), size, copied ? 1 : 0, device.c_str(),
                  static_cast<unsigned long long>(hash));
    }
    auto s = consumer.stats();
    std::printf("S %llu %llu %llu %llu\n", static_cast<unsigned long long>(s.batches),
                static_cast<unsigned long long>(s.samples),
                static_cast<unsigned long long>(s.skipped),
                static_cast<unsigned long long>(s.copies));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda_probe_consumer: %s\n", e.what());
    return 4;
  }
}
