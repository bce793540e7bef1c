// The image pipeline on every non-JPEG format: a PNG, a PNM and a TIFF of the same pixels give the
// same sample (the crop/resize path the JPEG takes), and a truncated file is refused.
#include <gtest/gtest.h>

#include "tests/cpp/decoders/image_decode_files.h"

namespace batchcast {
namespace {

using namespace batchcast::testing;

// Through the pipeline: a PNG and the same pixels as an uncompressed bitmap give the same sample
// (the crop/resize path is the one JPEG takes), and the pipeline refuses a truncated one.
TEST(ImageDecode, PipelineServesEveryFormatTheSame) {
  const int w = 40, h = 30;
  Bytes rgb = ramp(w, h, 3, 9);
  Bytes png = encode_png({w, h, PNG_COLOR_TYPE_RGB, 8, false, rgb});
  Bytes ppm = concat(text("P6 40 30 255\n"), rgb);
  Bytes tiff = make_tiff(w, h, tiff_tags(PHOTOMETRIC_RGB, 3, 8), rgb);
  PipelineOptions options;
  options.image_size = 16;
  options.output = DType::kUInt8;
  options.train = true;
  ImagePipeline pipeline(options);
  std::vector<uint8_t> a(pipeline.sample_bytes()), b(pipeline.sample_bytes());
  for (uint64_t index = 0; index < 5; ++index) {
    pipeline.process_bytes(png.data(), png.size(), "a.png", 1, index, a.data());
    for (const Bytes* other : {&ppm, &tiff}) {
      pipeline.process_bytes(other->data(), other->size(), "b", 1, index, b.data());
      EXPECT_EQ(a, b) << index;
    }
  }
  Bytes cut(png.begin(), png.begin() + static_cast<long>(png.size() / 2));
  EXPECT_THROW(pipeline.process_bytes(cut.data(), cut.size(), "cut.png", 0, 0, a.data()),
               SampleError);
}

}  // namespace
}  // namespace batchcast
