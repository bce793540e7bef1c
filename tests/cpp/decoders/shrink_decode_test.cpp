// The decoded cache's image (decoders/shrink_decode.h) and the views made from a decoded image
// (process_views_decoded): the sizes torchvision's Resize(side) gives, never an enlargement, and
// a view of a cached image byte for byte what the pipeline makes of that image stored as a PNG.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "common/error.h"
#include "decoders/image_pipeline.h"
#include "decoders/shrink_decode.h"
#include "test_images.h"

namespace batchcast {
namespace {

using testing::encode_jpeg;
using testing::encode_png;
using testing::photo_rgb;

TEST(ShrinkDecode, SizesAreTorchvisionResizeOfTheShorterSideAndNeverEnlarge) {
  EXPECT_EQ(shrunk_size(500, 375, 256).width, 341);  // int(256 * 500 / 375)
  EXPECT_EQ(shrunk_size(500, 375, 256).height, 256);
  EXPECT_EQ(shrunk_size(375, 500, 256).width, 256);
  EXPECT_EQ(shrunk_size(375, 500, 256).height, 341);
  EXPECT_EQ(shrunk_size(200, 120, 256).width, 200);  // already smaller: kept as it is
  EXPECT_EQ(shrunk_size(200, 120, 256).height, 120);
  EXPECT_EQ(shrunk_size(256, 256, 256).width, 256);
}

TEST(ShrinkDecode, JpegAndPngDecodeToTheShrunkSize) {
  const cv::Mat photo = photo_rgb(1200, 900);
  for (const auto& bytes : {encode_jpeg(photo), encode_png(photo)}) {
    const RgbView image = decode_shrunk(bytes.data(), bytes.size(), "photo", 1 << 30, 256);
    EXPECT_EQ(image.width, 341);
    EXPECT_EQ(image.height, 256);
  }
  const cv::Mat small = photo_rgb(160, 100);
  const auto bytes = encode_png(small);
  const RgbView image = decode_shrunk(bytes.data(), bytes.size(), "small", 1 << 30, 256);
  ASSERT_EQ(image.width, 160);
  ASSERT_EQ(image.height, 100);
  for (int y = 0; y < 100; ++y)  // a lossless image never enlarged: its own pixels
    EXPECT_EQ(std::memcmp(image.pixels + y * image.stride, small.ptr(y), 160 * 3), 0);
}

TEST(ShrinkDecode, BadFilesThrowAsThePipelineDoes) {
  std::vector<uint8_t> junk(100, 7);
  EXPECT_THROW(decode_shrunk(junk.data(), junk.size(), "junk", 1 << 30, 256), SampleError);
  auto jpeg = encode_jpeg(photo_rgb(640, 480));
  jpeg.resize(jpeg.size() / 2);  // truncated
  EXPECT_THROW(decode_shrunk(jpeg.data(), jpeg.size(), "cut", 1 << 30, 256), SampleError);
}

TEST(ShrinkDecode, ViewsOfACachedImageEqualThePipelineOnThatImage) {
  const auto jpeg = encode_jpeg(photo_rgb(900, 700, 1));
  const RgbView shrunk = decode_shrunk(jpeg.data(), jpeg.size(), "photo", 1 << 30, 256);
  cv::Mat kept(shrunk.height, shrunk.width, CV_8UC3);
  for (int y = 0; y < shrunk.height; ++y)
    std::memcpy(kept.ptr(y), shrunk.pixels + y * shrunk.stride, shrunk.width * 3);
  const auto png = encode_png(kept);  // lossless: the pipeline decodes exactly `kept`
  PipelineOptions train;
  PipelineOptions eval;
  eval.train = false;
  eval.image_size = 160;
  PipelineOptions half;
  half.output = DType::kFloat16;
  half.seed = 9;
  for (const PipelineOptions& o : {train, eval, half}) {
    const ImagePipeline pipeline(o);
    for (uint64_t epoch = 0; epoch < 3; ++epoch) {
      std::vector<uint8_t> from_cache(pipeline.sample_bytes()), reference(pipeline.sample_bytes());
      const ImagePipeline* views[] = {&pipeline};
      void* outs[] = {from_cache.data()};
      const RgbView image{kept.data, kept.cols, kept.rows, kept.step[0]};
      process_views_decoded(views, outs, 1, image, "photo", epoch, 5);
      pipeline.process_bytes(png.data(), png.size(), "photo.png", epoch, 5, reference.data());
      EXPECT_EQ(from_cache, reference) << "epoch " << epoch << ", size " << o.image_size;
    }
  }
}

}  // namespace
}  // namespace batchcast
