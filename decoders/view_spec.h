// Views in text: the compact form of a PipelineOptions that `batchcast serve --view`,
// `batchcast.Loader(view=...)` and the consumer's Hello carry, e.g. "size=160,crop=random,
// scale=0.08:1,flip=0.5". A view is what a consumer makes of each decoded sample (docs/views.md);
// the stream (dataset, order, epochs, ranks, chunk size) is not part of it.
//
// Fields (every one optional; an absent field keeps the base's value): size, crop (random:
// RandomResizedCrop + flip; center: Resize + CenterCrop), scale and ratio (MIN:MAX), flip (its
// probability), resize (center: the shorter side before the crop; 0: size * 256 / 224),
// interpolation (bilinear|nearest), output (float32|float16|bfloat16|uint8), layout (hwc|chw,
// uint8), mean and std (R:G:B), seed (the view's own draws; absent: derived, see view_seed).
//
// Contract: pure functions; thread-safe. Errors are batchcast::Error naming the view text and
// the field.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "decoders/image_pipeline.h"

namespace batchcast {

struct ViewSpec {
  PipelineOptions options;
  std::optional<uint64_t> seed;  // given in the text; else the server derives one (view_seed)
};

// Reads `text` over `base` and checks that the pipeline can make the view (an ImagePipeline is
// built from it). Throws Error("view 'TEXT': FIELD ...") for an unknown field, a malformed or
// out-of-range value, or options no pipeline accepts. An empty text is the base itself.
ViewSpec parse_view_spec(const std::string& text, const PipelineOptions& base = {});

// The canonical text of a view: every field in one order, seed only when `with_seed`. Two views
// are the same view exactly when their texts with seed are equal.
std::string view_spec_text(const PipelineOptions& options, bool with_seed);

// The seed of a view that names none: a pure function of the stream's seed and the view's
// fields, so that consumers asking for one view share it and different views draw apart.
uint64_t view_seed(uint64_t stream_seed, const PipelineOptions& options);

// The view a consumer asking for `text` reads from a server whose transform is `transform` (its
// seed the stream's): `text` over `transform`; without a seed of its own, the transform's fields
// draw with the stream's seed (that view is the transform itself) and any other view with
// view_seed(). Throws as parse_view_spec.
PipelineOptions resolve_view(const std::string& text, const PipelineOptions& transform);

}  // namespace batchcast
