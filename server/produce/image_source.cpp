#include "server/produce/image_source.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>

#include "decoders/scratch_buffer.h"
#include "decoders/shrink_decode.h"

namespace batchcast {

bool ImageSource::cached_view(uint32_t view) const {
  if (!cache_) return false;
  const int size = views_.pipeline(view).options().image_size;
  if (size <= cache_->side()) return true;
  if (!told_uncached_[view].exchange(true))
    spdlog::warn(
        "view {} ({} px) is larger than the decoded cache's images ({} px on their shorter "
        "side): it is decoded from the files every epoch; serve with --cache-side {} or more to "
        "make it from the cache",
        view, size, cache_->side(), size);
  return false;
}

void ImageSource::fill_views(uint64_t index, uint64_t epoch,
                             const std::vector<std::vector<uint8_t*>>& outs) const {
  const auto& entry = dataset_[index];
  std::array<const ImagePipeline*, kMaxViews> pipelines{};
  std::array<void*, kMaxViews> from_cache{};  // null: a view not made from the cache
  std::array<void*, kMaxViews> from_file{};   // null: a view not decoded from the file
  bool any_cached = false;
  for (size_t v = 0; v < outs.size(); ++v) {
    pipelines[v] = &views_.pipeline(static_cast<uint32_t>(v));
    if (outs[v].empty()) continue;  // a chunk not made for this view
    const bool cached = cached_view(static_cast<uint32_t>(v));
    (cached ? from_cache : from_file)[v] = outs[v][0];
    any_cached |= cached;
  }
  if (any_cached) {
    std::optional<RgbView> image = cache_->find(index);
    if (!image && cache_->admitting()) {
      thread_local ScratchBuffer file;
      const size_t size = read_image_file(entry.path, file);
      image = decode_shrunk(file.data(), size, entry.path,
                            pipelines[0]->options().max_image_pixels, cache_->side());
      cache_->insert(index, *image);  // not kept: another worker keeps it, or full; same bytes
    }
    if (image) {
      process_views_decoded(pipelines.data(), from_cache.data(), outs.size(), *image, entry.path,
                            epoch, index);
    } else {
      for (size_t v = 0; v < outs.size(); ++v)
        if (from_cache[v]) from_file[v] = from_cache[v];
    }
  }
  if (std::any_of(from_file.begin(), from_file.end(), [](void* out) { return out != nullptr; }))
    process_views(pipelines.data(), from_file.data(), outs.size(), entry.path, epoch, index);
  for (const auto& view : outs)
    if (!view.empty()) std::memcpy(view[1], &entry.label, sizeof(entry.label));
}

}  // namespace batchcast
