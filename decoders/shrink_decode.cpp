#include "decoders/shrink_decode.h"

#include <algorithm>
#include <opencv2/core.hpp>
#include <opencv2/imgproc.hpp>

#include "decoders/image_decode.h"
#include "decoders/jpeg_decode.h"
#include "decoders/sample_check.h"
#include "decoders/scratch_buffer.h"

namespace batchcast {

ShrunkSize shrunk_size(int width, int height, int side) {
  const int shorter = std::min(width, height);
  if (shorter <= side) return {width, height};
  const int longer = static_cast<int>(int64_t{side} * std::max(width, height) / shorter);
  return width <= height ? ShrunkSize{side, longer} : ShrunkSize{longer, side};
}

RgbView decode_shrunk(const uint8_t* data, size_t size, const std::string& name,
                      int64_t max_image_pixels, int side) {
  const SampleHeader header = check_sample(data, size, name, max_image_pixels);
  RgbView whole;
  ShrunkSize target;
  if (header.format == ImageFormat::kJpeg) {
    const int width = static_cast<int>(header.width);
    const int height = static_cast<int>(header.height);
    target = shrunk_size(width, height, side);
    const ScalingFactor factor = choose_scaling(width, height, target.width, target.height);
    whole = decode_jpeg_region(data, size, name, header.jpeg, factor,
                               PixelRect{0, 0, factor.scale(width), factor.scale(height)});
  } else {
    whole = decode_image(header.format, data, size, name, max_image_pixels);
    target = shrunk_size(whole.width, whole.height, side);  // the decoder's size, not the header's
  }
  if (whole.width == target.width && whole.height == target.height) return whole;
  thread_local ScratchBuffer shrunk;
  const size_t stride = static_cast<size_t>(target.width) * 3;
  uint8_t* pixels = shrunk.get(stride * target.height);
  cv::Mat source(whole.height, whole.width, CV_8UC3, const_cast<uint8_t*>(whole.pixels),
                 whole.stride);
  cv::Mat out(target.height, target.width, CV_8UC3, pixels, stride);
  cv::resize(source, out, out.size(), 0, 0, cv::INTER_LINEAR);
  return RgbView{pixels, target.width, target.height, stride};
}

}  // namespace batchcast
