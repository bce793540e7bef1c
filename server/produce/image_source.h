// ImageSource: an image dataset (decoders/ Dataset) decoded and augmented by ImagePipelines, as
// a SampleSource. Tensors of every view: "#0" images (that view's pipeline dtype and shape), "#1"
// int64 labels. View 0 is the pipeline it was built with; add_view() adds more (docs/views.md),
// and fill_views() makes the views of a sample from one read and decode (process_views), only
// those it is given outs for.
// Thread-safety: fill/fill_views/view_tensors from any number of threads, concurrently with one
// add_view() at a time (the views live in a fixed array; a view is published by its count after
// it is built). Owns the dataset and the pipelines.
#pragma once

#include <array>
#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "common/error.h"
#include "decoders/dataset.h"
#include "decoders/image_pipeline.h"
#include "decoders/view_spec.h"
#include "server/produce/sample_source.h"

namespace batchcast {

class ImageSource : public SampleSource {
 public:
  ImageSource(Dataset dataset, PipelineOptions options) : dataset_(std::move(dataset)) {
    views_[0] = std::make_unique<const ImagePipeline>(options);
    texts_[0] = view_spec_text(views_[0]->options(), true);
  }
  uint64_t size() const override { return dataset_.size(); }
  std::vector<SampleTensor> tensors() const override { return view_tensors(0); }
  std::vector<SampleTensor> view_tensors(uint32_t view) const override {
    const ImagePipeline& p = *views_[view];
    return {{tuple_tensor_name(0), p.dtype(), p.sample_shape()},
            {tuple_tensor_name(1), DType::kInt64, {}}};
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
      pipelines[v] = views_[v].get();
      images[v] = outs[v].empty() ? nullptr : outs[v][0];  // null: process_views skips it
    }
    process_views(pipelines.data(), images.data(), outs.size(), entry.path, epoch, index);
    for (const auto& view : outs)
      if (!view.empty()) std::memcpy(view[1], &entry.label, sizeof(entry.label));
  }
  const Dataset& dataset() const { return dataset_; }
  // View `view`'s pipeline (a view below view_count()).
  const ImagePipeline& pipeline(uint32_t view = 0) const { return *views_[view]; }

  uint32_t view_count() const { return count_.load(std::memory_order_acquire); }
  // The view made with exactly these options (view_spec_text with seed), if there is one.
  std::optional<uint32_t> find_view(const PipelineOptions& options) const {
    const std::string text = view_spec_text(options, true);
    for (uint32_t v = 0; v < view_count(); ++v)
      if (texts_[v] == text) return v;
    return std::nullopt;
  }
  // Adds a view (its index). Throws Error past kMaxViews or for options no pipeline accepts.
  uint32_t add_view(const PipelineOptions& options) {
    std::lock_guard lk(add_mu_);
    const uint32_t v = view_count();
    if (v == kMaxViews)
      throw Error("this server already serves " + std::to_string(kMaxViews) +
                  " views, the most one stream has; start another server for more");
    views_[v] = std::make_unique<const ImagePipeline>(options);
    texts_[v] = view_spec_text(views_[v]->options(), true);
    count_.store(v + 1, std::memory_order_release);
    return v;
  }

 private:
  Dataset dataset_;
  std::array<std::unique_ptr<const ImagePipeline>, kMaxViews> views_;
  std::array<std::string, kMaxViews> texts_;
  std::atomic<uint32_t> count_{1};
  std::mutex add_mu_;
};

}  // namespace batchcast
