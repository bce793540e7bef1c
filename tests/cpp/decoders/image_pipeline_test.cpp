// ImagePipeline's outputs: shapes and types, the eval transform, float, half and bfloat16
// outputs, determinism across threads, tiny and extreme images, bad options.
#include "decoders/image_pipeline.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cmath>
#include <cstring>
#include <thread>

#include "common/error.h"
#include "tests/cpp/decoders/image_pipeline_reference.h"
#include "tests/cpp/decoders/test_images.h"

namespace batchcast {
namespace {

using testing::compare;
using testing::encode_jpeg;
using testing::encode_png;
using testing::photo_rgb;
using testing::TempDir;
using testing::uint8_options;
using testing::write_file;

TEST(ImagePipeline, ShapesAndTypes) {
  ImagePipeline f32(PipelineOptions{});
  EXPECT_EQ(f32.dtype(), DType::kFloat32);
  EXPECT_EQ(f32.sample_shape(), (std::vector<int64_t>{3, 224, 224}));
  EXPECT_EQ(f32.sample_bytes(), 3u * 224 * 224 * 4);
  ImagePipeline u8(uint8_options(96, true));
  EXPECT_EQ(u8.sample_shape(), (std::vector<int64_t>{96, 96, 3}));
  EXPECT_EQ(u8.sample_bytes(), 96u * 96 * 3);
  EXPECT_EQ(parse_dtype("bfloat16", kOutputDTypes), DType::kBFloat16);
  try {
    parse_dtype("fp8", kOutputDTypes);
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("float32, float16, bfloat16, uint8"), std::string::npos);
  }
  // A dtype the pipeline does not write is refused when it is built, with the valid ones.
  PipelineOptions int8;
  int8.output = DType::kInt8;
  try {
    ImagePipeline bad(int8);
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("float32, float16, bfloat16, uint8"), std::string::npos);
  }
}

TEST(ImagePipeline, EvalTransformResizesShorterSideThenCentreCrops) {
  EvalGeometry g = eval_geometry(500, 375, eval_resize_size(224), 224);
  EXPECT_EQ(g.resized_width, 341);  // int(256 * 500 / 375)
  EXPECT_EQ(g.resized_height, 256);
  EXPECT_EQ(g.crop_left, 58);  // round(58.5) = 58, half to even like Python
  EXPECT_EQ(g.crop_top, 16);
  EvalGeometry portrait = eval_geometry(300, 451, eval_resize_size(224), 224);
  EXPECT_EQ(portrait.resized_width, 256);
  EXPECT_EQ(portrait.resized_height, 384);  // int(256 * 451 / 300) = int(384.85)
  EXPECT_EQ(eval_resize_size(160), 182);

  std::vector<uint8_t> jpeg = encode_jpeg(photo_rgb(500, 375, 0), 90);
  PipelineOptions options = uint8_options(224, false);
  ImagePipeline pipeline(options);
  std::vector<uint8_t> a(pipeline.sample_bytes());
  std::vector<uint8_t> b(pipeline.sample_bytes());
  pipeline.process_bytes(jpeg.data(), jpeg.size(), "e.jpg", 0, 0, a.data());
  pipeline.process_bytes(jpeg.data(), jpeg.size(), "e.jpg", 5, 99, b.data());
  EXPECT_EQ(a, b);  // no randomness in eval
  cv::Mat bgr = cv::imdecode(jpeg, cv::IMREAD_COLOR);
  cv::Mat rgb;
  cv::Mat resized;
  cv::cvtColor(bgr, rgb, cv::COLOR_BGR2RGB);
  cv::resize(rgb, resized, cv::Size(341, 256), 0, 0, cv::INTER_LINEAR);
  cv::Mat expected = resized(cv::Rect(58, 16, 224, 224)).clone();
  EXPECT_EQ(compare(expected, a.data()).max, 0);

  // A large image takes the DCT-scaled eval path and stays close to decode-then-resize.
  std::vector<uint8_t> big = encode_jpeg(photo_rgb(1200, 900, 2), 90);
  pipeline.process_bytes(big.data(), big.size(), "big.jpg", 0, 0, a.data());
  cv::cvtColor(cv::imdecode(big, cv::IMREAD_COLOR), rgb, cv::COLOR_BGR2RGB);
  cv::resize(rgb, resized, cv::Size(341, 256), 0, 0, cv::INTER_AREA);
  EXPECT_LT(compare(resized(cv::Rect(58, 16, 224, 224)).clone(), a.data()).mean, 3.0);
}

TEST(ImagePipeline, FloatOutputsAreNormalisedPlanar) {
  std::vector<uint8_t> jpeg = encode_jpeg(photo_rgb(400, 300, 1), 90);
  PipelineOptions options;
  options.image_size = 64;
  options.seed = 3;
  options.output = DType::kUInt8;
  ImagePipeline u8(options);
  options.output = DType::kFloat32;
  ImagePipeline f32(options);
  options.output = DType::kFloat16;
  ImagePipeline f16(options);
  options.output = DType::kBFloat16;
  ImagePipeline bf16(options);
  std::vector<uint8_t> hwc(u8.sample_bytes());
  std::vector<float> chw(3 * 64 * 64);
  std::vector<uint16_t> half(3 * 64 * 64);
  std::vector<uint16_t> brain(3 * 64 * 64);
  u8.process_bytes(jpeg.data(), jpeg.size(), "n.jpg", 2, 11, hwc.data());
  f32.process_bytes(jpeg.data(), jpeg.size(), "n.jpg", 2, 11, chw.data());
  f16.process_bytes(jpeg.data(), jpeg.size(), "n.jpg", 2, 11, half.data());
  bf16.process_bytes(jpeg.data(), jpeg.size(), "n.jpg", 2, 11, brain.data());
  const float mean[3] = {0.485f, 0.456f, 0.406f};
  const float stdev[3] = {0.229f, 0.224f, 0.225f};
  for (int c = 0; c < 3; ++c) {
    for (int i = 0; i < 64 * 64; ++i) {
      float expected = (hwc[i * 3 + c] / 255.0f - mean[c]) / stdev[c];
      ASSERT_EQ(chw[c * 64 * 64 + i], expected);
      ASSERT_EQ(half[c * 64 * 64 + i], float_to_half_bits(expected));
      ASSERT_EQ(brain[c * 64 * 64 + i], float_to_bfloat16_bits(expected));
    }
  }
}

