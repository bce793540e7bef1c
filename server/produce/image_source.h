// ImageSource: an image dataset (decoders/ Dataset) decoded and augmented by an ImagePipeline,
// as a SampleSource. Tensors: "#0" images (pipeline dtype and shape), "#1" int64 labels.
// Thread-safe: the pipeline is, and the dataset is read-only. Owns both.
#pragma once

#include <cstring>

#include "decoders/dataset.h"
#include "decoders/image_pipeline.h"
#include "server/produce/sample_source.h"

namespace batchcast {

class ImageSource : public SampleSource {
 public:
  ImageSource(Dataset dataset, PipelineOptions options)
      : dataset_(std::move(dataset)), pipeline_(options) {}
  uint64_t size() const override { return dataset_.size(); }
  std::vector<SampleTensor> tensors() const override {
    return {{tuple_tensor_name(0), pipeline_.dtype(), pipeline_.sample_shape()},
            {tuple_tensor_name(1), DType::kInt64, {}}};
  }
  void fill(uint64_t index, uint64_t epoch, const std::vector<uint8_t*>& outs) const override {
    const auto& entry = dataset_[index];
    pipeline_.process(entry.path, epoch, index, outs[0]);
    std::memcpy(outs[1], &entry.label, sizeof(entry.label));
  }
  const Dataset& dataset() const { return dataset_; }
  const ImagePipeline& pipeline() const { return pipeline_; }

 private:
  Dataset dataset_;
  ImagePipeline pipeline_;
};

}  // namespace batchcast
