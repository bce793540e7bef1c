// The native image pipeline: file (or bytes) -> decoded, cropped, resized, flipped, normalised
// sample written in place into caller-owned memory (a slot of the batch pool).
//
// Contract: an ImagePipeline is immutable after construction. process()/process_bytes() are
// thread-safe and may run on many threads at once: all mutable state (TurboJPEG/libjpeg
// decompressors, scratch buffers) is thread_local. Results are a pure function of (options, file
// bytes, epoch, index): the random draws come from SampleRng(seed, epoch, index), never from
// thread identity or timing. The caller owns `out` (sample_bytes() bytes); the pipeline keeps no
// pointer to it. Bad samples throw SampleError(path, reason); bad options throw Error.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "decoders/crop_params.h"
#include "decoders/jpeg_decode.h"
#include "decoders/rgb_view.h"
#include "decoders/scratch_buffer.h"

namespace batchcast {

// The dtypes the pipeline writes (PipelineOptions::output); parse_dtype(name, kOutputDTypes) reads
// one from its name.
inline const std::vector<DType> kOutputDTypes = {DType::kFloat32, DType::kFloat16, DType::kBFloat16,
                                                 DType::kUInt8};

// How the crop is resized to the output (torchvision's InterpolationMode of the same name).
// kBilinear: cv::resize(INTER_LINEAR), no antialias filter (see README, "Augmentation").
// kNearest: INTER_NEAREST_EXACT, PIL's NEAREST pixel choice; no DCT-domain downscale then, so
// that every output pixel is a source pixel as in PIL.
enum class Interpolation { kNearest, kBilinear };

// Memory order of one uint8 sample: (S, S, 3) as the GPU-normalising path and most image code
// want, or (3, S, S) as torchvision's PILToTensor yields. Float outputs are always (3, S, S).
enum class Uint8Layout { kHWC, kCHW };

// The names of the transform's enums on the command line and in Python (the one table each;
// the output dtypes by dtype_name()).
inline const std::map<std::string, Interpolation> kInterpolationNames = {
    {"bilinear", Interpolation::kBilinear}, {"nearest", Interpolation::kNearest}};
inline const std::map<std::string, Uint8Layout> kUint8LayoutNames = {{"hwc", Uint8Layout::kHWC},
                                                                     {"chw", Uint8Layout::kCHW}};
inline const std::map<std::string, DType> kOutputNames = [] {
  std::map<std::string, DType> names;
  for (DType t : kOutputDTypes) names[dtype_name(t)] = t;
  return names;
}();

// The transform, declared once: what `batchcast serve` (ServeConfig::transform, its command line's
// Pipeline options), Python (_batchcast.PipelineOptions) and ImagePipeline all take.
struct PipelineOptions {
  // Side of the square output. Default 224: the ImageNet training resolution of torchvision's
  // reference recipes.
  int image_size = 224;
  // true: RandomResizedCrop(size, scale, ratio) + RandomHorizontalFlip(flip_p), torchvision's
  // training transform. false: Resize(resize_size) + CenterCrop(size), its eval transform.
  // Default true: a data-loading server mostly feeds training.
  bool train = true;
  // RandomResizedCrop's area fraction and aspect-ratio ranges (training). Defaults: torchvision's.
  std::array<double, 2> scale{0.08, 1.0};
  std::array<double, 2> ratio{3.0 / 4.0, 4.0 / 3.0};
  // Probability of the horizontal flip (training; 0 turns it off). Default: torchvision's 0.5.
  double flip_p = 0.5;
  // Eval: the shorter side is resized to this before the centred crop; 0 means
  // int(image_size * 256 / 224) (eval_resize_size), the ratio of torchvision's reference recipes.
  // Must be >= image_size (CenterCrop would pad otherwise).
  int resize_size = 0;
  Interpolation interpolation = Interpolation::kBilinear;
  // Float types: (x/255 - mean)/std, planar (3, S, S) per sample, as ToTensor + Normalize produce
  // (mean 0, std 1: ToTensor alone). uint8: not normalised, laid out as uint8_layout. Default
  // float32: what a torchvision pipeline hands the model. One of kOutputDTypes.
  DType output = DType::kFloat32;
  Uint8Layout uint8_layout = Uint8Layout::kHWC;
  // Per-channel RGB mean and std of Normalize. Default: the ImageNet statistics every torchvision
  // model was trained with.
  std::array<float, 3> mean{0.485f, 0.456f, 0.406f};
  std::array<float, 3> std{0.229f, 0.224f, 0.225f};
  // Seed of every random draw (with epoch and index). Default 0: reproducible unless asked.
  uint64_t seed = 0;
  // Decompression-bomb guard, checked from the header before any pixel is decoded. Default
  // 178956970 = 2x PIL's MAX_IMAGE_PIXELS warning limit, the point where PIL itself refuses.
  int64_t max_image_pixels = 178956970;
};

// Where a sample's output pixels come from: a pure function of the header's size, the options and
// (seed, epoch, index). Shared by the CPU pipeline and the GPU decode path
// (server/produce/nvjpeg_stage.h) so that both draw the same crops and flips.
struct SampleGeometry {
  PixelRect crop;        // source rectangle in full-resolution pixels
  ScalingFactor factor;  // DCT-domain reduction the CPU decodes `crop` with (JPEG only)
  PixelRect scaled;      // `crop` in the coordinates of the image scaled by `factor`
  int resize_w = 0;      // the scaled rectangle is resized (bilinear) to resize_w x resize_h,
  int resize_h = 0;
  int final_left = 0;  // then the output square is cut at (final_left, final_top): eval's
  int final_top = 0;   // CenterCrop; 0, 0 in training
  bool flip = false;   // mirrored columns (RandomHorizontalFlip)
};

class ImagePipeline {
 public:
  explicit ImagePipeline(PipelineOptions options);

