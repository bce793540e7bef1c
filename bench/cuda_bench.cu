// cuda_bench: the GPU pool's numbers, printed as Markdown rows for bench/RESULTS.md.
//   1. host-to-device GB/s: plain pinned cudaMemcpyAsync versus the pool path (CudaStage::upload:
//      pinned staging -> device slot, raw and with the uint8 -> float32 normalisation);
//   2. publish-to-tensor latency p50/p99: an in-process StreamHost on cuda:0 publishes paced
//      chunks whose label holds the CLOCK_MONOTONIC time the CPU finished the chunk; a consumer
//      process (this program, --consumer) stops the clock once its stream has the batch;
//   3. JPEG decode images/s: nvJPEG (batched) versus the CPU decoder (TurboJPEG) on one core.
// `--decode DIR`: only 3, on DIR's JPEG files (the collocated benchmark's physical anchor: the
// engine's standalone rate); `--copies`: only how a chunk reaches every GPU of a pool.
// Needs a GPU; exits 0 with a message without one. Rows are line-buffered (a cut run keeps them).
#include <sys/wait.h>
#include <time.h>
#include <turbojpeg.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "client/consumer.h"
#include "common/cuda_check.h"
#include "common/error.h"
#include "decoders/jpeg_decode.h"
#include "server/host/stream_host.h"
#include "server/produce/cuda_stage.h"
#include "shm/cuda_pool.h"
#ifdef BATCHCAST_HAVE_NVJPEG
#include "decoders/nvjpeg_decode.h"
#endif

namespace batchcast {
namespace {

int64_t now_ns() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1000000000ll + t.tv_nsec;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

const int kImage = 224;
const uint32_t kBatch = 64;

std::vector<SampleTensor> image_tensors() {
  return {{"#0", DType::kUInt8, {kImage, kImage, 3}}, {"#1", DType::kInt64, {}}};
}

// Decoding costs nothing here (the pixels are whatever sits in staging): the bench times the
// pool path alone. The label is the CLOCK_MONOTONIC time the sample was "decoded".
class StampSource : public SampleSource {
 public:
  uint64_t size() const override { return uint64_t{1} << 40; }
  std::vector<SampleTensor> tensors() const override { return image_tensors(); }
  void fill(uint64_t, uint64_t, const std::vector<uint8_t*>& outs) const override {
    int64_t t = now_ns();
    std::memcpy(outs[1], &t, 8);
  }
};

// The images copied as they are, or normalised to float32 NCHW on the GPU; the labels as they are.
std::vector<TensorConversion> conversions(bool normalise) {
  std::vector<TensorConversion> conv(2);
  if (normalise) conv[0].normalize = DType::kFloat32;
  return conv;
}

// A GPU slot for one chunk of kBatch images under `conv`, in whole 4 KiB pages.
// A one-view pool on `arenas` (CudaStage's ViewOf).
CudaStage::ViewOf one_view(const ArenaSet& arenas, const std::vector<TensorConversion>& conv) {
  return [&arenas, conv](uint32_t) { return CudaStage::View{&arenas, conv}; };
}

// A lease of `slot` of a one-view pool, as StreamHost hands them out.
FillLease lease_of(uint64_t seq, uint32_t slot, const ArenaSet& arenas, uint64_t slot_bytes) {
  uint8_t* data = arenas.primary().slot_data(slot);
  return FillLease{seq, slot, data, slot_bytes, {data}, std::nullopt};
}

uint64_t gpu_slot_bytes(const std::vector<TensorConversion>& conv) {
  return (SlotLayout::plan(converted(image_tensors(), conv), kBatch).bytes + 4095) /
         4096 * 4096;
}

void bandwidth() {
  const size_t bytes = 256u << 20;
  auto host = PinnedBuffer::allocate(bytes);
  auto dev = DeviceBuffer::allocate(bytes);
  std::memset(host.data(), 1, bytes);
  auto stream = CudaStream::create();
  auto timed = [&](int reps, auto&& body) {
    body();
    cuda_check(cudaStreamSynchronize(stream.get()), "sync");
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) body();
    cuda_check(cudaStreamSynchronize(stream.get()), "sync");
    return seconds_since(t0);
  };
  double s = timed(20, [&] {
    cuda_check(
        cudaMemcpyAsync(dev.data(), host.data(), bytes, cudaMemcpyHostToDevice, stream.get()),
        "memcpy");
  });
  std::printf("| plain pinned cudaMemcpyAsync, 256 MiB | %.1f GB/s |\n", 20.0 * bytes / s / 1e9);

