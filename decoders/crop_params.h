// Crop geometry of the two torchvision transforms the pipeline reproduces: RandomResizedCrop's
// get_params and eval's Resize(R) + CenterCrop(S).
//
// Contract: pure functions of their arguments (the random draws come from a caller-owned
// SampleRng), so they are thread-safe and deterministic.
#pragma once

#include <array>

#include "common/random.h"
#include "decoders/pixel_rect.h"

namespace batchcast {

// torchvision.transforms.RandomResizedCrop.get_params, draw for draw: up to 10 attempts of
// area = uniform(scale) * H * W and aspect = exp(uniform(log ratio)), w/h rounded half-to-even as
// Python's round(); the first that fits is placed uniformly; otherwise the central fallback that
// clamps the aspect to the ratio range. Only the random source differs from torch's.
PixelRect random_resized_crop_params(int width, int height, SampleRng& rng,
                                     std::array<double, 2> scale = {0.08, 1.0},
                                     std::array<double, 2> ratio = {3.0 / 4.0, 4.0 / 3.0});

// Eval geometry: the shorter side resized to resize_to, the longer to int(resize_to * long /
// short) (torchvision's Resize with an int size), then a centred crop_size square with
// torchvision's CenterCrop offsets int(round((dim - size) / 2.0)). resize_to >= crop_size (the
// caller checks): torchvision would pad a smaller image, this does not.
struct EvalGeometry {
  int resized_width = 0;
  int resized_height = 0;
  int crop_top = 0;
  int crop_left = 0;
};
EvalGeometry eval_geometry(int width, int height, int resize_to, int crop_size);

// int(size * 256 / 224), the default eval resize target of a crop of `size`.
int eval_resize_size(int image_size);

}  // namespace batchcast
