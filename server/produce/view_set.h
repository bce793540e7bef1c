// ViewSet: the views one image stream serves (docs/views.md), each made once. Per view: its View
// (the identity a consumer asks for, compared by value), the ImagePipeline that decodes for it,
// what the GPU then makes of that (TensorConversion), and its tensors and layout in a slot.
//
// A consumer's view text (or a `--view`) is parsed once, here: resolved over the transform
// (View::resolve), checked against the decoder, then found among the views served or added.
// Where a view's pixels are made depends on the pool (Staging):
//   kHost        the view's pipeline writes the slot;
//   kGpuConvert  a GPU pool decoded on the CPU: the pipeline writes uint8 HWC staging and the
//                GPU normalises it into the slot (the CPU never writes floats it would upload);
//   kGpuDecode   --decoder nvjpeg|mixed: the pipeline's options are the view itself (NvjpegStage
//                draws with them and decodes on the GPU), nothing converted.
//
// Thread-safety: answer() from one thread at a time (the stream host's event loop, under its
// lock, or the start-up thread before the host runs); every reader may run on any thread,
// concurrently with one answer(), for views below count(): entries live in a fixed array and a
// view is published by the count after it is built. Ownership: the server (ServeRun) owns it; the
// ImageSource and the GPU stages borrow it and must not outlive it.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "decoders/image_pipeline.h"
#include "decoders/view.h"
#include "server/host/stream_host.h"
#include "server/produce/sample_source.h"
#include "server/produce/slot_layout.h"
#include "server/produce/tensor_conversion.h"

namespace batchcast {

class ViewSet {
 public:
  enum class Staging { kHost, kGpuConvert, kGpuDecode };

  // View 0 is `transform` (its seed the stream's). `decoder_flag` names the GPU decoder in errors
  // ("--decoder nvjpeg"); chunks hold `chunk` samples. Throws Error for a transform the staging
  // cannot make.
  ViewSet(const View& transform, Staging staging, std::string decoder_flag, uint32_t chunk);

  // The view `text` asks for over `transform`, checked against the staging's decoder (the GPU
  // decoders resize bilinearly only). Throws Error naming the view, the field and the fix.
  static View decodable(const std::string& text, const View& transform, Staging staging,
                        const std::string& decoder_flag);

  // The view `text` asks for, one already served or a new one, with its slot bytes and tensors.
  // Errors are in the answer (the consumer is refused with them), never thrown.
  StreamHostOptions::ViewAnswer answer(const std::string& text);

  uint32_t count() const { return count_.load(std::memory_order_acquire); }
  const View& view(uint32_t v) const { return entries_[v]->view; }
  // What decodes view v's samples (its staged options: see Staging).
  const ImagePipeline& pipeline(uint32_t v) const { return entries_[v]->pipeline; }
  // View v's tensors as the pipeline writes them ("#0" images, "#1" int64 labels), and as its
  // slot holds them (after conversions(v)).
  const std::vector<SampleTensor>& source_tensors(uint32_t v) const { return entries_[v]->staged; }
  const std::vector<SampleTensor>& slot_tensors(uint32_t v) const { return entries_[v]->slot; }
  const std::vector<TensorConversion>& conversions(uint32_t v) const {
    return entries_[v]->conversions;
  }
  const SlotLayout& layout(uint32_t v) const { return entries_[v]->layout; }

 private:
  struct Entry {
    View view;
    ImagePipeline pipeline;
    std::vector<TensorConversion> conversions;
    std::vector<SampleTensor> staged;
    std::vector<SampleTensor> slot;
    SlotLayout layout;
  };
  std::unique_ptr<const Entry> make_entry(const View& view) const;

  const View transform_;
  const Staging staging_;
  const std::string decoder_flag_;
  const uint32_t chunk_;
  std::array<std::unique_ptr<const Entry>, SampleSource::kMaxViews> entries_;
  std::atomic<uint32_t> count_{0};
  std::mutex add_mu_;
};

}  // namespace batchcast
