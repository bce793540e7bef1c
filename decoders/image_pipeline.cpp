#include "decoders/image_pipeline.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <opencv2/core.hpp>
#include <opencv2/imgproc.hpp>

#include "common/error.h"
#include "common/random.h"
#include "decoders/crop_params.h"
#include "decoders/image_decode.h"
#include "decoders/image_header.h"
#include "decoders/jpeg_decode.h"
#include "decoders/sample_check.h"
#include "decoders/scratch_buffer.h"

namespace batchcast {
namespace {

// The flip draw has its own stream so it does not depend on how many crop attempts were made.
constexpr uint64_t kFlipStream = 0x666C6970ull;  // "flip"

std::string errno_text(int error_number) {
  char buffer[256];
  // GNU strerror_r returns the message (possibly not in `buffer`); thread-safe, unlike strerror.
  return strerror_r(error_number, buffer, sizeof(buffer));
}

// Closes a file descriptor on scope exit.
class FileDescriptor {
 public:
  explicit FileDescriptor(int fd) : fd_(fd) {}
  ~FileDescriptor() noexcept {
    if (fd_ >= 0) ::close(fd_);
  }
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

}  // namespace

size_t read_image_file(const std::string& path, ScratchBuffer& buffer) {
  FileDescriptor fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) throw SampleError(path, "cannot open: " + errno_text(errno));
  struct stat info {};
  if (::fstat(fd.get(), &info) != 0) throw SampleError(path, "cannot stat: " + errno_text(errno));
  if (S_ISDIR(info.st_mode)) throw SampleError(path, "is a directory, not an image file");
  if (!S_ISREG(info.st_mode)) throw SampleError(path, "not a regular file");
  if (info.st_size == 0) throw SampleError(path, "empty file (0 bytes)");
  const size_t size = static_cast<size_t>(info.st_size);
  uint8_t* data = buffer.get(size);
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::read(fd.get(), data + done, size - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw SampleError(path, "read failed: " + errno_text(errno));
    }
    if (n == 0) break;  // shrank while reading; decode what is there (and likely fail)
    done += static_cast<size_t>(n);
  }
  return done;
}

namespace {

ScratchBuffer& file_buffer() {
  thread_local ScratchBuffer buffer;
  return buffer;
}

ScratchBuffer& resized_buffer() {
  thread_local ScratchBuffer buffer;
  return buffer;
}

}  // namespace

namespace {

// The scaled-image rectangle that covers source rectangle `crop` after DCT scaling by `factor`.
PixelRect scale_rect(const PixelRect& crop, ScalingFactor factor, int scaled_w, int scaled_h) {
  auto floor_scale = [&](int v) {
    return static_cast<int>(int64_t{v} * factor.num / factor.denom);
  };
  int x0 = floor_scale(crop.left);
  int y0 = floor_scale(crop.top);
  int x1 = std::min(factor.scale(crop.left + crop.width), scaled_w);
  int y1 = std::min(factor.scale(crop.top + crop.height), scaled_h);
  return PixelRect{x0, y0, std::max(x1 - x0, 1), std::max(y1 - y0, 1)};
}

// Writes a size x size RGB8 image (rows `stride` bytes apart) into `out` as planar CHW values
// from the per-channel tables, mirroring columns when `flip`.
template <typename T>
void write_planar(const uint8_t* rgb, size_t stride, int size, bool flip,
                  const std::array<std::array<T, 256>, 3>& lut, void* out) {
  T* plane0 = static_cast<T*>(out);
  T* plane1 = plane0 + static_cast<size_t>(size) * size;
  T* plane2 = plane1 + static_cast<size_t>(size) * size;
  for (int y = 0; y < size; ++y) {
    const uint8_t* row = rgb + static_cast<size_t>(y) * stride;
    const size_t base = static_cast<size_t>(y) * size;
    for (int x = 0; x < size; ++x) {
      const uint8_t* px = row + static_cast<size_t>(flip ? size - 1 - x : x) * 3;
      plane0[base + x] = lut[0][px[0]];
      plane1[base + x] = lut[1][px[1]];
      plane2[base + x] = lut[2][px[2]];
    }
  }
}

// Mirrors each row of a size x size RGB8 image in place.
void flip_rows_in_place(uint8_t* rgb, int size) {
  for (int y = 0; y < size; ++y) {
    uint8_t* row = rgb + static_cast<size_t>(y) * size * 3;
    for (int a = 0, b = size - 1; a < b; ++a, --b) {
      for (int c = 0; c < 3; ++c) std::swap(row[a * 3 + c], row[b * 3 + c]);
    }
  }
}

}  // namespace

