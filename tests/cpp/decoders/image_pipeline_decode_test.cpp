// ImagePipeline's decoded pixels against reference decoders: the train transform against a full
// decode by OpenCV, DCT-scaled decoding, region decoding against turbo's full decode, grayscale
// and CMYK, PNG, and the header-only dimensions of every other format.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "common/error.h"
#include "decoders/crop_params.h"
#include "decoders/image_header.h"
#include "decoders/image_pipeline.h"
#include "decoders/jpeg_decode.h"
#include "tests/cpp/decoders/image_pipeline_reference.h"
#include "tests/cpp/decoders/test_images.h"

namespace batchcast {
namespace {

using testing::compare;
using testing::Difference;
using testing::encode_jpeg;
using testing::encode_png;
using testing::kFlipStream;
using testing::photo_rgb;
using testing::reference_train;
using testing::TempDir;
using testing::uint8_options;
using testing::write_file;

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
  // A BMP claiming 1320 x 51717 (a fuzzer input) is refused before anything is allocated.
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
