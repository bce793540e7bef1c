// ImagePipeline: decoded pixels against reference decoders, determinism across threads, the eval
// transform, output types, and every bad-input case.
#include "decoders/image_pipeline.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cmath>
#include <cstring>
#include <thread>

#include "common/error.h"
#include "common/random.h"
#include "decoders/crop_params.h"
#include "decoders/image_header.h"
#include "decoders/jpeg_decode.h"
#include "tests/cpp/decoders/test_images.h"

namespace batchcast {
namespace {

using testing::encode_jpeg;
using testing::encode_png;
using testing::photo_rgb;
using testing::TempDir;
using testing::write_file;

constexpr uint64_t kFlipStream = 0x666C6970ull;  // mirrors image_pipeline.cpp

PipelineOptions uint8_options(int size, bool train) {
  PipelineOptions options;
  options.image_size = size;
  options.train = train;
  options.output = DType::kUInt8;
  options.seed = 7;
  return options;
}

// The reference of the train transform: a full decode by an independent decoder (OpenCV
// imgcodecs, i.e. libjpeg), the same crop rectangle, cv::resize, flip.
cv::Mat reference_train(const std::vector<uint8_t>& jpeg, const PipelineOptions& options,
                        uint64_t epoch, uint64_t index) {
  cv::Mat bgr = cv::imdecode(jpeg, cv::IMREAD_COLOR | cv::IMREAD_IGNORE_ORIENTATION);
  cv::Mat rgb;
  cv::cvtColor(bgr, rgb, cv::COLOR_BGR2RGB);
  SampleRng rng(options.seed, epoch, index);
  PixelRect crop = random_resized_crop_params(rgb.cols, rgb.rows, rng);
  cv::Mat resized;
  cv::resize(rgb(cv::Rect(crop.left, crop.top, crop.width, crop.height)), resized,
             cv::Size(options.image_size, options.image_size), 0, 0, cv::INTER_LINEAR);
  SampleRng flip_rng(hash_combine(options.seed, kFlipStream), epoch, index);
  if (flip_rng.uniform() < 0.5) cv::flip(resized, resized, 1);
  return resized;
}

struct Difference {
  int max = 0;
  double mean = 0;
};

Difference compare(const cv::Mat& expected, const uint8_t* actual) {
  Difference d;
  const size_t n = expected.total() * expected.channels();
  const uint8_t* e = expected.ptr<uint8_t>();
  double sum = 0;
  for (size_t i = 0; i < n; ++i) {
    int diff = std::abs(int{e[i]} - int{actual[i]});
    d.max = std::max(d.max, diff);
    sum += diff;
  }
  d.mean = sum / n;
  return d;
}

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

// Crops smaller than twice the output: no DCT scaling, so the cropped libjpeg decode must match a
// full decode by OpenCV's libjpeg, then the same crop and resize, byte for byte.
TEST(ImagePipeline, TrainPixelsMatchFullDecodeReference) {
  const int subsamplings[] = {TJSAMP_420, TJSAMP_444, TJSAMP_422};
  for (int variant = 0; variant < 3; ++variant) {
    std::vector<uint8_t> jpeg =
        encode_jpeg(photo_rgb(500, 375, variant), 90, subsamplings[variant]);
    PipelineOptions options = uint8_options(224, true);
    ImagePipeline pipeline(options);
    std::vector<uint8_t> out(pipeline.sample_bytes());
    for (uint64_t index = 0; index < 20; ++index) {
      pipeline.process_bytes(jpeg.data(), jpeg.size(), "photo.jpg", 3, index, out.data());
      Difference d = compare(reference_train(jpeg, options, 3, index), out.data());
      EXPECT_EQ(d.max, 0) << "variant " << variant << " index " << index;
    }
  }
}

// Large crops take DCT-domain scaling: results differ from decode-then-resize only by the
// resampling, so compare loosely (mean error well under 1 level of 255).
TEST(ImagePipeline, ScaledDecodeCloseToFullResolution) {
  std::vector<uint8_t> jpeg = encode_jpeg(photo_rgb(1600, 1200, 1), 92);
  PipelineOptions options = uint8_options(160, true);
  ImagePipeline pipeline(options);
  std::vector<uint8_t> out(pipeline.sample_bytes());
  int scaled = 0;
  for (uint64_t index = 0; index < 24; ++index) {
    SampleRng rng(options.seed, 0, index);
    PixelRect crop = random_resized_crop_params(1600, 1200, rng);
    ScalingFactor f = choose_scaling(crop.width, crop.height, 160, 160);
    if (f.num != f.denom) ++scaled;
    pipeline.process_bytes(jpeg.data(), jpeg.size(), "big.jpg", 0, index, out.data());
    Difference d = compare(reference_train(jpeg, options, 0, index), out.data());
    EXPECT_LT(d.mean, 4.0) << "index " << index;
  }
  EXPECT_GT(scaled, 5);  // the test really exercises the scaled path
}

TEST(ImagePipeline, ChoosesLargestReductionKeepingCropAboveOutput) {
  ScalingFactor none = choose_scaling(447, 1000, 224, 224);  // < 2x in one dim
  EXPECT_EQ(none.num, none.denom);
  ScalingFactor half = choose_scaling(448, 448, 224, 224);
  EXPECT_EQ(half.num * 2, half.denom);
  ScalingFactor f = choose_scaling(2000, 1800, 224, 224);
  EXPECT_EQ(f.num * 8, f.denom);  // 1/8: 250 x 225 still >= 224
  ScalingFactor g = choose_scaling(1000, 1000, 224, 224);
  EXPECT_GE(g.scale(1000), 224);
  EXPECT_LT(g.scale(1000), 2 * 224);
}

// make_dataset, the benchmarks and the tests encode on the same thread: a progressive encode
// must not change what the next baseline encode writes (libjpeg-turbo 2.1 keeps a handle in
// progressive mode).
TEST(JpegEncode, BaselineAfterProgressiveIsUnchanged) {
  cv::Mat photo = photo_rgb(640, 480, 1);
  std::vector<uint8_t> before = encode_jpeg(photo, 90, TJSAMP_420, 0);
  encode_jpeg(photo_rgb(401, 333, 2), 85, TJSAMP_420, TJFLAG_PROGRESSIVE);
  EXPECT_EQ(encode_jpeg(photo, 90, TJSAMP_420, 0), before);
}

TEST(JpegDecode, RegionEqualsFullTurboDecode) {
  struct Case {
    int subsampling;
    int flags;
  } cases[] = {{TJSAMP_420, 0}, {TJSAMP_444, 0}, {TJSAMP_422, 0}, {TJSAMP_420, TJFLAG_PROGRESSIVE}};
  for (const Case& c : cases) {
    std::vector<uint8_t> jpeg = encode_jpeg(photo_rgb(401, 333, 2), 85, c.subsampling, c.flags);
    JpegHeader header = read_jpeg_header(jpeg.data(), jpeg.size(), "x.jpg");
    for (ScalingFactor factor : {ScalingFactor{1, 1}, ScalingFactor{1, 2}, ScalingFactor{3, 8}}) {
      RgbView full_view = decode_jpeg_full_turbo(jpeg.data(), jpeg.size(), "x.jpg", factor);
      cv::Mat full = cv::Mat(full_view.height, full_view.width, CV_8UC3,
                             const_cast<uint8_t*>(full_view.pixels), full_view.stride)
                         .clone();
      SampleRng rng(1, 2, 3);
      for (int trial = 0; trial < 12; ++trial) {
        PixelRect rect;
        rect.width = 1 + static_cast<int>(rng.below(static_cast<uint64_t>(full.cols)));
        rect.height = 1 + static_cast<int>(rng.below(static_cast<uint64_t>(full.rows)));
        rect.left = static_cast<int>(rng.below(static_cast<uint64_t>(full.cols - rect.width + 1)));
        rect.top = static_cast<int>(rng.below(static_cast<uint64_t>(full.rows - rect.height + 1)));
        RgbView view = decode_jpeg_region(jpeg.data(), jpeg.size(), "x.jpg", header, factor, rect);
        ASSERT_EQ(view.width, rect.width);
        ASSERT_EQ(view.height, rect.height);
        int max_diff = 0;
        for (int y = 0; y < rect.height; ++y) {
          const uint8_t* got = view.pixels + y * view.stride;
          const uint8_t* want = full.ptr<uint8_t>(rect.top + y) + rect.left * 3;
          for (int i = 0; i < rect.width * 3; ++i) {
            max_diff = std::max(max_diff, std::abs(int{got[i]} - int{want[i]}));
          }
        }
        EXPECT_EQ(max_diff, 0) << "subsampling " << c.subsampling << " flags " << c.flags
                               << " factor " << factor.num << "/" << factor.denom << " rect "
                               << rect.width << "x" << rect.height << "+" << rect.left << "+"
                               << rect.top;
      }
    }
  }
}

TEST(ImagePipeline, GrayscaleAndCmykBecomeRgb) {
  cv::Mat rgb = photo_rgb(320, 240, 0);
  cv::Mat gray;
  cv::cvtColor(rgb, gray, cv::COLOR_RGB2GRAY);
  std::vector<uint8_t> jpeg = encode_jpeg(gray, 90);
  ImagePipeline pipeline(uint8_options(64, false));
  std::vector<uint8_t> out(pipeline.sample_bytes());
  pipeline.process_bytes(jpeg.data(), jpeg.size(), "gray.jpg", 0, 0, out.data());
  for (size_t i = 0; i < out.size(); i += 3) {
    ASSERT_EQ(out[i], out[i + 1]);
    ASSERT_EQ(out[i], out[i + 2]);
  }
  // CMYK: TurboJPEG encodes TJPF_CMYK input as a CMYK (Adobe) JPEG.
  cv::Mat cmyk(240, 320, CV_8UC4);
  for (int y = 0; y < 240; ++y) {
    for (int x = 0; x < 320; ++x) {
      const cv::Vec3b p = rgb.at<cv::Vec3b>(y, x);
      cmyk.at<cv::Vec4b>(y, x) = cv::Vec4b(p[0], p[1], p[2], 255);  // K=255: no darkening
    }
  }
  TjHandle compressor(TjHandle::Kind::kCompress);
  TjBuffer buffer;
  unsigned long size = 0;
  ASSERT_EQ(tjCompress2(compressor.get(), cmyk.data, 320, 0, 240, TJPF_CMYK, buffer.out_ptr(),
                        &size, TJSAMP_444, 95, 0),
            0);
  std::vector<uint8_t> cmyk_jpeg(buffer.data(), buffer.data() + size);
  EXPECT_EQ(read_jpeg_header(cmyk_jpeg.data(), size, "c.jpg").colorspace, TJCS_YCCK);
  pipeline.process_bytes(cmyk_jpeg.data(), size, "cmyk.jpg", 0, 0, out.data());
  // Reference: the RGB pixels that went in, through the same eval geometry (lossy: loose).
  EvalGeometry g = eval_geometry(320, 240, eval_resize_size(64), 64);
  cv::Mat resized;
  cv::resize(rgb, resized, cv::Size(g.resized_width, g.resized_height), 0, 0, cv::INTER_LINEAR);
  cv::Mat expected = resized(cv::Rect(g.crop_left, g.crop_top, 64, 64)).clone();
  EXPECT_LT(compare(expected, out.data()).mean, 3.0);
}

TEST(ImagePipeline, PngMatchesOpenCvDecode) {
  cv::Mat rgb = photo_rgb(300, 200, 1);
  TempDir dir;
  write_file(dir.file("a.png"), encode_png(rgb));
  PipelineOptions options = uint8_options(128, true);
  ImagePipeline pipeline(options);
  std::vector<uint8_t> out(pipeline.sample_bytes());
  for (uint64_t index = 0; index < 5; ++index) {
    pipeline.process(dir.file("a.png"), 1, index, out.data());
    SampleRng rng(options.seed, 1, index);
    PixelRect crop = random_resized_crop_params(300, 200, rng);
    cv::Mat expected;
    cv::resize(rgb(cv::Rect(crop.left, crop.top, crop.width, crop.height)), expected,
               cv::Size(128, 128), 0, 0, cv::INTER_LINEAR);
    SampleRng flip_rng(hash_combine(options.seed, kFlipStream), 1, index);
    if (flip_rng.uniform() < 0.5) cv::flip(expected, expected, 1);
    EXPECT_EQ(compare(expected, out.data()).max, 0) << "index " << index;  // PNG is lossless
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

// --- bad inputs ---------------------------------------------------------------------------

void expect_sample_error(const ImagePipeline& pipeline, const std::string& path,
                         const std::string& reason_part) {
  std::vector<uint8_t> out(pipeline.sample_bytes());
  try {
    pipeline.process(path, 0, 0, out.data());
    ADD_FAILURE() << path << ": no SampleError";
  } catch (const SampleError& e) {
    EXPECT_EQ(e.path(), path);
    std::string what = e.what();
    EXPECT_EQ(what.rfind(path + ": ", 0), 0u) << what;
    EXPECT_NE(what.find(reason_part), std::string::npos) << what;
  }
}

class BadInputs : public ::testing::TestWithParam<bool> {};

TEST_P(BadInputs, EachCaseNamesFileAndReason) {
  TempDir dir;
  ImagePipeline pipeline(uint8_options(64, GetParam()));
  std::vector<uint8_t> jpeg = encode_jpeg(photo_rgb(320, 240, 0), 90);

  write_file(dir.file("zero.jpg"), {});
  expect_sample_error(pipeline, dir.file("zero.jpg"), "empty file (0 bytes)");

  write_file(dir.file("truncated.jpg"),
             std::vector<uint8_t>(jpeg.begin(), jpeg.begin() + jpeg.size() / 2));
  expect_sample_error(pipeline, dir.file("truncated.jpg"), "truncated");
  write_file(dir.file("header_only.jpg"), std::vector<uint8_t>(jpeg.begin(), jpeg.begin() + 100));
  expect_sample_error(pipeline, dir.file("header_only.jpg"), "JPEG");

  // Garbage right after the scan header: every crop decodes it.
  std::vector<uint8_t> corrupt = jpeg;
  size_t sos = 0;
  for (size_t i = 2; i + 1 < corrupt.size(); ++i) {
    if (corrupt[i] == 0xFF && corrupt[i + 1] == 0xDA) {
      sos = i;
      break;
    }
  }
  ASSERT_GT(sos, 0u);
  size_t scan = sos + 2 + (corrupt[sos + 2] << 8 | corrupt[sos + 3]);
  for (size_t i = scan; i < scan + 400; ++i) corrupt[i] = (i % 5 == 0) ? 0xFF : 0x00 + (i & 0x3F);
  write_file(dir.file("corrupt.jpg"), corrupt);
  expect_sample_error(pipeline, dir.file("corrupt.jpg"), "corrupt");

  write_file(dir.file("text.jpg"), std::vector<uint8_t>{'h', 'e', 'l', 'l', 'o', '\n'});
  expect_sample_error(pipeline, dir.file("text.jpg"), "not an image");

  expect_sample_error(pipeline, dir.file("missing.jpg"), "cannot open: No such file");
  std::filesystem::create_directories(dir.file("folder.jpg"));
  expect_sample_error(pipeline, dir.file("folder.jpg"), "is a directory");
  if (::geteuid() != 0) {  // root reads anything whatever the mode
    write_file(dir.file("locked.jpg"), jpeg);
    ::chmod(dir.file("locked.jpg").c_str(), 0);
    expect_sample_error(pipeline, dir.file("locked.jpg"), "Permission denied");
  }

  // A valid JPEG whose frame header claims 60000 x 60000.
  std::vector<uint8_t> bomb = jpeg;
  size_t dims = testing::sof_dimensions_offset(bomb);
  ASSERT_GT(dims, 0u);
  bomb[dims] = bomb[dims + 2] = 60000 >> 8;
  bomb[dims + 1] = bomb[dims + 3] = 60000 & 0xFF;
  write_file(dir.file("bomb.jpg"), bomb);
  expect_sample_error(pipeline, dir.file("bomb.jpg"), "60000x60000 = 3600000000 pixels");
  expect_sample_error(pipeline, dir.file("bomb.jpg"), "decompression-bomb guard");

  // Same for PNG, from IHDR.
  std::vector<uint8_t> png = encode_png(photo_rgb(64, 48, 1));
  write_file(dir.file("good.png"), png);
  std::vector<uint8_t> png_bomb = png;
  for (int i = 0; i < 2; ++i) {
    png_bomb[16 + 4 * i] = 0;
    png_bomb[17 + 4 * i] = 0;
    png_bomb[18 + 4 * i] = 60000 >> 8;
    png_bomb[19 + 4 * i] = 60000 & 0xFF;
  }
  write_file(dir.file("bomb.png"), png_bomb);
  expect_sample_error(pipeline, dir.file("bomb.png"), "decompression-bomb guard");
  write_file(dir.file("truncated.png"),
             std::vector<uint8_t>(png.begin(), png.begin() + png.size() / 2));
  expect_sample_error(pipeline, dir.file("truncated.png"), "corrupt or truncated PNG");

  // A lower limit applies to ordinary images too.
  PipelineOptions small = uint8_options(64, GetParam());
  small.max_image_pixels = 320 * 240 - 1;
  write_file(dir.file("ok.jpg"), jpeg);
  expect_sample_error(ImagePipeline(small), dir.file("ok.jpg"), "above max_image_pixels=76799");
}

INSTANTIATE_TEST_SUITE_P(TrainAndEval, BadInputs, ::testing::Bool());

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

namespace batchcast {
namespace {

// Header-only dimensions of every format besides JPEG, and the pipeline's decode of it, from
// OpenCV's encoders (another implementation than the decoders').
TEST(ImageHeader, DimensionsOfEveryOtherFormat) {
  cv::Mat bgr = testing::photo_rgb(123, 45, 0);
  for (const char* extension : {".png", ".bmp", ".ppm", ".pgm", ".tiff", ".webp"}) {
    cv::Mat pixels = bgr;
    if (std::string(extension) == ".pgm") cv::cvtColor(bgr, pixels, cv::COLOR_RGB2GRAY);
    std::vector<uint8_t> bytes;
    ASSERT_TRUE(cv::imencode(extension, pixels, bytes)) << extension;
    ImageFormat format = sniff_image_format(bytes.data(), bytes.size());
    ASSERT_NE(format, ImageFormat::kUnknown) << extension;
    int64_t w = 0, h = 0;
    ASSERT_TRUE(read_image_dimensions(format, bytes.data(), bytes.size(), &w, &h)) << extension;
    EXPECT_EQ(w, 123) << extension;
    EXPECT_EQ(h, 45) << extension;
    // And the pipeline decodes it.
    ImagePipeline pipeline(uint8_options(32, true));
    std::vector<uint8_t> out(pipeline.sample_bytes());
    pipeline.process_bytes(bytes.data(), bytes.size(), extension, 0, 0, out.data());
  }
  // A BMP claiming 1320 x 51717 (found by the fuzzer) is refused before anything is allocated.
  std::vector<uint8_t> bmp;
  cv::imencode(".bmp", bgr, bmp);
  bmp[18] = 0x28, bmp[19] = 0x05, bmp[20] = bmp[21] = 0;
  bmp[22] = 0x05, bmp[23] = 0xCA, bmp[24] = bmp[25] = 0;
  PipelineOptions small = uint8_options(32, true);
  small.max_image_pixels = 4 << 20;
  std::vector<uint8_t> out(ImagePipeline(small).sample_bytes());
  try {
    ImagePipeline(small).process_bytes(bmp.data(), bmp.size(), "b.bmp", 0, 0, out.data());
    ADD_FAILURE() << "no SampleError";
  } catch (const SampleError& e) {
    EXPECT_NE(std::string(e.what()).find("1320x51717"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace batchcast
