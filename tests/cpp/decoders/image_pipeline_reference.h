// The reference of the image pipeline's tests (image_pipeline*_test.cpp): the train transform
// redone by an independent decoder (OpenCV imgcodecs, i.e. libjpeg) with the same crop rectangle
// and flip draw, and the per-byte difference of two images.
//
// Contract: test-only; pure functions, thread-safe.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#include <vector>

#include "common/random.h"
#include "decoders/crop_params.h"
#include "decoders/image_pipeline.h"

namespace batchcast::testing {

constexpr uint64_t kFlipStream = 0x666C6970ull;  // mirrors image_pipeline.cpp

inline PipelineOptions uint8_options(int size, bool train) {
  PipelineOptions options;
  options.image_size = size;
  options.train = train;
  options.output = DType::kUInt8;
  options.seed = 7;
  return options;
}

// The reference of the train transform: a full decode by an independent decoder (OpenCV
// imgcodecs, i.e. libjpeg), the same crop rectangle, cv::resize, flip.
inline cv::Mat reference_train(const std::vector<uint8_t>& jpeg, const PipelineOptions& options,
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

inline Difference compare(const cv::Mat& expected, const uint8_t* actual) {
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

}  // namespace batchcast::testing