TEST(ImagePipeline, HalfAndBfloat16RoundToNearestEven) {
  EXPECT_EQ(float_to_half_bits(1.0f), 0x3C00);
  EXPECT_EQ(float_to_half_bits(-2.0f), 0xC000);
  EXPECT_EQ(float_to_half_bits(65504.0f), 0x7BFF);
  EXPECT_EQ(float_to_half_bits(65520.0f), 0x7C00);               // rounds up to infinity
  EXPECT_EQ(float_to_half_bits(1.0f + 1.0f / 2048), 0x3C00);     // tie -> even (down)
  EXPECT_EQ(float_to_half_bits(1.0f + 3.0f / 2048), 0x3C02);     // tie -> even (up)
  EXPECT_EQ(float_to_half_bits(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(float_to_half_bits(std::ldexp(1.0f, -25)), 0x0000);  // tie -> even (zero)
  EXPECT_EQ(float_to_half_bits(std::ldexp(3.0f, -26)), 0x0001);
  EXPECT_EQ(float_to_half_bits(std::ldexp(1.0f, -14)), 0x0400);  // smallest normal
  EXPECT_EQ(float_to_half_bits(INFINITY), 0x7C00);
  EXPECT_EQ(float_to_half_bits(NAN) & 0x7C00, 0x7C00);
  EXPECT_NE(float_to_half_bits(NAN) & 0x03FF, 0);
  EXPECT_EQ(float_to_bfloat16_bits(1.0f), 0x3F80);
  EXPECT_EQ(float_to_bfloat16_bits(1.0f + 1.0f / 256), 0x3F80);  // tie -> even
  EXPECT_EQ(float_to_bfloat16_bits(1.0f + 3.0f / 256), 0x3F82);
  EXPECT_EQ(float_to_bfloat16_bits(-2.5f), 0xC020);
  EXPECT_EQ(float_to_bfloat16_bits(NAN) & 0x7FC0, 0x7FC0);
}

TEST(ImagePipeline, IdenticalAcrossThreadCounts) {
  TempDir dir;
  std::vector<std::string> files;
  for (int i = 0; i < 6; ++i) {
    files.push_back(dir.file("img" + std::to_string(i) + (i % 3 == 2 ? ".png" : ".jpg")));
    cv::Mat rgb = photo_rgb(300 + 97 * i, 280 + 61 * i, i);
    write_file(files.back(), i % 3 == 2 ? encode_png(rgb) : encode_jpeg(rgb, 80 + i));
  }
  for (DType type : {DType::kFloat32, DType::kUInt8}) {
    PipelineOptions options;
    options.image_size = 96;
    options.output = type;
    options.seed = 42;
    ImagePipeline pipeline(options);
    const size_t count = 48;
    auto run = [&](int threads) {
      std::vector<uint8_t> out(count * pipeline.sample_bytes());
      std::vector<std::thread> workers;
      for (int t = 0; t < threads; ++t) {
        workers.emplace_back([&, t] {
          for (size_t i = t; i < count; i += threads) {
            pipeline.process(files[i % files.size()], 4, i,
                             out.data() + i * pipeline.sample_bytes());
          }
        });
      }
      for (auto& w : workers) w.join();
      return out;
    };
    std::vector<uint8_t> one = run(1);
    EXPECT_EQ(one, run(4));
    EXPECT_EQ(one, run(3));
    // Different (epoch, index) does draw different augmentations.
    std::vector<uint8_t> a(pipeline.sample_bytes()), b(pipeline.sample_bytes());
    pipeline.process(files[0], 0, 0, a.data());
    pipeline.process(files[0], 1, 0, b.data());
    EXPECT_NE(a, b);
  }
}

TEST(ImagePipeline, TinyAndExtremeAspectImagesWork) {
  ImagePipeline train(uint8_options(32, true));
  ImagePipeline eval(uint8_options(32, false));
  std::vector<uint8_t> out(train.sample_bytes());
  for (auto [w, h] : {std::pair{1, 1}, std::pair{1, 300}, std::pair{500, 2}, std::pair{7, 9}}) {
    std::vector<uint8_t> jpeg = encode_jpeg(photo_rgb(w, h, 0), 90, TJSAMP_444);
    for (uint64_t i = 0; i < 8; ++i) {
      train.process_bytes(jpeg.data(), jpeg.size(), "tiny.jpg", 0, i, out.data());
    }
    eval.process_bytes(jpeg.data(), jpeg.size(), "tiny.jpg", 0, 0, out.data());
  }
}

TEST(ImagePipeline, RejectsBadOptions) {
  PipelineOptions options;
  options.image_size = 0;
  EXPECT_THROW(ImagePipeline{options}, Error);
  options.image_size = 224;
  options.std[1] = 0.0f;
  EXPECT_THROW(ImagePipeline{options}, Error);
}

}  // namespace
}  // namespace batchcast