  for (bool normalise : {false, true}) {
    const auto conv = conversions(normalise);
    auto staged = image_tensors();
    const uint64_t slot_bytes = gpu_slot_bytes(conv);
    ArenaSet arenas({0}, 4, slot_bytes);
    const DeviceArena& arena = arenas.primary();
    StampSource source;
    CudaStage stage(source, one_view(arenas, conv), kBatch);
    uint64_t staged_bytes = SlotLayout::plan(staged, kBatch).bytes;
    const int chunks = 200;
    auto run = [&](int n) {
      for (int i = 0; i < n; ++i) {
        uint32_t slot = static_cast<uint32_t>(i % 4);
        const FillLease lease = lease_of(static_cast<uint64_t>(i), slot, arenas, slot_bytes);
        stage.begin(lease, kBatch);
        stage.upload(lease, kBatch);
      }
      for (uint32_t slot = 0; slot < 4; ++slot) arena.wait_for_slot(slot);
    };
    run(8);
    auto t0 = std::chrono::steady_clock::now();
    run(chunks);
    double secs = seconds_since(t0);
    std::printf(
        "| pool path (CudaStage::upload, %u x 224x224x3 uint8 chunks%s) | %.1f GB/s of "
        "staged bytes, %.0f images/s |\n",
        kBatch, normalise ? " -> float32 NCHW normalised" : ", copied as is",
        chunks * staged_bytes / secs / 1e9, chunks * kBatch / secs);
  }
}

// How a chunk reaches every GPU of a pool on several GPUs. Shipped: one upload to the
// first GPU, then peer copies to the others (ArenaSet::replicate). The alternative: one upload
// per GPU, each from pinned staging of its own (G CudaStages over one-GPU ArenaSets). Both with
// uint8 images copied as they are and converted to float32 NCHW on the GPU (the alternative then
// converts on every GPU). With one GPU the shipped path runs with both arenas on it: a smoke run
// of the code, not a measure.
void copies() {
  const int gpus = cuda_device_count();
  std::vector<int> devices;
  for (int d = 0; d < gpus; ++d) devices.push_back(d);
  if (gpus == 1) devices.push_back(0);
  const uint32_t slots = 4, chunks = 100;
  StampSource source;
  for (bool normalise : {false, true}) {
    const auto conv = conversions(normalise);
    const uint64_t slot_bytes = gpu_slot_bytes(conv);
    // Chunks per second with one CudaStage per ArenaSet of `sets`, each writing every chunk.
    auto rate = [&](const std::vector<std::unique_ptr<ArenaSet>>& sets) {
      std::vector<std::unique_ptr<CudaStage>> stages;
      for (const auto& set : sets)
        stages.push_back(std::make_unique<CudaStage>(source, one_view(*set, conv), kBatch));
      auto run = [&](uint32_t n) {
        for (uint32_t i = 0; i < n; ++i)
          for (size_t k = 0; k < stages.size(); ++k) {
            const uint32_t slot = i % slots;
            const FillLease lease = lease_of(i, slot, *sets[k], slot_bytes);
            stages[k]->begin(lease, kBatch);
            stages[k]->upload(lease, kBatch);
          }
        for (const auto& set : sets)
          for (uint32_t slot = 0; slot < slots; ++slot) set->wait_for_slot(slot);
      };
      run(8);
      auto t0 = std::chrono::steady_clock::now();
      run(chunks);
      return chunks / seconds_since(t0);
    };
    std::vector<std::unique_ptr<ArenaSet>> one, each;
    one.push_back(std::make_unique<ArenaSet>(devices, slots, slot_bytes));
    const std::string how = one.front()->describe_copies();
    const double peer = rate(one);
    one.clear();
    for (int d : devices)
      each.push_back(std::make_unique<ArenaSet>(std::vector<int>{d}, slots, slot_bytes));
    const double staged = rate(each);
    const double mib = slot_bytes / double(1 << 20);
    std::printf(
        "| a chunk on %zu GPUs (%u x 224x224x3 uint8%s, slot %.0f MiB): one upload + peer copies "
        "(%s) vs one upload per GPU | %.0f vs %.0f chunks/s (%.1f vs %.1f GB/s delivered)%s |\n",
        devices.size(), kBatch, normalise ? " -> float32 NCHW" : "", mib, how.c_str(), peer, staged,
        peer * slot_bytes * devices.size() / 1e9, staged * slot_bytes * devices.size() / 1e9,
        gpus == 1 ? "; one GPU: both arenas on it, a smoke run only" : "");
  }
}

int consumer_main(const std::string& endpoint) {
  ConsumerOptions o;
  o.endpoint = endpoint;
  Consumer consumer(o);
  cuda_check(cudaSetDevice(consumer.cuda_device()), "cudaSetDevice");
  auto stream = CudaStream::create();
  auto stamp = PinnedBuffer::allocate(8);
  std::vector<double> us;
  while (!consumer.finished()) {
    auto b = consumer.next();
    if (!b) continue;
    b->use_on_stream(reinterpret_cast<uintptr_t>(stream.get()));
    cuda_check(
        cudaMemcpyAsync(stamp.data(), b->tensors[1].data, 8, cudaMemcpyDeviceToHost, stream.get()),
        "stamp");
    cuda_check(cudaStreamSynchronize(stream.get()), "sync");
    int64_t t0;
    std::memcpy(&t0, stamp.data(), 8);
    us.push_back((now_ns() - t0) / 1e3);
  }
  std::sort(us.begin(), us.end());
  auto pct = [&](double p) { return us[std::min(us.size() - 1, size_t(p * us.size()))]; };
  std::printf("%zu %.0f %.0f\n", us.size(), pct(0.5), pct(0.99));
  return 0;
}

void latency(const char* self, bool normalise) {
  const auto conv = conversions(normalise);
  auto slot_tensors = converted(image_tensors(), conv);
  auto slot_layout = SlotLayout::plan(slot_tensors, kBatch);
  const uint32_t chunks = 1000;
  StreamHostOptions so;
  so.endpoint = "ipc:///tmp/bc-cuda-bench-" + std::to_string(::getpid()) + ".sock";
  so.ring_slots = 4;
  so.slot_bytes = slot_layout.bytes;
  so.chunk_size = kBatch;
  so.epoch_samples = uint64_t{chunks} * kBatch;
  so.epochs = 1;
  so.cuda_devices = {0};
  StreamHost core(so);
  StampSource source;
  CudaStage stage(source, one_view(*core.memory().arenas(), conv), kBatch);
  std::string ep = core.endpoint();
  int pipe_fd[2];
  if (::pipe(pipe_fd) != 0) throw Error("pipe");
  pid_t child = ::fork();
  if (child == 0) {
    ::dup2(pipe_fd[1], 1);
    ::execl("/proc/self/exe", self, "--consumer", ep.c_str(), nullptr);
    ::_exit(127);
  }
  ::close(pipe_fd[1]);
  for (uint32_t c = 0; c < chunks; ++c) {
    auto lease = core.acquire();
    if (!lease) break;
    stage.begin(*lease, kBatch);
    protocol::ChunkPosition position;
    std::vector<protocol::TensorSpec> tensors;
    position.index_in_epoch = c;
    position.sample_start = uint64_t{c} * kBatch;
    position.sample_count = kBatch;
    position.epoch_samples = uint64_t{chunks} * kBatch;
    position.epoch_end = c + 1 == chunks;
    tensors = slot_layout.specs(slot_tensors, kBatch);
    // The clock starts when the chunk's last sample is "decoded" (sample 0's label is read).
    for (uint32_t p = kBatch; p-- > 0;) stage.fill(*lease, p, c * kBatch + p, 0);
    stage.upload(*lease, kBatch);
    core.publish(*lease, position, std::move(tensors));
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // paced: no queueing
  }
  core.finish();
  char buf[256] = {0};
  ssize_t n = ::read(pipe_fd[0], buf, sizeof(buf) - 1);
  int status = 0;
  ::waitpid(child, &status, 0);
  core.wait_finished(10);
  unsigned long count = 0;
  double p50 = 0, p99 = 0;
  if (n <= 0 || std::sscanf(buf, "%lu %lf %lf", &count, &p50, &p99) != 3)
    throw Error("latency consumer failed (status " + std::to_string(status) + ")");
  std::printf(
      "| publish-to-tensor latency, %u x 224x224x3 uint8%s, %lu chunks | p50 %.0f us, "
      "p99 %.0f us |\n",
      kBatch, normalise ? " -> float32" : "", count, p50, p99);
}

// A 1024x768 photo-like JPEG (smooth gradients plus noise), quality 90, 4:2:0.
std::vector<uint8_t> make_jpeg() {
  const int w = 1024, h = 768;
  std::vector<uint8_t> rgb(w * h * 3);
  uint32_t r = 12345;
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < 3; ++c) {
        r = r * 1664525u + 1013904223u;
        rgb[(y * w + x) * 3 + c] =
            static_cast<uint8_t>((x * (c + 1) / 5 + y / 4 + (r >> 28)) & 255);
      }
  return encode_jpeg(rgb.data(), w, h, static_cast<size_t>(w) * 3, false, 90, TJSAMP_420);
}

