// Helpers for the decoder tests: a self-deleting temp directory and real JPEG/PNG files made
// from the photos in /usr/share/backgrounds/mate (or a generated pattern where they are absent).
//
// Contract: test-only; not thread-safe (call from the test's main thread).
#pragma once

#include <turbojpeg.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#include <string>
#include <vector>

#include "decoders/jpeg_decode.h"
#include "decoders/tj_handle.h"

namespace batchcast::testing {

// A fresh directory under the system temp dir, removed with everything in it on destruction.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "bc_dec_XXXXXX").string();
    path_ = ::mkdtemp(pattern.data()) ? pattern : "";
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

inline void write_file(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

inline std::vector<uint8_t> read_file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

// An RGB photo of width x height: a crop of a real photo when one is installed, else a pattern
// with edges and gradients (so JPEG artefacts and resampling both matter).
inline cv::Mat photo_rgb(int width, int height, int variant = 0) {
  const char* sources[] = {"/usr/share/backgrounds/mate/nature/Garden.jpg",
                           "/usr/share/backgrounds/mate/nature/LadyBird.jpg",
                           "/usr/share/backgrounds/mate/nature/YellowFlower.jpg"};
  cv::Mat bgr = cv::imread(sources[variant % 3], cv::IMREAD_COLOR);
  cv::Mat rgb;
  if (!bgr.empty()) {
    cv::cvtColor(bgr, rgb, cv::COLOR_BGR2RGB);
    double scale =
        std::max(static_cast<double>(width) / rgb.cols, static_cast<double>(height) / rgb.rows) *
        1.3;
    cv::resize(rgb, rgb, cv::Size(), scale, scale, cv::INTER_AREA);
    return rgb(cv::Rect((rgb.cols - width) / 2, (rgb.rows - height) / 2, width, height)).clone();
  }
  rgb.create(height, width, CV_8UC3);
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      rgb.at<cv::Vec3b>(y, x) = cv::Vec3b(static_cast<uint8_t>((x * 7 + variant * 40) % 256),
                                          static_cast<uint8_t>(y * 255 / height),
                                          static_cast<uint8_t>(((x / 16 + y / 16) % 2) * 200));
    }
  }
  return rgb;
}

// Encodes RGB (or 1-channel gray) pixels as JPEG (decoders/jpeg_decode.h).
inline std::vector<uint8_t> encode_jpeg(const cv::Mat& pixels, int quality = 90,
                                        int subsampling = TJSAMP_420, int flags = 0) {
  return batchcast::encode_jpeg(pixels.data, pixels.cols, pixels.rows, pixels.step[0],
                                pixels.channels() == 1, quality, subsampling, flags);
}

inline std::vector<uint8_t> encode_png(const cv::Mat& rgb) {
  cv::Mat bgr;
  cv::cvtColor(rgb, bgr, cv::COLOR_RGB2BGR);
  std::vector<uint8_t> bytes;
  cv::imencode(".png", bgr, bytes);
  return bytes;
}

// Offset of the first SOFn marker's height field (FF C0..C2, then length(2), precision(1)).
inline size_t sof_dimensions_offset(const std::vector<uint8_t>& jpeg) {
  for (size_t i = 2; i + 9 < jpeg.size(); ++i) {
    if (jpeg[i] == 0xFF && jpeg[i + 1] >= 0xC0 && jpeg[i + 1] <= 0xC2) return i + 5;
  }
  return 0;
}

}  // namespace batchcast::testing
