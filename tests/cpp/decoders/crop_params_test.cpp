// RandomResizedCrop parameters: torchvision's get_params contract (scale/ratio ranges, bounds,
// fallback) and determinism.
#include "decoders/crop_params.h"

#include <gtest/gtest.h>

#include <cmath>

namespace batchcast {
namespace {

TEST(RandomResizedCrop, ParamsWithinTorchvisionRanges) {
  int fallbacks = 0;
  double area_sum = 0;
  const int n = 4000;
  for (int i = 0; i < n; ++i) {
    SampleRng rng(5, 0, i);
    PixelRect c = random_resized_crop_params(500, 375, rng);
    ASSERT_GT(c.width, 0);
    ASSERT_GT(c.height, 0);
    ASSERT_GE(c.top, 0);
    ASSERT_GE(c.left, 0);
    ASSERT_LE(c.left + c.width, 500);
    ASSERT_LE(c.top + c.height, 375);
    double area = static_cast<double>(c.width) * c.height / (500.0 * 375.0);
    double ratio = static_cast<double>(c.width) / c.height;
    if (c.width == 500 && c.height == 375) {
      ++fallbacks;
      continue;
    }
    area_sum += area;
    // Rounding w and h to integers moves area and ratio a little off the drawn values.
    EXPECT_GE(area, 0.08 * 0.97);
    EXPECT_LE(ratio, 4.0 / 3.0 * 1.06);
    EXPECT_GE(ratio, 3.0 / 4.0 / 1.06);
  }
  EXPECT_LT(fallbacks, n / 50);
  // Mean accepted area: uniform(0.08, 1) draws, minus the large ones whose aspect does not fit a
  // 4:3 image (0.43 in a torchvision simulation of 500x375).
  EXPECT_NEAR(area_sum / (n - fallbacks), 0.43, 0.03);
}

TEST(RandomResizedCrop, DeterministicPerSeedEpochIndex) {
  SampleRng a(1, 2, 3), b(1, 2, 3), c(1, 2, 4);
  PixelRect x = random_resized_crop_params(640, 480, a);
  PixelRect y = random_resized_crop_params(640, 480, b);
  EXPECT_EQ(x.top, y.top);
  EXPECT_EQ(x.left, y.left);
  EXPECT_EQ(x.width, y.width);
  EXPECT_EQ(x.height, y.height);
  bool differs = false;
  for (int i = 0; i < 5 && !differs; ++i) {
    SampleRng d(1, 2, 10 + i);
    PixelRect z = random_resized_crop_params(640, 480, d);
    differs = z.width != x.width || z.left != x.left;
  }
  EXPECT_TRUE(differs);
  (void)c;
}

TEST(RandomResizedCrop, CentralFallbackClampsRatio) {
  // A 1000x10 strip: no draw fits (h would be >= 10 only for tiny areas that are too wide), so
  // the fallback crops the full height and w = round(10 * 4/3) = 13, centred.
  int fallback_hits = 0;
  for (int i = 0; i < 50; ++i) {
    SampleRng rng(0, 0, i);
    PixelRect c = random_resized_crop_params(1000, 10, rng);
    if (c.height == 10 && c.width == 13) {
      ++fallback_hits;
      EXPECT_EQ(c.top, 0);
      EXPECT_EQ(c.left, (1000 - 13) / 2);
    }
  }
  EXPECT_GT(fallback_hits, 40);
  // Tall strip: w = width, h = round(10 / (3/4)) = round(13.33) = 13.
  SampleRng rng(0, 0, 0);
  PixelRect tall = random_resized_crop_params(10, 1000, rng);
  EXPECT_LE(tall.height, 1000);
  EXPECT_GT(tall.width, 0);
}

}  // namespace
}  // namespace batchcast