void decode() {
  auto jpeg = make_jpeg();
  const int reps = 300;
  decode_jpeg_full_turbo(jpeg.data(), jpeg.size(), "bench.jpg", ScalingFactor{});
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i)
    decode_jpeg_full_turbo(jpeg.data(), jpeg.size(), "bench.jpg", ScalingFactor{});
  double cpu = reps / seconds_since(t0);
  std::printf(
      "| CPU decoder (TurboJPEG full decode, 1024x768 q90 4:2:0), 1 core | %.0f images/s |\n", cpu);
#ifdef BATCHCAST_HAVE_NVJPEG
  NvjpegDecoder dec(0);
  auto stream = CudaStream::create();
  for (int batch : {1, 32, 128}) {
    std::vector<JpegBytes> in(batch, JpegBytes{jpeg.data(), jpeg.size(), "bench.jpg"});
    std::vector<DeviceBuffer> bufs;
    std::vector<uint8_t*> outs;
    for (int i = 0; i < batch; ++i) {
      bufs.push_back(DeviceBuffer::allocate(1024 * 768 * 3));
      outs.push_back(bufs.back().data());
    }
    dec.decode_batch(in, outs, stream.get());
    cuda_check(cudaStreamSynchronize(stream.get()), "sync");
    int rounds = std::max(2, 1200 / batch);
    auto t1 = std::chrono::steady_clock::now();
    for (int i = 0; i < rounds; ++i) dec.decode_batch(in, outs, stream.get());
    cuda_check(cudaStreamSynchronize(stream.get()), "sync");
    double gpu = rounds * batch / seconds_since(t1);
    std::printf("| nvJPEG (%s backend), batch %d | %.0f images/s (%.1fx one CPU core) |\n",
                dec.backend(), batch, gpu, gpu / cpu);
  }
