// libFuzzer target over ImagePipeline::process_bytes: any byte string must either produce a
// sample or throw SampleError. Anything else (a crash, a sanitizer report, another exception
// type escaping, a hang) is a bug. Built only with clang and BATCHCAST_FUZZ=ON; run with
// tests/fuzz/run_fuzz.sh.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/error.h"
#include "decoders/image_pipeline.h"

namespace {

batchcast::PipelineOptions fuzz_options(bool train, batchcast::DType output) {
  batchcast::PipelineOptions options;
  options.image_size = 48;  // small output: time goes into the decoder, not the resize
  options.train = train;
  options.output = output;
  // A low bomb limit keeps each input fast and under libFuzzer's RSS limit; the guard itself is
  // what is being exercised.
  options.max_image_pixels = 4 << 20;
  return options;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const batchcast::ImagePipeline train(fuzz_options(true, batchcast::DType::kFloat16));
  static const batchcast::ImagePipeline eval(fuzz_options(false, batchcast::DType::kUInt8));
  static std::vector<uint8_t> out(train.sample_bytes() + eval.sample_bytes());
  // The input length picks the random crop, so the corpus explores different crops per file.
  const uint64_t index = size;
  try {
    train.process_bytes(data, size, "fuzz-input", 0, index, out.data());
  } catch (const batchcast::SampleError&) {
  }
  try {
    eval.process_bytes(data, size, "fuzz-input", 1, index, out.data());
  } catch (const batchcast::SampleError&) {
  }
  return 0;
}