uint16_t float_to_half_bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t magnitude = bits & 0x7FFFFFFFu;
  if (magnitude >= 0x7F800000u) {  // inf or NaN (NaN keeps a quiet payload bit)
    return sign | 0x7C00u | (magnitude > 0x7F800000u ? 0x0200u | ((magnitude >> 13) & 0x3FFu) : 0);
  }
  if (magnitude >= 0x477FF000u) return sign | 0x7C00u;  // >= 65520 rounds to infinity
  if (magnitude < 0x38800000u) {                        // below 2^-14: a half subnormal
    if (magnitude < 0x33000000u) return sign;           // <= 2^-25 rounds to zero
    const uint32_t exponent = magnitude >> 23;
    const uint32_t mantissa = (magnitude & 0x7FFFFFu) | 0x800000u;
    const uint32_t shift = 126 - exponent;  // 14..24
    uint32_t result = mantissa >> shift;
    const uint32_t remainder = mantissa & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (remainder > halfway || (remainder == halfway && (result & 1u))) ++result;
    return sign | static_cast<uint16_t>(result);
  }
  uint32_t result = (magnitude - 0x38000000u) >> 13;  // rebias the exponent 127 -> 15
  const uint32_t remainder = magnitude & 0x1FFFu;
  if (remainder > 0x1000u || (remainder == 0x1000u && (result & 1u))) ++result;
  return sign | static_cast<uint16_t>(result);
}

uint16_t float_to_bfloat16_bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  bits += 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

ImagePipeline::ImagePipeline(PipelineOptions options) : options_(options) {
  if (options_.image_size < 1 || options_.image_size > 16384) {
    throw Error("image_size must be in 1..16384, got " + std::to_string(options_.image_size));
  }
  if (options_.max_image_pixels < 1) throw Error("max_image_pixels must be positive");
  if (!(options_.scale[0] >= 0 && options_.scale[0] <= options_.scale[1]))
    throw Error("RandomResizedCrop scale must satisfy 0 <= min <= max, got (" +
                std::to_string(options_.scale[0]) + ", " + std::to_string(options_.scale[1]) + ")");
  if (!(options_.ratio[0] > 0 && options_.ratio[0] <= options_.ratio[1]))
    throw Error("RandomResizedCrop ratio must satisfy 0 < min <= max, got (" +
                std::to_string(options_.ratio[0]) + ", " + std::to_string(options_.ratio[1]) + ")");
  if (!(options_.flip_p >= 0 && options_.flip_p <= 1))
    throw Error("flip probability must be in [0, 1], got " + std::to_string(options_.flip_p));
  if (options_.resize_size == 0) options_.resize_size = eval_resize_size(options_.image_size);
  if (options_.resize_size < options_.image_size || options_.resize_size > 65536)
    throw Error("resize_size " + std::to_string(options_.resize_size) + " must be in image_size (" +
                std::to_string(options_.image_size) +
                ")..65536: the centred crop cannot be larger than the resized image");
  if (std::find(kOutputDTypes.begin(), kOutputDTypes.end(), options_.output) == kOutputDTypes.end())
    throw Error(std::string("the image pipeline cannot write ") + dtype_name(options_.output) +
                "; valid outputs: " + dtype_names(kOutputDTypes));
  for (int c = 0; c < 3; ++c) {
    if (!(options_.std[c] != 0.0f) || !std::isfinite(options_.std[c])) {
      throw Error("normalisation std must be finite and non-zero (channel " + std::to_string(c) +
                  ")");
    }
    for (int v = 0; v < 256; ++v) {
      // Same float32 operations as ToTensor (v / 255) followed by Normalize ((x - mean) / std).
      float value = (static_cast<float>(v) / 255.0f - options_.mean[c]) / options_.std[c];
      float_lut_[c][v] = value;
      identity_lut_[c][v] = static_cast<uint8_t>(v);
      half_lut_[c][v] = options_.output == DType::kBFloat16 ? float_to_bfloat16_bits(value)
                                                            : float_to_half_bits(value);
    }
  }
  // Samples run in parallel across worker threads; OpenCV's own per-call thread pool would only
  // oversubscribe the cores (and costs more than it saves on a 224x224 resize).
  cv::setNumThreads(1);
}

