// nvjpeg_formats: what nvJPEG runs in the caller's CUDA context per image, by output format and
// backend. Decodes ITERS batches of BATCH JPEGs from DIR (the first BATCH found) with
// nvjpegDecodeBatched, timed; run it under cupti_trace.cpp to count the kernels and copies.
// Usage: nvjpeg_formats DIR FORMAT ITERS [BATCH=128] [BACKEND=3 (hardware)]
// FORMAT and BACKEND are nvjpegOutputFormat_t / nvjpegBackend_t values. Used for RESULTS.md,
// "Where the nvJPEG path's last 9 % goes".
#include <cuda_runtime.h>
#include <nvjpeg.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <vector>
#include <string>
#define CK(x) do { auto s_ = (x); if ((int)s_ != 0) { printf("FAIL %s = %d\n", #x, (int)s_); return 1; } } while (0)
int main(int argc, char** argv) {
  std::string dir = argv[1]; int fmt = atoi(argv[2]); int iters = atoi(argv[3]);
  int batch = argc > 4 ? atoi(argv[4]) : 128;
  int backend = argc > 5 ? atoi(argv[5]) : (int)NVJPEG_BACKEND_HARDWARE;
  std::vector<std::vector<unsigned char>> files;
  for (auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file() || e.path().extension() != ".jpg") continue;
    std::ifstream f(e.path(), std::ios::binary);
    files.emplace_back(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
    if ((int)files.size() == batch) break;
  }
  nvjpegHandle_t h; nvjpegJpegState_t st;
  CK(nvjpegCreateEx((nvjpegBackend_t)backend, nullptr, nullptr, 0, &h));
  CK(nvjpegJpegStateCreate(h, &st));
  CK(nvjpegDecodeBatchedInitialize(h, st, batch, 1, (nvjpegOutputFormat_t)fmt));
  cudaStream_t s; cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  std::vector<const unsigned char*> data; std::vector<size_t> len; std::vector<nvjpegImage_t> out(batch);
  for (int i = 0; i < batch; ++i) {
    data.push_back(files[i].data()); len.push_back(files[i].size());
    int c; nvjpegChromaSubsampling_t sub; int w[4], hh[4];
    CK(nvjpegGetImageInfo(h, files[i].data(), files[i].size(), &c, &sub, w, hh));
    out[i] = nvjpegImage_t{};
    int planes = (fmt == 5 || fmt == 6) ? 1 : (fmt == 2 ? 1 : 3);
    for (int p = 0; p < planes; ++p) {
      size_t pitch = (fmt == 5 || fmt == 6) ? w[0] * 3 : w[0];
      cudaMalloc(&out[i].channel[p], pitch * hh[0]); out[i].pitch[p] = pitch;
    }
    if (i == 0) printf("first image %dx%d subsampling %d components %d\n", w[0], hh[0], (int)sub, c);
  }
  CK(nvjpegDecodeBatched(h, st, data.data(), len.data(), out.data(), s));  // warm
  cudaStreamSynchronize(s);
  auto t0 = std::chrono::steady_clock::now();
  for (int k = 0; k < iters; ++k) CK(nvjpegDecodeBatched(h, st, data.data(), len.data(), out.data(), s));
  cudaStreamSynchronize(s);
  double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  printf("format %d: %d x %d images in %.3f s = %.0f images/s\n", fmt, iters, batch, sec, iters * batch / sec);
  return 0;
}
