// View: what a consumer makes of each decoded sample (docs/views.md), as a value: the transform
// (size, crop, flip, normalisation, dtype, ...) and the seed of its random draws. The stream
// (dataset, order, epochs, ranks, chunk size) is not part of it.
//
// Every field is declared once, in for_each_view_field(): its name in a view text ("size"), its
// name as a PipelineOptions member, a Python attribute and a `batchcast serve` option
// ("image_size", --image-size), its help and the rule its values keep. The text parser and the
// canonical printer here, the Python binding of PipelineOptions, the serve command line's
// Pipeline options and --view's help all walk that one list: a new field is one line there (and
// its member in PipelineOptions).
//
// Identity: two views are the same view exactly when operator== holds: every field equal, eval's
// derived resize size compared as derived (a view text is only the spelling, on the wire and the
// command line; it is parsed once where it arrives). The decode guard (max_image_pixels) is the
// pipeline's, not the view's.
//
// Contract: a plain value; every function is pure and thread-safe. Errors are batchcast::Error
// naming the view text and the field.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "decoders/image_pipeline.h"

namespace batchcast {

// The rule a number of a field keeps, in words for errors and --help ("must be RULE").
struct ValueRule {
  const char* words;  // "in 0..1", "greater than 0"; null: any finite number
  bool (*holds)(double);
};

struct ViewField {
  const char* name;    // in a view text
  const char* option;  // PipelineOptions member = Python attribute = serve option (with - for _)
  const char* help;
  ValueRule rule;  // of each number (a range's two ends, a colour's three channels)
};

// RandomResizedCrop + flip (random) or Resize + CenterCrop (center): PipelineOptions::train.
inline const std::map<std::string, bool> kCropNames = {{"random", true}, {"center", false}};

namespace view_rules {
inline const ValueRule kAny{nullptr, [](double) { return true; }};
inline const ValueRule kPositive{"greater than 0", [](double v) { return v > 0; }};
inline const ValueRule kNonNegative{"0 or more", [](double v) { return v >= 0; }};
inline const ValueRule kNonZero{"other than 0 (it divides)", [](double v) { return v != 0; }};
inline const ValueRule kProbability{"in 0..1", [](double v) { return v >= 0 && v <= 1; }};
inline const ValueRule kSide{"in 1..16384", [](double v) { return v >= 1 && v <= 16384; }};
inline const ValueRule kResize{"in 0..65536", [](double v) { return v >= 0 && v <= 65536; }};
}  // namespace view_rules

// Calls visit(field, member, names) for every view field, in the canonical order: `member` a
// pointer to the PipelineOptions member, `names` the table of its value names (a
// const std::map<std::string, T>*; null for numbers).
template <typename Visit>
void for_each_view_field(Visit&& visit) {
  using O = PipelineOptions;
  namespace r = view_rules;
  const std::map<std::string, int>* no_int = nullptr;
  const std::map<std::string, double>* no_double = nullptr;
  const std::map<std::string, float>* no_float = nullptr;
  const std::map<std::string, uint64_t>* no_u64 = nullptr;
  visit(ViewField{"size", "image_size", "output side in pixels", r::kSide}, &O::image_size, no_int);
  visit(ViewField{"crop", "train",
                  "random: RandomResizedCrop + flip (training); center: Resize + CenterCrop (eval)",
                  r::kAny},
        &O::train, &kCropNames);
  visit(ViewField{"scale", "scale", "RandomResizedCrop area fraction range (MIN, MAX)",
                  r::kNonNegative},
        &O::scale, no_double);
  visit(ViewField{"ratio", "ratio", "RandomResizedCrop aspect ratio range (MIN, MAX)",
                  r::kPositive},
        &O::ratio, no_double);
  visit(ViewField{"flip", "flip_p", "probability of the horizontal flip (training)",
                  r::kProbability},
        &O::flip_p, no_double);
  visit(ViewField{"resize", "resize_size",
                  "eval: shorter side before the centred crop (0: image size * 256 / 224)",
                  r::kResize},
        &O::resize_size, no_int);
  visit(ViewField{"interpolation", "interpolation",
                  "resize filter: bilinear or nearest (nearest: CPU decoder only)", r::kAny},
        &O::interpolation, &kInterpolationNames);
  visit(ViewField{"output", "output", "float32, float16, bfloat16 (normalised) or uint8", r::kAny},
        &O::output, &kOutputNames);
  visit(ViewField{"layout", "uint8_layout",
                  "uint8 samples as hwc (S,S,3) or chw (3,S,S, as PILToTensor)", r::kAny},
        &O::uint8_layout, &kUint8LayoutNames);
  visit(ViewField{"mean", "mean", "Normalize mean per RGB channel (R, G, B)", r::kAny}, &O::mean,
        no_float);
  visit(ViewField{"std", "std", "Normalize std per RGB channel (R, G, B)", r::kNonZero}, &O::std,
        no_float);
  visit(ViewField{"seed", "seed", "seed of shuffling and augmentation", r::kAny}, &O::seed, no_u64);
}

// The view fields' names in the canonical order ("size, crop, ..."), for help and errors.
std::string view_field_names();

class View {
 public:
  View() = default;
  explicit View(PipelineOptions options) : options_(options) {}

  // Reads `text` over `base`: each field it names replaces the base's (an empty text is the base).
  // Throws Error("view 'TEXT': FIELD ...") for an unknown field, a malformed value, a value
  // outside its rule, or options no pipeline accepts.
  static View parse(const std::string& text, const View& base);
  static View parse(const std::string& text) { return parse(text, View()); }
  // The view a consumer asking for `text` reads from a server whose transform is `transform`
  // (its seed the stream's): `text` over `transform`. Without a seed of its own, a view equal to
  // the transform draws with the stream's seed (it is the transform) and any other with
  // derived_seed(). Throws as parse().
  static View resolve(const std::string& text, const View& transform);

  const PipelineOptions& options() const { return options_; }
  // The canonical spelling: every field in the list's order, the seed only when `with_seed`.
  std::string text(bool with_seed = true) const;
  // Whether the text it was parsed from named a seed.
  bool seed_given() const { return seed_given_; }
  // The seed of a view that names none: a pure function of the stream's seed and the view's
  // fields (not its seed), stable across builds, so that consumers asking for one view share it
  // and different views draw apart.
  uint64_t derived_seed(uint64_t stream_seed) const;
  // Every field but the seed equal (one transform, perhaps other draws).
  bool same_transform(const View& other) const;
  bool operator==(const View& other) const {
    return same_transform(other) && options_.seed == other.options_.seed;
  }
  bool operator!=(const View& other) const { return !(*this == other); }

 private:
  PipelineOptions options_;
  bool seed_given_ = false;
};

}  // namespace batchcast
