#include "decoders/crop_params.h"

#include <algorithm>
#include <cmath>

namespace batchcast {
namespace {

// Python's round(): half to even. std::nearbyint uses the current rounding mode, which is
// round-to-nearest-even unless someone changed it; spell it out instead.
int round_half_even(double x) {
  double floor_x = std::floor(x);
  double diff = x - floor_x;
  if (diff > 0.5) return static_cast<int>(floor_x) + 1;
  if (diff < 0.5) return static_cast<int>(floor_x);
  return static_cast<int>(std::fmod(floor_x, 2.0) == 0.0 ? floor_x : floor_x + 1.0);
}

}  // namespace

PixelRect random_resized_crop_params(int width, int height, SampleRng& rng,
                                     std::array<double, 2> scale, std::array<double, 2> ratio) {
  const double area = static_cast<double>(height) * width;
  const double log_ratio_lo = std::log(ratio[0]);
  const double log_ratio_hi = std::log(ratio[1]);
  for (int attempt = 0; attempt < 10; ++attempt) {
    double target_area = area * rng.uniform(scale[0], scale[1]);
    double aspect_ratio = std::exp(rng.uniform(log_ratio_lo, log_ratio_hi));
    int w = round_half_even(std::sqrt(target_area * aspect_ratio));
    int h = round_half_even(std::sqrt(target_area / aspect_ratio));
    if (0 < w && w <= width && 0 < h && h <= height) {
      int top = static_cast<int>(rng.below(static_cast<uint64_t>(height - h + 1)));
      int left = static_cast<int>(rng.below(static_cast<uint64_t>(width - w + 1)));
      return PixelRect{left, top, w, h};
    }
  }
  // Central fallback.
  double in_ratio = static_cast<double>(width) / height;
  double min_ratio = std::min(ratio[0], ratio[1]);
  double max_ratio = std::max(ratio[0], ratio[1]);
  int w = width;
  int h = height;
  if (in_ratio < min_ratio) {
    h = round_half_even(w / min_ratio);
  } else if (in_ratio > max_ratio) {
    w = round_half_even(h * max_ratio);
  }
  // A 1-pixel-wide image can round h to 0; a crop must keep at least one pixel.
  w = std::clamp(w, 1, width);
  h = std::clamp(h, 1, height);
  return PixelRect{(width - w) / 2, (height - h) / 2, w, h};
}

int eval_resize_size(int image_size) { return image_size * 256 / 224; }

EvalGeometry eval_geometry(int width, int height, int resize_to, int crop_size) {
  EvalGeometry g;
  // int(size * long / short) in torchvision; integer division of non-negative ints is the same.
  if (width <= height) {
    g.resized_width = resize_to;
    g.resized_height =
        static_cast<int>(static_cast<int64_t>(resize_to) * height / std::max(width, 1));
  } else {
    g.resized_height = resize_to;
    g.resized_width =
        static_cast<int>(static_cast<int64_t>(resize_to) * width / std::max(height, 1));
  }
  g.resized_width = std::max(g.resized_width, 1);
  g.resized_height = std::max(g.resized_height, 1);
  g.crop_top = round_half_even((g.resized_height - crop_size) / 2.0);
  g.crop_left = round_half_even((g.resized_width - crop_size) / 2.0);
  return g;
}

}  // namespace batchcast