std::vector<int64_t> ImagePipeline::sample_shape() const {
  const int64_t s = options_.image_size;
  if (options_.output == DType::kUInt8 && options_.uint8_layout == Uint8Layout::kHWC)
    return {s, s, 3};
  return {3, s, s};
}

size_t ImagePipeline::sample_bytes() const {
  const size_t s = static_cast<size_t>(options_.image_size);
  return s * s * 3 * dtype_size(dtype());
}

SampleGeometry ImagePipeline::geometry(int width, int height, bool jpeg, uint64_t epoch,
                                       uint64_t index, const std::string& name) const {
  const int out_size = options_.image_size;
  SampleGeometry g;
  g.resize_w = out_size;
  g.resize_h = out_size;
  if (options_.train) {
    SampleRng rng(options_.seed, epoch, index);
    g.crop = random_resized_crop_params(width, height, rng, options_.scale, options_.ratio);
    SampleRng flip_rng(hash_combine(options_.seed, kFlipStream), epoch, index);
    g.flip = flip_rng.uniform() < options_.flip_p;
  } else {
    EvalGeometry e = eval_geometry(width, height, options_.resize_size, out_size);
    g.crop = PixelRect{0, 0, width, height};
    g.resize_w = e.resized_width;
    g.resize_h = e.resized_height;
    g.final_left = e.crop_left;
    g.final_top = e.crop_top;
    // A sliver (1 x 100000) would resize to a gigantic strip; the bomb guard covers that too.
    check_pixel_count(g.resize_w, g.resize_h, options_.max_image_pixels, name);
  }
  g.scaled = g.crop;
  // Nearest neighbour picks source pixels; a DCT-domain downscale would average them first.
  if (jpeg && options_.interpolation == Interpolation::kBilinear) {
    g.factor = choose_scaling(g.crop.width, g.crop.height, g.resize_w, g.resize_h);
    g.scaled = scale_rect(g.crop, g.factor, g.factor.scale(width), g.factor.scale(height));
  }
  return g;
}

void ImagePipeline::process(const std::string& path, uint64_t epoch, uint64_t index,
                            void* out) const {
  ScratchBuffer& buffer = file_buffer();
  size_t size = read_image_file(path, buffer);
  process_bytes(buffer.data(), size, path, epoch, index, out);
}

void ImagePipeline::process_bytes(const uint8_t* data, size_t size, const std::string& name,
                                  uint64_t epoch, uint64_t index, void* out) const {
  const ImagePipeline* self = this;
  process_views_bytes(&self, &out, 1, data, size, name, epoch, index);
}

void process_views(const ImagePipeline* const* views, void* const* outs, size_t count,
                   const std::string& path, uint64_t epoch, uint64_t index) {
  ScratchBuffer& buffer = file_buffer();
  size_t size = read_image_file(path, buffer);
  process_views_bytes(views, outs, count, buffer.data(), size, path, epoch, index);
}

void process_views_bytes(const ImagePipeline* const* views, void* const* outs, size_t count,
                         const uint8_t* data, size_t size, const std::string& name, uint64_t epoch,
                         uint64_t index) {
  const ImagePipeline* first = nullptr;
  for (size_t v = 0; v < count && !first; ++v)
    if (outs[v]) first = views[v];
  if (!first) return;
  // 1. The checks every decoder runs, then the decoded source pixels (other formats than JPEG
  // are decoded whole, once, image_decode.h; JPEG decodes only the crops, below).
  const int64_t max_pixels = first->options().max_image_pixels;
  const SampleHeader header = check_sample(data, size, name, max_pixels);
  if (header.format != ImageFormat::kJpeg) {
    const RgbView whole = decode_image(header.format, data, size, name, max_pixels);
    return process_views_decoded(views, outs, count, whole, name, epoch, index);
  }

  // 2. Each view's source rectangle, output geometry and flip.
  const int width = static_cast<int>(header.width);
  const int height = static_cast<int>(header.height);
  std::vector<SampleGeometry> geometries(count);
  for (size_t v = 0; v < count; ++v)
    if (outs[v]) geometries[v] = views[v]->geometry(width, height, true, epoch, index, name);

  // 3. JPEG: one cropped decode per DCT scaling factor the views chose, of the union of their
  // rectangles at that factor. A cropped decode's pixels equal the full decode's, so each
  // view's rectangle cut from the union is what its own decode gives: a view's bytes never
  // depend on the other views. Views whose crops need no scaling (most, at training sizes)
  // share one decode.
  std::vector<bool> done(count, false);
  for (size_t v = 0; v < count; ++v) {
    if (!outs[v] || done[v]) continue;
    const ScalingFactor factor = geometries[v].factor;
    auto same_factor = [&](size_t w) {
      return outs[w] && !done[w] && geometries[w].factor.num == factor.num &&
             geometries[w].factor.denom == factor.denom;
    };
    PixelRect area = geometries[v].scaled;
    for (size_t w = v + 1; w < count; ++w) {
      if (!same_factor(w)) continue;
      const PixelRect& r = geometries[w].scaled;
      const int right = std::max(area.left + area.width, r.left + r.width);
      const int bottom = std::max(area.top + area.height, r.top + r.height);
      area.left = std::min(area.left, r.left);
      area.top = std::min(area.top, r.top);
      area.width = right - area.left;
      area.height = bottom - area.top;
    }
    const RgbView decoded = decode_jpeg_region(data, size, name, header.jpeg, factor, area);
    for (size_t w = v; w < count; ++w) {
      if (!same_factor(w)) continue;
      const PixelRect& r = geometries[w].scaled;
      RgbView source = decoded;
      source.pixels += static_cast<size_t>(r.top - area.top) * decoded.stride +
                       static_cast<size_t>(r.left - area.left) * 3;
      source.width = r.width;
      source.height = r.height;
      views[w]->finish(source, geometries[w], outs[w]);
      done[w] = true;
    }
  }
}

