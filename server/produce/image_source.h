// ImageSource: an image dataset (decoders/ Dataset) decoded and augmented by the pipelines of a
// ViewSet (view_set.h), as a SampleSource. Tensors of every view: "#0" images (that view's
// pipeline dtype and shape), "#1" int64 labels. fill_views() makes the views of a sample from one
// read and decode (process_views), only those it is given outs for.
//
// With a decoded cache (decoded_cache.h; `serve --cache decoded`): a sample's views are made from
// its cached image (process_views_decoded) when the cache holds it. A miss, while the cache admits
// images, is decoded whole and shrunk (decoders/shrink_decode.h), kept, and its views made from
// that image too, so a cached sample's views are the same function of (seed, epoch, index) in
// every epoch, its first included. Once the cache is full, misses are decoded from the file as
// without a cache. A view larger than the cache's side (its image_size above it) is always decoded
// from the file, and logged once.
//
// Thread-safety: every method from any number of threads, concurrently with the ViewSet adding a
// view (a view is read only once it is below the set's count). Owns the dataset and the cache;
// borrows the ViewSet, which outlives it.
#pragma once

#include <array>
#include <atomic>
#include <memory>
#include <vector>

#include "decoders/dataset.h"
#include "decoders/image_pipeline.h"
#include "server/produce/decoded_cache.h"
#include "server/produce/sample_source.h"
#include "server/produce/view_set.h"

namespace batchcast {

class ImageSource : public SampleSource {
 public:
  ImageSource(Dataset dataset, const ViewSet& views, std::unique_ptr<DecodedCache> cache = nullptr)
      : dataset_(std::move(dataset)), views_(views), cache_(std::move(cache)) {}
  uint64_t size() const override { return dataset_.size(); }
  std::vector<SampleTensor> tensors() const override { return view_tensors(0); }
  std::vector<SampleTensor> view_tensors(uint32_t view) const override {
    return views_.source_tensors(view);
  }
  void fill(uint64_t index, uint64_t epoch, const std::vector<uint8_t*>& outs) const override {
    fill_views(index, epoch, {outs});
  }
  void fill_views(uint64_t index, uint64_t epoch,
                  const std::vector<std::vector<uint8_t*>>& outs) const override;
  const Dataset& dataset() const { return dataset_; }
  // View `view`'s pipeline (a view below views().count()).
  const ImagePipeline& pipeline(uint32_t view = 0) const { return views_.pipeline(view); }
  const ViewSet& views() const { return views_; }
  // The decoded cache, if any.
  DecodedCache* cache() const { return cache_.get(); }
  // Whether view `view` is made from the cache (there is one and the view fits its side); the
  // first time a view does not, says so in the log.
  bool cached_view(uint32_t view) const;

 private:
  Dataset dataset_;
  const ViewSet& views_;
  std::unique_ptr<DecodedCache> cache_;
  mutable std::array<std::atomic<bool>, kMaxViews> told_uncached_{};
};

}  // namespace batchcast
