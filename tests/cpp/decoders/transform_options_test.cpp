// The transform parameters of PipelineOptions (scale, ratio, flip_p, resize_size, interpolation,
// uint8 layout, mean/std): each one changes what the pipeline does the way torchvision's
// parameter of the same name does, and bad values are refused with the option named.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "common/error.h"
#include "decoders/crop_params.h"
#include "decoders/image_pipeline.h"
#include "tests/cpp/decoders/test_images.h"

namespace batchcast {
namespace {

using testing::encode_jpeg;
using testing::encode_png;
using testing::photo_rgb;

PipelineOptions small(int size, bool train) {
  PipelineOptions o;
  o.image_size = size;
  o.train = train;
  o.seed = 11;
  return o;
}

TEST(TransformOptions, ScaleAndRatioBoundEveryCrop) {
  PipelineOptions o = small(32, true);
  o.scale = {0.25, 0.36};
  o.ratio = {0.5, 2.0};
  ImagePipeline pipeline(o);
  for (uint64_t index = 0; index < 500; ++index) {
    PixelRect c = pipeline.geometry(400, 300, false, 0, index, "g").crop;
    const double area = double(c.width) * c.height / (400.0 * 300.0);
    const double aspect = double(c.width) / c.height;
    // Rounding w and h to integers moves area and aspect by a few per mille at this size.
    EXPECT_GT(area, 0.25 * 0.98) << index;
    EXPECT_LT(area, 0.36 * 1.02) << index;
    EXPECT_GT(aspect, 0.5 * 0.98) << index;
    EXPECT_LT(aspect, 2.0 * 1.02) << index;
  }
}

TEST(TransformOptions, FlipProbabilityZeroAndOneAndInBetween) {
  int flips[3] = {0, 0, 0};
  const double p[3] = {0.0, 1.0, 0.2};
  for (int k = 0; k < 3; ++k) {
    PipelineOptions o = small(32, true);
    o.flip_p = p[k];
    ImagePipeline pipeline(o);
    for (uint64_t index = 0; index < 1000; ++index)
      flips[k] += pipeline.geometry(100, 100, false, 0, index, "g").flip;
  }
  EXPECT_EQ(flips[0], 0);
  EXPECT_EQ(flips[1], 1000);
  EXPECT_NEAR(flips[2], 200, 50);  // binomial sd 12.6: 4 sd
}

TEST(TransformOptions, EvalResizeSizeSetsTheShorterSide) {
  PipelineOptions o = small(64, false);
  o.resize_size = 100;
  SampleGeometry g = ImagePipeline(o).geometry(320, 240, false, 0, 0, "g");
  EXPECT_EQ(g.resize_h, 100);
  EXPECT_EQ(g.resize_w, 133);   // int(100 * 320 / 240)
  EXPECT_EQ(g.final_left, 34);  // round((133 - 64) / 2) = round(34.5), half to even
  EXPECT_EQ(g.final_top, 18);
  o.resize_size = 0;  // default: int(64 * 256 / 224)
  EXPECT_EQ(ImagePipeline(o).options().resize_size, eval_resize_size(64));
}

TEST(TransformOptions, PlanarUint8IsTheTransposeOfHwc) {
  std::vector<uint8_t> jpeg = encode_jpeg(photo_rgb(300, 200, 3), 90);
  PipelineOptions o = small(48, true);
  o.output = DType::kUInt8;
  for (bool train : {true, false}) {
    o.train = train;
    o.uint8_layout = Uint8Layout::kHWC;
    ImagePipeline hwc(o);
    o.uint8_layout = Uint8Layout::kCHW;
    ImagePipeline chw(o);
    EXPECT_EQ(chw.sample_shape(), (std::vector<int64_t>{3, 48, 48}));
    std::vector<uint8_t> a(hwc.sample_bytes()), b(chw.sample_bytes());
    for (uint64_t index = 0; index < 4; ++index) {
      hwc.process_bytes(jpeg.data(), jpeg.size(), "a.jpg", 0, index, a.data());
      chw.process_bytes(jpeg.data(), jpeg.size(), "a.jpg", 0, index, b.data());
      for (int c = 0; c < 3; ++c)
        for (int p = 0; p < 48 * 48; ++p) ASSERT_EQ(b[c * 48 * 48 + p], a[p * 3 + c]);
    }
  }
}

TEST(TransformOptions, NearestPicksSourcePixelsLikePil) {
  // A lossless image: every output pixel must be one of the crop's pixels, at PIL's
  // position floor((x + 0.5) * scale) (cv::INTER_NEAREST_EXACT's rule).
  cv::Mat rgb = photo_rgb(97, 61, 4);
  std::vector<uint8_t> png = encode_png(rgb);
  PipelineOptions o = small(40, true);
  o.output = DType::kUInt8;
  o.interpolation = Interpolation::kNearest;
  o.flip_p = 0;
  ImagePipeline pipeline(o);
  std::vector<uint8_t> out(pipeline.sample_bytes());
  pipeline.process_bytes(png.data(), png.size(), "n.png", 0, 5, out.data());
  PixelRect c = pipeline.geometry(97, 61, false, 0, 5, "n.png").crop;
  for (int y = 0; y < 40; ++y) {
    for (int x = 0; x < 40; ++x) {
      const int sx = c.left + static_cast<int>(std::floor((x + 0.5) * c.width / 40.0));
      const int sy = c.top + static_cast<int>(std::floor((y + 0.5) * c.height / 40.0));
      const cv::Vec3b expected = rgb.at<cv::Vec3b>(sy, sx);
      for (int ch = 0; ch < 3; ++ch) ASSERT_EQ(out[(y * 40 + x) * 3 + ch], expected[ch]);
    }
  }
  // No DCT-domain averaging for nearest, even for a crop far larger than the output.
  EXPECT_EQ(pipeline.geometry(4000, 3000, true, 0, 0, "big").factor.denom, 1);
}

TEST(TransformOptions, MeanAndStdNormalise) {
  std::vector<uint8_t> jpeg = encode_jpeg(photo_rgb(120, 90, 5), 90);
  PipelineOptions o = small(16, false);
  o.output = DType::kUInt8;
  ImagePipeline u8(o);
  o.output = DType::kFloat32;
  o.mean = {0.5f, 0.25f, 0.0f};
  o.std = {0.5f, 2.0f, 1.0f};
  ImagePipeline f32(o);
  std::vector<uint8_t> a(u8.sample_bytes());
  std::vector<float> b(f32.sample_bytes() / sizeof(float));
  u8.process_bytes(jpeg.data(), jpeg.size(), "m.jpg", 0, 0, a.data());
  f32.process_bytes(jpeg.data(), jpeg.size(), "m.jpg", 0, 0, b.data());
  for (int c = 0; c < 3; ++c)
    for (int p = 0; p < 16 * 16; ++p)
      ASSERT_EQ(b[c * 256 + p], (a[p * 3 + c] / 255.0f - o.mean[c]) / o.std[c]);
}

TEST(TransformOptions, BadValuesAreRefusedByName) {
  auto refused = [](PipelineOptions o, const std::string& word) {
    try {
      ImagePipeline p(o);
    } catch (const Error& e) {
      return std::string(e.what()).find(word) != std::string::npos;
    }
    return false;
  };
  PipelineOptions o = small(64, false);
  o.scale = {0.9, 0.1};
  EXPECT_TRUE(refused(o, "scale"));
  o = small(64, false);
  o.ratio = {0.0, 1.0};
  EXPECT_TRUE(refused(o, "ratio"));
  o = small(64, false);
  o.flip_p = 1.5;
  EXPECT_TRUE(refused(o, "flip"));
  o = small(64, false);
  o.resize_size = 63;
  EXPECT_TRUE(refused(o, "resize_size"));
}

}  // namespace
}  // namespace batchcast