#else
  std::printf("| nvJPEG | not built (no nvjpeg.h) |\n");
#endif
}

// The decoders' own rates on real files (the collocated benchmark's data): TurboJPEG
// on one core versus nvJPEG in batches of 128, each over the same files in memory (no disk).
void decode_files(const std::string& dir) {
  std::vector<std::vector<uint8_t>> files;
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir)) {
    std::string ext = entry.path().extension().string();
    std::transform(ext.begin(), ext.end(), ext.begin(), ::tolower);
    if (!entry.is_regular_file() || (ext != ".jpg" && ext != ".jpeg")) continue;
    std::ifstream in(entry.path(), std::ios::binary);
    files.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    names.push_back(entry.path().string());
    if (files.size() == 1024) break;  // enough to average over; fits any GPU's memory
  }
  if (files.empty()) throw Error(dir + ": no .jpg files; give --decode an image folder");
  size_t done = 0;
  auto t0 = std::chrono::steady_clock::now();
  while (seconds_since(t0) < 3.0 || done < files.size()) {
    size_t i = done++ % files.size();
    decode_jpeg_full_turbo(files[i].data(), files[i].size(), names[i], ScalingFactor{});
  }
  double cpu = done / seconds_since(t0);
  std::printf("| CPU decoder (TurboJPEG full decode), 1 core, %zu files of %s | %.0f images/s |\n",
              files.size(), dir.c_str(), cpu);
