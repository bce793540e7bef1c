#include "decoders/make_dataset.h"

#include <turbojpeg.h>  // TJSAMP_*

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <opencv2/core.hpp>
#include <opencv2/imgproc.hpp>
#include <vector>

#include "common/error.h"
#include "common/random.h"
#include "decoders/image_decode.h"
#include "decoders/jpeg_decode.h"

namespace batchcast {
namespace {

namespace fs = std::filesystem;

std::string lower_extension(const fs::path& path) {
  std::string extension = path.extension().string();
  std::transform(extension.begin(), extension.end(), extension.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return extension;
}

bool is_source_photo(const fs::path& path) {
  std::string extension = lower_extension(path);
  return extension == ".jpg" || extension == ".jpeg" || extension == ".png";
}

std::vector<std::string> find_photos(const std::string& source_dir) {
  std::vector<std::string> photos;
  std::error_code error;
  auto options = fs::directory_options::follow_directory_symlink |
                 fs::directory_options::skip_permission_denied;
  for (fs::recursive_directory_iterator it(source_dir, options, error), end; !error && it != end;
       it.increment(error)) {
    if (it->is_regular_file(error) && is_source_photo(it->path())) {
      photos.push_back(it->path().string());
    }
  }
  std::sort(photos.begin(), photos.end());  // directory order is not deterministic
  return photos;
}

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("make_dataset: cannot read source photo " + path);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

// Decodes a source photo as RGB, DCT-scaled so the shorter side stays >= 1000 px: crops are
// resized down to <= 500 px anyway, and the 5K wallpapers would otherwise dominate the run time.
// Returns an empty Mat for a file that does not decode (it is skipped, not fatal).
cv::Mat decode_source(const std::string& path) {
  std::vector<uint8_t> bytes = read_bytes(path);
  try {
    if (looks_like_jpeg(bytes.data(), bytes.size())) {
      JpegHeader header = read_jpeg_header(bytes.data(), bytes.size(), path);
      int shorter = std::min(header.width, header.height);
      ScalingFactor factor = choose_scaling(shorter, shorter, 1000, 1000);
      RgbView view = decode_jpeg_full_turbo(bytes.data(), bytes.size(), path, factor);
      return cv::Mat(view.height, view.width, CV_8UC3, const_cast<uint8_t*>(view.pixels),
                     view.stride)
          .clone();
    }
    const ImageFormat format = sniff_image_format(bytes.data(), bytes.size());
    if (format == ImageFormat::kUnknown) return {};
    // PIL's refusal limit, the pipeline's default guard.
    RgbView view = decode_image(format, bytes.data(), bytes.size(), path, 178956970);
    return cv::Mat(view.height, view.width, CV_8UC3, const_cast<uint8_t*>(view.pixels), view.stride)
        .clone();
  } catch (const Error&) {
  } catch (const cv::Exception&) {
  }
  return {};
}

struct PlannedImage {
  int label = 0;
  int index = 0;
};

char* format_name(char* buffer, size_t size, const char* pattern, int value) {
  std::snprintf(buffer, size, pattern, value);
  return buffer;
}

}  // namespace

MakeDatasetReport make_dataset(const MakeDatasetOptions& options) {
  if (options.out_dir.empty()) throw Error("make_dataset: out_dir is required");
  if (options.classes < 1 || options.images_per_class < 1) {
    throw Error("make_dataset: classes and images_per_class must be >= 1");
  }
  std::vector<std::string> photos = find_photos(options.source_dir);
  if (photos.empty()) {
    throw Error("make_dataset: no JPEG or PNG photo found under '" + options.source_dir +
                "' (try `apt-get install mate-backgrounds`, or pass another source_dir)");
  }

  // Plan first (which photo each image is cut from), then decode each photo once.
  std::map<size_t, std::vector<PlannedImage>> by_source;
  for (int label = 0; label < options.classes; ++label) {
    for (int index = 0; index < options.images_per_class; ++index) {
      SampleRng rng(options.seed, static_cast<uint64_t>(label), static_cast<uint64_t>(index));
      by_source[rng.below(photos.size())].push_back(PlannedImage{label, index});
    }
  }

  MakeDatasetReport report;
  report.classes = options.classes;
  report.sources = photos.size();
  char name[64];
  for (int label = 0; label < options.classes; ++label) {
    fs::create_directories(fs::path(options.out_dir) /
                           format_name(name, sizeof(name), "class_%03d", label));
  }
  for (auto& [source_index, planned] : by_source) {
    cv::Mat photo = decode_source(photos[source_index]);
    for (const PlannedImage& image : planned) {
      // Stream 1 of (seed, label, index): stream 0 chose the photo.
      SampleRng rng(hash_combine(options.seed, 1), static_cast<uint64_t>(image.label),
                    static_cast<uint64_t>(image.index));
      if (photo.empty()) {
        // An undecodable source: fall back to a smooth random gradient of the same kind of size.
        photo = cv::Mat(600, 800, CV_8UC3);
        for (int y = 0; y < photo.rows; ++y) {
          for (int x = 0; x < photo.cols; ++x) {
            photo.at<cv::Vec3b>(y, x) = cv::Vec3b(x * 255 / 800, y * 255 / 600, (x + y) % 256);
          }
        }
      }
      // Target size: shorter side 300..500, aspect 3:4..4:3 (ImageNet's bulk).
      const int shorter = 300 + static_cast<int>(rng.below(201));
      const double aspect = std::exp(rng.uniform(std::log(3.0 / 4.0), std::log(4.0 / 3.0)));
      const int target_w =
          aspect >= 1.0 ? static_cast<int>(std::lround(shorter * aspect)) : shorter;
      const int target_h =
          aspect >= 1.0 ? shorter : static_cast<int>(std::lround(shorter / aspect));
      // Source crop with the target's aspect, 35..100% of the largest that fits.
      double crop_w = std::min<double>(photo.cols, photo.rows * aspect);
      double crop_h = crop_w / aspect;
      const double fraction = rng.uniform(0.35, 1.0);
      const int cw = std::max(1, static_cast<int>(crop_w * fraction));
      const int ch = std::max(1, static_cast<int>(crop_h * fraction));
      const int x = static_cast<int>(rng.below(static_cast<uint64_t>(photo.cols - cw + 1)));
      const int y = static_cast<int>(rng.below(static_cast<uint64_t>(photo.rows - ch + 1)));
      cv::Mat resized;
      const bool shrinking = cw >= target_w;
      cv::resize(photo(cv::Rect(x, y, cw, ch)), resized, cv::Size(target_w, target_h), 0, 0,
                 shrinking ? cv::INTER_AREA : cv::INTER_LINEAR);
      const bool grayscale = rng.uniform() < 0.05;
      const int quality = 75 + static_cast<int>(rng.below(21));
      const int subsampling = rng.uniform() < 0.1 ? TJSAMP_444 : TJSAMP_420;
      cv::Mat pixels = resized;
      if (grayscale) cv::cvtColor(resized, pixels, cv::COLOR_RGB2GRAY);
      const std::vector<uint8_t> jpeg = encode_jpeg(
          pixels.data, pixels.cols, pixels.rows, pixels.step[0], grayscale, quality, subsampling);
      fs::path path =
          fs::path(options.out_dir) / format_name(name, sizeof(name), "class_%03d", image.label);
      path /= format_name(name, sizeof(name), "img_%05d.jpg", image.index);
      std::ofstream out(path, std::ios::binary | std::ios::trunc);
      out.write(reinterpret_cast<const char*>(jpeg.data()),
                static_cast<std::streamsize>(jpeg.size()));
      if (!out) throw Error("make_dataset: cannot write " + path.string());
      report.images += 1;
      report.bytes += jpeg.size();
    }
  }
  return report;
}

}  // namespace batchcast