void process_views_decoded(const ImagePipeline* const* views, void* const* outs, size_t count,
                           const RgbView& image, const std::string& name, uint64_t epoch,
                           uint64_t index) {
  for (size_t v = 0; v < count; ++v) {
    if (!outs[v]) continue;
    const SampleGeometry g =
        views[v]->geometry(image.width, image.height, false, epoch, index, name);
    RgbView source = image;
    source.pixels +=
        static_cast<size_t>(g.crop.top) * image.stride + static_cast<size_t>(g.crop.left) * 3;
    source.width = g.crop.width;
    source.height = g.crop.height;
    views[v]->finish(source, g, outs[v]);
  }
}

void ImagePipeline::finish(const RgbView& source, const SampleGeometry& g, void* out) const {
  const int out_size = options_.image_size;
  const int resize_w = g.resize_w;
  const int resize_h = g.resize_h;
  // Resize (bilinear, no antialias), then flip and normalise straight into `out`.
  cv::Mat source_mat(source.height, source.width, CV_8UC3, const_cast<uint8_t*>(source.pixels),
                     source.stride);
  const bool direct_uint8 = options_.output == DType::kUInt8 &&
                            options_.uint8_layout == Uint8Layout::kHWC && options_.train;
  uint8_t* resized = direct_uint8
                         ? static_cast<uint8_t*>(out)
                         : resized_buffer().get(static_cast<size_t>(resize_w) * resize_h * 3);
  cv::Mat resized_mat(resize_h, resize_w, CV_8UC3, resized);
  if (source.width == resize_w && source.height == resize_h) {
    source_mat.copyTo(resized_mat);
  } else {
    cv::resize(source_mat, resized_mat, resized_mat.size(), 0, 0,
               options_.interpolation == Interpolation::kNearest ? cv::INTER_NEAREST_EXACT
                                                                 : cv::INTER_LINEAR);
  }
  const size_t resized_stride = static_cast<size_t>(resize_w) * 3;
  const uint8_t* square = resized + static_cast<size_t>(g.final_top) * resized_stride +
                          static_cast<size_t>(g.final_left) * 3;

  switch (options_.output) {
    default:  // kFloat32: the constructor admits kOutputDTypes only
      write_planar(square, resized_stride, out_size, g.flip, float_lut_, out);
      break;
    case DType::kFloat16:
    case DType::kBFloat16:
      write_planar(square, resized_stride, out_size, g.flip, half_lut_, out);
      break;
    case DType::kUInt8:
      if (options_.uint8_layout == Uint8Layout::kCHW) {
        write_planar(square, resized_stride, out_size, g.flip, identity_lut_, out);
        break;
      }
      if (!direct_uint8) {
        uint8_t* dst = static_cast<uint8_t*>(out);
        for (int y = 0; y < out_size; ++y) {
          std::memcpy(dst + static_cast<size_t>(y) * out_size * 3, square + y * resized_stride,
                      static_cast<size_t>(out_size) * 3);
        }
      }
      if (g.flip) flip_rows_in_place(static_cast<uint8_t*>(out), out_size);
      break;
  }
}

}  // namespace batchcast
