#include "server/produce/view_set.h"

#include "common/error.h"

namespace batchcast {

ViewSet::ViewSet(const View& transform, Staging staging, std::string decoder_flag, uint32_t chunk)
    : transform_(transform),
      staging_(staging),
      decoder_flag_(std::move(decoder_flag)),
      chunk_(chunk) {
  entries_[0] = make_entry(transform);
  count_.store(1, std::memory_order_release);
}

View ViewSet::decodable(const std::string& text, const View& transform, Staging staging,
                        const std::string& decoder_flag) {
  View view = View::resolve(text, transform);
  if (staging == Staging::kGpuDecode &&
      view.options().interpolation != Interpolation::kBilinear)
    throw Error("view '" + text + "': " + decoder_flag +
                " resizes bilinearly: drop its interpolation field, or serve it from a server "
                "with --decoder cpu");
  return view;
}

std::unique_ptr<const ViewSet::Entry> ViewSet::make_entry(const View& view) const {
  PipelineOptions staged = view.options();
  std::vector<TensorConversion> conversions;
  if (staging_ == Staging::kGpuConvert && staged.output != DType::kUInt8) {
    TensorConversion images;  // tensor #0; the labels (#1) are copied unchanged
    images.normalize = staged.output;
    images.mean = staged.mean;
    images.std = staged.std;
    conversions.push_back(images);
    staged.output = DType::kUInt8;  // HWC: what the GPU conversion reads
    staged.uint8_layout = Uint8Layout::kHWC;
  }
  ImagePipeline pipeline(staged);
  std::vector<SampleTensor> source = {{tuple_tensor_name(0), pipeline.dtype(), pipeline.sample_shape()},
                                      {tuple_tensor_name(1), DType::kInt64, {}}};
  std::vector<SampleTensor> slot = converted(source, conversions);
  SlotLayout layout = SlotLayout::plan(slot, chunk_);
  return std::unique_ptr<const Entry>(new Entry{view, std::move(pipeline), std::move(conversions),
                                                std::move(source), std::move(slot),
                                                std::move(layout)});
}

StreamHostOptions::ViewAnswer ViewSet::answer(const std::string& text) {
  StreamHostOptions::ViewAnswer answer;
  try {
    const View view = decodable(text, transform_, staging_, decoder_flag_);
    std::lock_guard lk(add_mu_);
    const uint32_t n = count();
    answer.view = n;
    for (uint32_t v = 0; v < n; ++v)
      if (entries_[v]->view == view) answer.view = v;
    if (answer.view == n) {
      if (n == SampleSource::kMaxViews)
        throw Error("this server already serves " + std::to_string(n) +
                    " views, the most one stream has; start another server for more");
      entries_[n] = make_entry(view);
      count_.store(n + 1, std::memory_order_release);
    }
    const Entry& e = *entries_[answer.view];
    answer.slot_bytes = e.layout.bytes;
    answer.specs = [layout = e.layout, slot = e.slot](uint32_t samples) {
      return layout.specs(slot, samples);
    };
  } catch (const Error& e) {
    answer.error = e.what();
  }
  return answer;
}

}  // namespace batchcast
