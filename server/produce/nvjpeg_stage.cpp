#include "server/produce/nvjpeg_stage.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "common/cuda_check.h"
#include "common/error.h"
#include "decoders/image_decode.h"
#include "decoders/jpeg_decode.h"
#include "decoders/sample_check.h"
#include "decoders/shrink_decode.h"

namespace batchcast {
namespace {

// Device bytes of full-size images decoded at once; a chunk of larger images is decoded in groups
// (a 64-image chunk of 12-megapixel photos would otherwise need 2.3 GB).
constexpr uint64_t kDecodeBudget = uint64_t{1} << 30;
constexpr uint64_t kImageAlignment = 256;

uint64_t decoded_bytes(int width, int height) {
  uint64_t bytes = static_cast<uint64_t>(width) * height * 3;
  return (bytes + kImageAlignment - 1) / kImageAlignment * kImageAlignment;
}

// The job that passes a finished size x size square (the CPU's crop) through unchanged: a 1:1
// bilinear resize samples every pixel exactly, so only the normalisation table applies.
ResizeJob pass_through_job(int size, uint64_t source_offset, int output_index) {
  SampleGeometry g;
  g.crop = g.scaled = PixelRect{0, 0, size, size};
  g.resize_w = g.resize_h = size;
  return make_resize_job(g, size, size, source_offset, output_index);
}

// The kernel's table for a view's output: a ConvertTable for floats, the identity for planar
// uint8, none (empty) for HWC uint8.
ConvertTable output_table(const PipelineOptions& o) {
  ConvertTable table;
  if (o.output != DType::kUInt8) {
    table = make_convert_table(o.output, o.mean, o.std);
  } else if (o.uint8_layout == Uint8Layout::kCHW) {  // planar uint8: the kernel's identity table
    table.element_bytes = 1;
    for (int c = 0; c < 3; ++c)
      for (int v = 0; v < 256; ++v) table.bytes.push_back(static_cast<uint8_t>(v));
  }
  return table;
}

}  // namespace

NvjpegStage::NvjpegStage(ArenasOf arenas_of, const ImageSource& source, uint32_t chunk_size,
                         OnErrorPolicy on_error, std::optional<DecodeSplit::Stream> mixed,
                         uint32_t workers)
    : arenas_of_(std::move(arenas_of)),
      source_(source),
      device_(arenas_of_(0)->primary().device()),
      slot_count_(arenas_of_(0)->primary().slot_count()),
      chunk_size_(chunk_size),
      on_error_(on_error),
      samples_(static_cast<size_t>(slot_count_) * chunk_size),
      decoder_(device_) {
  CudaDeviceGuard guard(device_);
  labels_ = PinnedBuffer::allocate(samples_.size() * sizeof(int64_t));
  for (Lane* lane : {&engine_, &squares_}) {
    lane->stream = CudaStream::create();
    lane->jobs = DeviceBuffer::allocate(chunk_size * sizeof(ResizeJob));
  }
  squares_done_ = CudaEvent::create(false);
  if (mixed) split_.emplace(std::move(*mixed), slot_count_, workers);
  if (DecodedCache* cache = source_.cache())
    cache->on_reserve([this](uint8_t* block, uint64_t bytes) { pin_cache_block(block, bytes); });
  add_view(0);
  spdlog::info("{} on cuda:{} (nvJPEG {} backend)",
               split_ ? "CPU workers, and nvJPEG by its rate while consumers wait,"
                      : "nvJPEG decoder",
               device_, decoder_.backend());
}

NvjpegStage::~NvjpegStage() {
  for (Lane* lane : {&engine_, &squares_})
    if (lane->stream.get()) (void)cudaStreamSynchronize(lane->stream.get());
  if (DecodedCache* cache = source_.cache()) {
    cache->on_reserve(nullptr);
    CudaDeviceGuard guard(device_);
    for (uint8_t* block : pinned_cache_) (void)cudaHostUnregister(block);
  }
  if (split_) spdlog::info("--decoder mixed: {}", split_->describe());
}

void NvjpegStage::pin_cache_block(uint8_t* block, uint64_t bytes) {
  CudaDeviceGuard guard(device_);
  const cudaError_t e = cudaHostRegister(block, bytes, cudaHostRegisterPortable);
  if (e == cudaSuccess) {
    pinned_cache_.push_back(block);
  } else if (pinned_cache_.empty()) {
    (void)cudaGetLastError();
    spdlog::warn("decoded cache: cannot pin its memory for the GPU ({}): cached images go up "
                 "through pageable copies, slower",
                 cudaGetErrorString(e));
  }
}

void NvjpegStage::add_view(uint32_t view) {
  if (view >= views_.size())
    throw Error("a GPU pool decodes at most " + std::to_string(views_.size()) + " views");
  auto v = std::make_unique<ViewStage>();
  v->arenas = arenas_of_(view);
  v->pipeline = &source_.pipeline(view);
  v->layout = SlotLayout::plan(source_.view_tensors(view), chunk_size_);
  const DeviceArena& arena = v->arenas->primary();  // on view 0's GPUs, as many slots
  if (v->layout.bytes > arena.slot_bytes())
    throw Error("a chunk of view " + std::to_string(view) + " needs " +
                std::to_string(v->layout.bytes) + " bytes but its GPU slots hold " +
                std::to_string(arena.slot_bytes()));
  const size_t positions = samples_.size();
  v->geometry.resize(positions);
  CudaDeviceGuard guard(device_);
  v->jobs = PinnedBuffer::allocate(positions * sizeof(ResizeJob));
  const PipelineOptions& o = v->pipeline->options();
  const ConvertTable table = output_table(o);
  if (!table.bytes.empty()) {
    v->element_bytes = table.element_bytes;
    v->table = DeviceBuffer::allocate(table.bytes.size());
    cuda_check(
        cudaMemcpy(v->table.data(), table.bytes.data(), table.bytes.size(), cudaMemcpyHostToDevice),
        "copying the normalisation table of view " + std::to_string(view) +
            " to cuda:" + std::to_string(device_));
  }
  if (split_) {  // mixed: the CPU's squares of this view
    PipelineOptions crop = o;
    crop.output = DType::kUInt8;
    crop.uint8_layout = Uint8Layout::kHWC;
    v->crop_pipeline.emplace(crop);
    v->crop_bytes = v->crop_pipeline->sample_bytes();
    v->crops = PinnedBuffer::allocate(positions * v->crop_bytes);
    v->square_jobs = PinnedBuffer::allocate(positions * sizeof(ResizeJob));
    v->device_crops = DeviceBuffer::allocate(chunk_size_ * v->crop_bytes);
  }
  views_[view] = std::move(v);
  view_count_.store(view + 1, std::memory_order_release);
}

void NvjpegStage::begin(const FillLease& lease, uint32_t /*samples*/) {
  const uint32_t slot = lease.slot;
  // Views added since the last chunk: this lease is the first to carry them.
  uint32_t known = view_count_.load(std::memory_order_relaxed);
  for (; known < lease.views.size(); ++known) add_view(known);
  // A slot's events are recorded after its uploads, all on one stream; once the last is done,
  // nothing on the device reads this slot's host-side samples, crops, labels or jobs any more
  // (whichever views that upload filled: waiting on every view's covers it).
  for (uint32_t v = 0; v < known; ++v) views_[v]->arenas->wait_for_slot(slot);
  if (split_) split_->begin(slot);
}

std::optional<RgbView> NvjpegStage::cached_image(const FillLease& lease, uint64_t index,
                                                  PreparedSample& s) {
  DecodedCache* cache = source_.cache();
  if (!cache) return std::nullopt;
  for (size_t k = 0; k < lease.views.size(); ++k)
    if (lease.views[k] && !source_.cached_view(static_cast<uint32_t>(k))) return std::nullopt;
  if (std::optional<RgbView> image = cache->find(index)) return image;
  if (!cache->admitting()) return std::nullopt;
  s.size = read_image_file(s.path, s.bytes);
  const RgbView image = decode_shrunk(s.bytes.data(), s.size, s.path,
                                      source_.pipeline().options().max_image_pixels, cache->side());
  if (std::optional<RgbView> kept = cache->insert(index, image)) return kept;
  // Another worker's, or a full cache: `image` lives in a thread_local buffer the next fill of
  // this worker reuses, and upload() reads it later.
  return copy_packed(image, s.bytes.get(static_cast<size_t>(image.width) * 3 * image.height));
}

void NvjpegStage::fill(const FillLease& lease, uint32_t position, uint64_t index, uint64_t epoch) {
  const uint32_t slot = lease.slot;
  const size_t at = static_cast<size_t>(slot) * chunk_size_ + position;
  PreparedSample& s = samples_[at];
  const DatasetEntry& entry = source_.dataset()[index];
  s.path = entry.path;
  reinterpret_cast<int64_t*>(labels_.data())[at] = entry.label;
  const size_t views = lease.views.size();  // each published by begin() before this chunk's fills
  if (const std::optional<RgbView> image = cached_image(lease, index, s)) {
    // The GPU crops every view from the cached image, as from a CPU-decoded file.
    s.square = false;
    s.decoded_on_cpu = true;
    s.pixels = image->pixels;
    s.width = image->width;
    s.height = image->height;
    s.size = static_cast<size_t>(image->width) * 3 * image->height;
    for (size_t k = 0; k < views; ++k)
      if (lease.views[k])
        views_[k]->geometry[at] =
            views_[k]->pipeline->geometry(s.width, s.height, false, epoch, index, entry.path);
    return;
  }
  s.size = read_image_file(entry.path, s.bytes);
  const uint8_t* data = s.bytes.data();
  // Checked before the split: under --decoder mixed a file is refused or accepted the same way
  // whichever side decodes it.
  const int64_t max_pixels = source_.pipeline().options().max_image_pixels;
  const SampleHeader header = check_sample(data, s.size, entry.path, max_pixels);
  s.square = split_ && split_->cpu_decodes(slot);
  if (s.square) {  // the CPU pipeline makes every filled view's square; the GPU only normalises
    const auto start = std::chrono::steady_clock::now();
    std::array<const ImagePipeline*, SampleSource::kMaxViews> pipelines{};
    std::array<void*, SampleSource::kMaxViews> crops{};  // null: a view this chunk does not fill
    for (size_t k = 0; k < views; ++k) {
      ViewStage& v = *views_[k];
      pipelines[k] = &*v.crop_pipeline;
      if (lease.views[k]) crops[k] = v.crops.data() + at * v.crop_bytes;
    }
    process_views_bytes(pipelines.data(), crops.data(), views, data, s.size, entry.path, epoch,
                        index);
    split_->cpu_sample_done(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    return;
  }
  const bool jpeg = header.format == ImageFormat::kJpeg;
  s.decoded_on_cpu = !jpeg || header.jpeg.cmyk();
  s.width = static_cast<int>(header.width);
  s.height = static_cast<int>(header.height);
  if (s.decoded_on_cpu) {
    // nvJPEG reads neither other formats nor CMYK: the CPU decodes those whole, as the CPU
    // pipeline does, and the GPU crops and resizes them like the rest.
    RgbView rgb = jpeg ? decode_jpeg_full_turbo(data, s.size, entry.path, ScalingFactor{})
                       : decode_image(header.format, data, s.size, entry.path, max_pixels);
    s.width = rgb.width;
    s.height = rgb.height;
    s.size = static_cast<size_t>(rgb.width) * 3 * rgb.height;
    s.pixels = copy_packed(rgb, s.bytes.get(s.size)).pixels;  // rgb: another, thread_local buffer
  }
  // Each filled view draws its own crop and flip with its own pipeline (seed included). JPEG
  // geometry carries the DCT-domain factor the GPU kernel's box filter imitates; the other formats
  // have none, as on the CPU.
  for (size_t k = 0; k < views; ++k)
    if (lease.views[k])
      views_[k]->geometry[at] =
          views_[k]->pipeline->geometry(s.width, s.height, jpeg, epoch, index, entry.path);
}

void NvjpegStage::decode_group(uint32_t slot, uint32_t first, uint32_t last,
                               std::vector<bool>* failed) {
  cudaStream_t stream = engine_.stream.get();
  std::vector<JpegBytes> jpegs;
  std::vector<uint8_t*> outs;
  std::vector<uint32_t> positions;
  uint64_t offset = 0;
  for (uint32_t k = first; k < last; ++k) {
    PreparedSample& s = samples_[static_cast<size_t>(slot) * chunk_size_ + k];
    if (s.square) continue;  // mixed: the CPU's, uploaded by upload_squares()
    s.offset = offset;
    if (s.decoded_on_cpu) {
      cuda_check(cudaMemcpyAsync(decoded_.data() + offset, s.pixels, s.size,
                                 cudaMemcpyHostToDevice, stream),
                 "uploading the CPU-decoded pixels of " + s.path);
    } else {
      jpegs.push_back(JpegBytes{s.bytes.data(), s.size, s.path});
      outs.push_back(decoded_.data() + offset);
      positions.push_back(k);
    }
    offset += decoded_bytes(s.width, s.height);
  }
  try {
    decoder_.decode_batch(jpegs, outs, stream);
    return;
  } catch (const SampleError&) {
    // Some image of the batch was refused: find it by decoding one at a time.
  }
  for (size_t i = 0; i < jpegs.size(); ++i) {
    try {
      decoder_.decode_batch({jpegs[i]}, {outs[i]}, stream);
      continue;
    } catch (const SampleError& e) {
      spdlog::debug("nvJPEG refused {}; decoding it on the CPU", e.what());
    }
    try {
      RgbView rgb =
          decode_jpeg_full_turbo(jpegs[i].data, jpegs[i].size, jpegs[i].name, ScalingFactor{});
      // Pageable memory: the call returns once the bytes are staged, so the thread_local
      // buffer may be reused right after.
      cuda_check(cudaMemcpy2DAsync(outs[i], static_cast<size_t>(rgb.width) * 3, rgb.pixels,
                                   rgb.stride, static_cast<size_t>(rgb.width) * 3, rgb.height,
                                   cudaMemcpyHostToDevice, stream),
                 "uploading the CPU-decoded pixels of " + jpegs[i].name);
    } catch (const SampleError& e) {
      if (on_error_ == OnErrorPolicy::kRaise) throw;
      (*failed)[positions[i]] = true;
      if (skipped_++ < 20) spdlog::warn("skipped bad sample {} (on_error=skip)", e.what());
    }
  }
}

void NvjpegStage::launch(const Lane& lane, const ViewStage& v, uint8_t* slot,
                         const uint8_t* images, const ResizeJob* jobs, uint32_t first, uint32_t n,
                         const std::string& where) {
  cudaStream_t stream = lane.stream.get();
  cuda_check(cudaMemcpyAsync(lane.jobs.data() + first * sizeof(ResizeJob), jobs + first,
                             n * sizeof(ResizeJob), cudaMemcpyHostToDevice, stream),
             "copying resize jobs" + where);
  launch_crop_resize(images, reinterpret_cast<const ResizeJob*>(lane.jobs.data()) + first, n,
                     v.pipeline->options().image_size, v.table.data(), v.element_bytes,
                     slot + v.layout.offsets[0], stream);
}

void NvjpegStage::upload_squares(const FillLease& lease, uint32_t sample_count,
                                 const std::vector<bool>& unfilled) {
  const size_t base = static_cast<size_t>(lease.slot) * chunk_size_;
  int64_t* labels = reinterpret_cast<int64_t*>(labels_.data()) + base;
  const std::string where =
      " for chunk " + std::to_string(lease.seq) + " on cuda:" + std::to_string(device_);
  uint32_t square = 0;  // a position no decoder could read shows the first square
  while (square < sample_count && !samples_[base + square].square) ++square;
  for (uint32_t k = 0; k < sample_count; ++k)
    if (unfilled[k]) {
      if (square == sample_count)
        throw Error("no image of chunk " + std::to_string(lease.seq) + " could be decoded");
      labels[k] = labels[square];
    }
  for (size_t view = 0; view < lease.views.size(); ++view) {
    if (!lease.views[view]) continue;
    const ViewStage& v = *views_[view];
    ResizeJob* jobs = reinterpret_cast<ResizeJob*>(v.square_jobs.data()) + base;
    const int size = v.pipeline->options().image_size;
    uint32_t n = 0;
    for (uint32_t k = 0; k < sample_count; ++k) {
      const uint32_t from = unfilled[k] ? square : k;
      if (samples_[base + k].square || unfilled[k])
        jobs[n++] = pass_through_job(size, from * v.crop_bytes, static_cast<int>(k));
    }
    if (!n) continue;
    cuda_check(cudaMemcpyAsync(v.device_crops.data(), v.crops.data() + base * v.crop_bytes,
                               sample_count * v.crop_bytes, cudaMemcpyHostToDevice,
                               squares_.stream.get()),
               "copying the CPU-decoded samples" + where);
    launch(squares_, v, lease.views[view], v.device_crops.data(), jobs, 0, n, where);
  }
}

std::vector<bool> NvjpegStage::upload_decoded_chunk(const FillLease& lease, uint32_t sample_count) {
  const size_t base = static_cast<size_t>(lease.slot) * chunk_size_;
  int64_t* labels = reinterpret_cast<int64_t*>(labels_.data()) + base;
  const std::string where =
      " for chunk " + std::to_string(lease.seq) + " on cuda:" + std::to_string(device_);
  std::vector<bool> failed(sample_count), unfilled(sample_count);
  auto decoded = [&](uint32_t k) { return !samples_[base + k].square && !failed[k]; };
  for (uint32_t first = 0; first < sample_count;) {
    uint64_t bytes = 0;
    uint32_t last = first;
    while (last < sample_count) {
      const PreparedSample& s = samples_[base + last];
      uint64_t more = s.square ? 0 : decoded_bytes(s.width, s.height);
      if (last > first && bytes + more > kDecodeBudget) break;
      bytes += more;
      ++last;
    }
    if (decoded_.size() < bytes) {
      cuda_check(cudaStreamSynchronize(engine_.stream.get()),
                 "waiting for the decode buffer to be free");
      decoded_ = DeviceBuffer();  // free first: peak memory is one buffer, not two
      decoded_ = DeviceBuffer::allocate(bytes);
    }
    decode_group(lease.slot, first, last, &failed);
    // on_error=skip: a position no decoder could read shows another image of its group, or,
    // where the group has none (the rest are the CPU's squares), a square (upload_squares).
    uint32_t good = first;
    while (good < last && !decoded(good)) ++good;
    for (uint32_t k = first; k < last; ++k) {
      if (!failed[k]) continue;
      if (good == last)
        unfilled[k] = true;
      else
        labels[k] = labels[good];
    }
    // One decode, one crop/resize per filled view, each with its own geometry; the CPU's
    // squares are left to upload_squares().
    for (size_t view = 0; view < lease.views.size() && good < last; ++view) {
      if (!lease.views[view]) continue;
      const ViewStage& v = *views_[view];
      ResizeJob* jobs = reinterpret_cast<ResizeJob*>(v.jobs.data()) + base;
      uint32_t n = 0;
      for (uint32_t k = first; k < last; ++k) {
        if (samples_[base + k].square) continue;
        const uint32_t from = failed[k] ? good : k;
        const PreparedSample& s = samples_[base + from];
        jobs[first + n++] = make_resize_job(v.geometry[base + from], s.width, s.height, s.offset,
                                            static_cast<int>(k));
      }
      launch(engine_, v, lease.views[view], decoded_.data(), jobs, first, n, where);
    }
    first = last;
  }
  return unfilled;
}

void NvjpegStage::upload(const FillLease& lease, uint32_t sample_count) {
  const auto start = std::chrono::steady_clock::now();
  CudaDeviceGuard guard(device_);
  // Mixed: a CPU chunk holds the CPU's squares, and either kind may hold cached images.
  const PreparedSample* first = &samples_[static_cast<size_t>(lease.slot) * chunk_size_];
  const bool squares = std::any_of(first, first + sample_count, [](auto& s) { return s.square; });
  const bool engine = std::any_of(first, first + sample_count, [](auto& s) { return !s.square; });
  std::vector<bool> unfilled(sample_count);
  if (engine) unfilled = upload_decoded_chunk(lease, sample_count);
  const bool on_squares =
      squares || std::find(unfilled.begin(), unfilled.end(), true) != unfilled.end();
  if (on_squares) upload_squares(lease, sample_count, unfilled);
  // The labels and the slot's event go after the chunk's work on both lanes.
  cudaStream_t stream = engine ? engine_.stream.get() : squares_.stream.get();
  if (engine && on_squares) {
    cuda_check(cudaEventRecord(squares_done_.get(), squares_.stream.get()),
               "recording the CPU squares' upload of chunk " + std::to_string(lease.seq));
    cuda_check(cudaStreamWaitEvent(stream, squares_done_.get(), 0),
               "ordering chunk " + std::to_string(lease.seq) + "'s two kinds of samples");
  }
  const int64_t* labels = reinterpret_cast<const int64_t*>(labels_.data()) +
                          static_cast<size_t>(lease.slot) * chunk_size_;
  for (size_t k = 0; k < lease.views.size(); ++k) {
    if (!lease.views[k]) continue;
    const ViewStage& v = *views_[k];
    cuda_check(cudaMemcpyAsync(lease.views[k] + v.layout.offsets[1], labels,
                               sample_count * sizeof(int64_t), cudaMemcpyHostToDevice, stream),
               "copying the labels of chunk " + std::to_string(lease.seq));
    cuda_check(cudaEventRecord(v.arenas->primary().slot_event(lease.slot), stream),
               "recording the ready event of slot " + std::to_string(lease.slot));
    v.arenas->replicate(lease.slot, v.layout.bytes, stream);  // to the pool's other GPUs, if any
  }
  if (split_) {  // an engine chunk's upload waits for the GPU's earlier work and its own decode
    const auto on_engine = static_cast<uint32_t>(std::count_if(
        first, first + sample_count, [](auto& s) { return !s.square && !s.decoded_on_cpu; }));
    split_->uploaded(
        lease.slot, on_engine,
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
}

}  // namespace batchcast