#ifdef BATCHCAST_HAVE_NVJPEG
  // Each thread decodes every file with its own decoder and stream, as a server per trainer
  // would: with several, every NVJPG engine is kept busy (the engines' own ceiling).
  for (unsigned threads : {1u, 2u, 4u, 8u}) {
    std::vector<double> rates(threads);
    std::vector<std::thread> pool;
    const char* backend = "";
    for (unsigned t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        NvjpegDecoder dec(0);
        if (t == 0) backend = dec.backend();
        auto stream = CudaStream::create();
        std::vector<JpegBytes> in;
        std::vector<DeviceBuffer> bufs;
        std::vector<uint8_t*> outs;
        for (size_t i = 0; i < files.size(); ++i) {
          in.push_back(JpegBytes{files[i].data(), files[i].size(), names[i]});
          int w = 0, h = 0;
          dec.dimensions(in.back(), &w, &h);
          bufs.push_back(DeviceBuffer::allocate(static_cast<size_t>(w) * h * 3));
          outs.push_back(bufs.back().data());
        }
        auto all = [&] {
          for (size_t b = 0; b < in.size(); b += 128) {
            size_t e = std::min(in.size(), b + 128);
            dec.decode_batch(std::vector<JpegBytes>(in.begin() + b, in.begin() + e),
                             std::vector<uint8_t*>(outs.begin() + b, outs.begin() + e),
                             stream.get());
          }
          cuda_check(cudaStreamSynchronize(stream.get()), "sync");
        };
        all();
        int rounds = 0;
        auto t1 = std::chrono::steady_clock::now();
        while (seconds_since(t1) < 3.0) {
          all();
          ++rounds;
        }
        rates[t] = rounds * in.size() / seconds_since(t1);
      });
    for (auto& th : pool) th.join();
    double gpu = 0;
    for (double r : rates) gpu += r;
    std::printf(
        "| nvJPEG (%s backend), batch 128, %u decoder(s) at once, same files | %.0f "
        "images/s (%.1fx one CPU core) |\n",
        backend, threads, gpu, gpu / cpu);
  }
#else
  std::printf("| nvJPEG | not built (no nvjpeg.h) |\n");
#endif
}

}  // namespace
}  // namespace batchcast

int main(int argc, char** argv) {
  using namespace batchcast;
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  try {
    if (argc == 3 && std::string(argv[1]) == "--consumer") return consumer_main(argv[2]);
    if (cuda_device_count() == 0) {
      std::printf("cuda_bench: no CUDA device: nothing to measure\n");
      return 0;
    }
    cudaDeviceProp prop{};
    cuda_check(cudaGetDeviceProperties(&prop, 0), "properties");
    std::printf("device: %s, %u CPU cores\n\n| measure | result |\n| --- | --- |\n", prop.name,
                std::thread::hardware_concurrency());
    if (argc == 3 && std::string(argv[1]) == "--decode") {
      decode_files(argv[2]);
      return 0;
    }
    if (argc == 2 && std::string(argv[1]) == "--copies") {
      copies();
      return 0;
    }
    bandwidth();
    latency(argv[0], false);
    latency(argv[0], true);
    decode();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda_bench: %s\n", e.what());
    return 1;
  }
}
