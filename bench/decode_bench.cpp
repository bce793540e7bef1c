// decode_bench: images per CPU-second of the native pipeline (read + decode + RandomResizedCrop
// + flip + normalise to float32) on one thread, over an ImageNet-like folder made by
// make_dataset. A program, not a test: prints one result line per configuration.
//
//   decode_bench [--images N] [--size S] [--dir DIR] [--seconds T] [--output float32|uint8|...]
//                [--eval]
//
// Without --dir it writes N images (default 200) into a temporary folder and removes it after.
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "common/error.h"
#include "decoders/dataset.h"
#include "decoders/image_pipeline.h"
#include "decoders/make_dataset.h"

namespace {

double thread_cpu_seconds() {
  rusage usage{};
  getrusage(RUSAGE_THREAD, &usage);
  return usage.ru_utime.tv_sec + usage.ru_stime.tv_sec +
         1e-6 * (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec);
}

}  // namespace

int main(int argc, char** argv) {
  int images = 200;
  int size = 224;
  double seconds = 5.0;
  bool train = true;
  std::string dir;
  std::string output = "float32";
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", arg.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "--images") {
      images = std::atoi(value().c_str());
    } else if (arg == "--size") {
      size = std::atoi(value().c_str());
    } else if (arg == "--dir") {
      dir = value();
    } else if (arg == "--seconds") {
      seconds = std::atof(value().c_str());
    } else if (arg == "--output") {
      output = value();
    } else if (arg == "--eval") {
      train = false;
    } else {
      std::fprintf(stderr,
                   "usage: %s [--images N] [--size S] [--dir DIR] [--seconds T] [--output TYPE] "
                   "[--eval]\n",
                   argv[0]);
      return arg == "--help" ? 0 : 2;
    }
  }
  try {
    std::string temp_dir;
    if (dir.empty()) {
      std::string pattern =
          (std::filesystem::temp_directory_path() / "bc_decode_bench_XXXXXX").string();
      if (::mkdtemp(pattern.data()) == nullptr) throw batchcast::Error("mkdtemp failed");
      temp_dir = dir = pattern;
      batchcast::MakeDatasetOptions make;
      make.out_dir = dir;
      make.classes = 10;
      make.images_per_class = (images + 9) / 10;
      batchcast::MakeDatasetReport report = batchcast::make_dataset(make);
      std::printf("made %zu images (%.1f MB) from %zu photos in %s\n", report.images,
                  report.bytes / 1e6, report.sources, dir.c_str());
    }
    batchcast::Dataset dataset = batchcast::Dataset::image_folder(dir);
    batchcast::PipelineOptions options;
    options.image_size = size;
    options.train = train;
    options.output = batchcast::parse_dtype(output, batchcast::kOutputDTypes);
    batchcast::ImagePipeline pipeline(options);
    std::vector<uint8_t> out(pipeline.sample_bytes());
    // Warm-up pass: page cache, thread_local buffers.
    for (size_t i = 0; i < dataset.size(); ++i) pipeline.process(dataset[i].path, 0, i, out.data());
    size_t done = 0;
    double start = thread_cpu_seconds();
    for (uint64_t epoch = 1; thread_cpu_seconds() - start < seconds; ++epoch) {
      for (size_t i = 0; i < dataset.size(); ++i) {
        pipeline.process(dataset[i].path, epoch, i, out.data());
      }
      done += dataset.size();
    }
    double cpu = thread_cpu_seconds() - start;
    std::printf(
        "batchcast %s %s %dpx: %zu images in %.2f CPU-s = %.1f images/CPU-s (%.3f ms each)\n",
        train ? "train" : "eval", output.c_str(), size, done, cpu, done / cpu, 1e3 * cpu / done);
    if (!temp_dir.empty()) std::filesystem::remove_all(temp_dir);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "decode_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