  const PipelineOptions& options() const { return options_; }
  DType dtype() const { return options_.output; }
  // {3, S, S} for float outputs and planar uint8, {S, S, 3} for HWC uint8.
  std::vector<int64_t> sample_shape() const;
  size_t sample_bytes() const;

  // Reads `path`, decodes and augments it into `out` (sample_bytes() bytes, written in place).
  // Random draws depend only on (seed, epoch, index). Throws SampleError(path, reason) for
  // zero-byte, truncated, corrupt, non-image, unreadable or too-large files.
  void process(const std::string& path, uint64_t epoch, uint64_t index, void* out) const;
  // Same, from bytes already in memory; `name` is the path reported in errors.
  void process_bytes(const uint8_t* data, size_t size, const std::string& name, uint64_t epoch,
                     uint64_t index, void* out) const;
  // The geometry of sample (epoch, index) of a width x height image; `jpeg` adds the DCT scaling.
  // Throws SampleError(name, ...) when eval's resized image would exceed max_image_pixels.
  SampleGeometry geometry(int width, int height, bool jpeg, uint64_t epoch, uint64_t index,
                          const std::string& name) const;
  // The last step of process(): `source` (the pixels of g.scaled, decoded with g.factor) resized,
  // cut, flipped and normalised into `out`.
  void finish(const RgbView& source, const SampleGeometry& g, void* out) const;

 private:
  PipelineOptions options_;
  // Normalisation tables: value[channel][pixel byte] in the output type's bit pattern, computed
  // once as ((v / 255) - mean) / std in float32, exactly ToTensor + Normalize's arithmetic.
  std::array<std::array<float, 256>, 3> float_lut_{};
  std::array<std::array<uint16_t, 256>, 3> half_lut_{};     // float16 or bfloat16 bits
  std::array<std::array<uint8_t, 256>, 3> identity_lut_{};  // planar uint8: the value itself
};

// Views: several pipelines made from one read and decode of each sample. Writes views[v]'s
// output of the file at `path` into outs[v] (a null out skips that view), byte for byte what
// views[v]->process() writes: the file is read and checked once (against the first view's
// max_image_pixels), other formats are decoded once, and a JPEG once per DCT scaling factor the
// views' crops choose (once when they agree), as the union of their rectangles. Thread-safe as
// process(); throws as process().
void process_views(const ImagePipeline* const* views, void* const* outs, size_t count,
                   const std::string& path, uint64_t epoch, uint64_t index);
void process_views_bytes(const ImagePipeline* const* views, void* const* outs, size_t count,
                         const uint8_t* data, size_t size, const std::string& name, uint64_t epoch,
                         uint64_t index);

// Views of an image already decoded to RGB (the decoded cache's, shrink_decode.h; a decoded file
// of another format than JPEG): what process_views_bytes writes for a file that decodes to
// `image`, its crops drawn on image's size. Thread-safe as process(); `name` is the path errors
// report.
void process_views_decoded(const ImagePipeline* const* views, void* const* outs, size_t count,
                           const RgbView& image, const std::string& name, uint64_t epoch,
                           uint64_t index);

// Reads the whole file at `path` into `buffer`; returns its size. Throws SampleError(path, reason)
// for a missing, unreadable, empty, non-regular file or a directory.
size_t read_image_file(const std::string& path, ScratchBuffer& buffer);

// float32 -> IEEE half / bfloat16 bits, round to nearest even (NaN stays NaN). Exposed for tests.
uint16_t float_to_half_bits(float value);
uint16_t float_to_bfloat16_bits(float value);

}  // namespace batchcast
