// ImageSource: an image dataset (decoders/ Dataset) decoded and augmented by the pipelines of a
// ViewSet (view_set.h), as a SampleSource. Tensors of every view: "#0" images (that view's
// pipeline dtype and shape), "#1" int64 labels. fill_views() makes the views of a sample from one
// read and decode (process_views), only those it is given outs for.
// Thread-safety: every method from any number of threads, concurrently with the ViewSet adding a
// view (a view is read only once it is below the set's count). Owns the dataset; borrows the
// ViewSet, which outlives it.
#pragma once

#include <array>
#include <cstring>
#include <vector>

#include "decoders/dataset.h"
#include "decoders/image_pipeline.h"
#include "server/produce/sample_source.h"
#include "server/produce/view_set.h"

namespace batchcast {

class ImageSource : public SampleSource {
 public:
  ImageSource(Dataset dataset, const ViewSet& views)
      : dataset_(std::move(dataset)), views_(views) {}
  uint64_t size() const override { return dataset_.size(); }
  std::vector<SampleTensor> tensors() const override { return view_tensors(0); }
  std::vector<SampleTensor> view_tensors(uint32_t view) const override {
    return views_.source_tensors(view);
  }
  void fill(uint64_t index, uint64_t epoch, const std::vector<uint8_t*>& outs) const override {
    fill_views(index, epoch, {outs});
  }
  void fill_views(uint64_t index, uint64_t epoch,
                  const std::vector<std::vector<uint8_t*>>& outs) const override {
    const auto& entry = dataset_[index];
    std::array<const ImagePipeline*, kMaxViews> pipelines{};
    std::array<void*, kMaxViews> images{};
    for (size_t v = 0; v < outs.size(); ++v) {
      pipelines[v] = &views_.pipeline(static_cast<uint32_t>(v));
      images[v] = outs[v].empty() ? nullptr : outs[v][0];  // null: process_views skips it
    }
    process_views(pipelines.data(), images.data(), outs.size(), entry.path, epoch, index);
    for (const auto& view : outs)
      if (!view.empty()) std::memcpy(view[1], &entry.label, sizeof(entry.label));
  }
  const Dataset& dataset() const { return dataset_; }
  // View `view`'s pipeline (a view below views().count()).
  const ImagePipeline& pipeline(uint32_t view = 0) const { return views_.pipeline(view); }
  const ViewSet& views() const { return views_; }

 private:
  Dataset dataset_;
  const ViewSet& views_;
};

}  // namespace batchcast
