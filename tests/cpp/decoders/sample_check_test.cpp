// check_sample: the one check sequence the CPU pipeline and the GPU decode path share. What a
// user relies on: a good file passes with its header's size; each kind of bad file is refused
// with a SampleError naming the file and the reason, the same whichever decoder asked.
#include "decoders/sample_check.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/error.h"
#include "tests/cpp/decoders/test_images.h"

namespace batchcast {
namespace {

constexpr int64_t kLimit = 178956970;

// The reason check_sample gives for `bytes`, or "" when it accepts them.
std::string refusal(const std::vector<uint8_t>& bytes, int64_t limit = kLimit) {
  try {
    check_sample(bytes.data(), bytes.size(), "s.jpg", limit);
    return "";
  } catch (const SampleError& e) {
    EXPECT_EQ(e.path(), "s.jpg");
    return e.what();
  }
}

TEST(SampleCheck, AcceptsGoodFilesWithTheirHeaderSize) {
  std::vector<uint8_t> jpeg = testing::encode_jpeg(testing::photo_rgb(64, 48));
  SampleHeader h = check_sample(jpeg.data(), jpeg.size(), "s.jpg", kLimit);
  EXPECT_EQ(h.format, ImageFormat::kJpeg);
  EXPECT_EQ(h.width, 64);
  EXPECT_EQ(h.height, 48);
  EXPECT_EQ(h.jpeg.width, 64);

  std::vector<uint8_t> png = testing::encode_png(testing::photo_rgb(30, 20));
  SampleHeader p = check_sample(png.data(), png.size(), "s.png", kLimit);
  EXPECT_EQ(p.format, ImageFormat::kPng);
  EXPECT_EQ(p.width, 30);
  EXPECT_EQ(p.height, 20);
}

TEST(SampleCheck, RefusesEachKindOfBadFile) {
  std::vector<uint8_t> jpeg = testing::encode_jpeg(testing::photo_rgb(64, 48));
  EXPECT_NE(refusal({}).find("empty file (0 bytes)"), std::string::npos);
  const std::vector<uint8_t> text = {'h', 'e', 'l', 'l', 'o', ' ', 'w', 'o', 'r', 'l', 'd'};
  EXPECT_NE(refusal(text).find("not an image"), std::string::npos);

  std::vector<uint8_t> truncated(jpeg.begin(), jpeg.begin() + jpeg.size() / 2);
  EXPECT_NE(refusal(truncated).find("truncated JPEG"), std::string::npos);
  std::vector<uint8_t> header_only(jpeg.begin(), jpeg.begin() + 4);
  EXPECT_NE(refusal(header_only).find("JPEG header"), std::string::npos) << refusal(header_only);
  EXPECT_NE(refusal(jpeg, 64 * 48 - 1).find("decompression-bomb guard"),
            std::string::npos);
}

TEST(SampleCheck, PixelCountGuard) {
  EXPECT_NO_THROW(check_pixel_count(100, 100, 10000, "a"));
  EXPECT_THROW(check_pixel_count(100, 101, 10000, "a"), SampleError);
  EXPECT_THROW(check_pixel_count(0, 5, 10000, "a"), SampleError);
  // Division, not multiplication: a product that overflows 64 bits is still refused.
  EXPECT_THROW(check_pixel_count(INT64_MAX / 2, 4, 10000, "a"), SampleError);
}

}  // namespace
}  // namespace batchcast
