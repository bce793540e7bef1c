#include "server/produce/nvjpeg_stage.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>

#include "common/cuda_check.h"
#include "common/error.h"
#include "decoders/image_decode.h"
#include "decoders/jpeg_decode.h"
#include "decoders/sample_check.h"

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

// The geometry that passes a finished size x size square (the CPU's crop) through unchanged: a
// 1:1 bilinear resize samples every pixel exactly, so only the normalisation table applies.
SampleGeometry square_geometry(int size) {
  SampleGeometry g;
  g.crop = g.scaled = PixelRect{0, 0, size, size};
  g.resize_w = g.resize_h = size;
  return g;
}

}  // namespace

NvjpegStage::NvjpegStage(const ArenaSet& arenas, const ImageSource& source, uint32_t chunk_size,
                         OnErrorPolicy on_error, DecodeSplit::WaitedChunk waited_chunk)
    : arenas_(arenas),
      arena_(arenas.primary()),
      source_(source),
      chunk_size_(chunk_size),
      on_error_(on_error),
      tensors_(source.tensors()),
      layout_(SlotLayout::plan(tensors_, chunk_size)),
      samples_(static_cast<size_t>(arenas.primary().slot_count()) * chunk_size),
      decoder_(arenas.primary().device()) {
  if (layout_.bytes > arena_.slot_bytes())
    throw Error("a chunk needs " + std::to_string(layout_.bytes) + " bytes but GPU slots hold " +
                std::to_string(arena_.slot_bytes()));
  CudaDeviceGuard guard(arena_.device());
  labels_ = PinnedBuffer::allocate(samples_.size() * sizeof(int64_t));
  jobs_ = PinnedBuffer::allocate(samples_.size() * sizeof(ResizeJob));
  stream_ = CudaStream::create();
  device_jobs_ = DeviceBuffer::allocate(chunk_size * sizeof(ResizeJob));
  const PipelineOptions& o = source_.pipeline().options();
  ConvertTable table;
  if (o.output != DType::kUInt8) {
    table = make_convert_table(o.output, o.mean, o.std);
  } else if (o.uint8_layout == Uint8Layout::kCHW) {  // planar uint8: the kernel's identity table
    table.element_bytes = 1;
    for (int c = 0; c < 3; ++c)
      for (int v = 0; v < 256; ++v) table.bytes.push_back(static_cast<uint8_t>(v));
  }
  if (!table.bytes.empty()) {
    element_bytes_ = table.element_bytes;
    table_ = DeviceBuffer::allocate(table.bytes.size());
    cuda_check(
        cudaMemcpy(table_.data(), table.bytes.data(), table.bytes.size(), cudaMemcpyHostToDevice),
        "copying the normalisation table to cuda:" + std::to_string(arena_.device()));
  }
  if (waited_chunk) {
    PipelineOptions crop = o;
    crop.output = DType::kUInt8;
    crop.uint8_layout = Uint8Layout::kHWC;
    crop_pipeline_.emplace(crop);
    crop_bytes_ = crop_pipeline_->sample_bytes();
    crops_ = PinnedBuffer::allocate(samples_.size() * crop_bytes_);
    device_crops_ = DeviceBuffer::allocate(chunk_size * crop_bytes_);
    split_.emplace(std::move(waited_chunk));
  }
  spdlog::info("{} on cuda:{} (nvJPEG {} backend)",
               split_ ? "CPU workers first, nvJPEG for what consumers wait for," : "nvJPEG decoder",
               arena_.device(), decoder_.backend());
}

NvjpegStage::~NvjpegStage() {
  if (stream_.get()) (void)cudaStreamSynchronize(stream_.get());
  if (split_)
    spdlog::info("--decoder mixed: {} samples decoded on the CPU, {} on the GPU's JPEG decoder",
                 split_->cpu_samples(), split_->engine_samples());
}

void NvjpegStage::begin(const FillLease& lease, uint32_t /*samples*/) {
  const uint32_t slot = lease.slot;
  // The slot's event is recorded after its last upload; once that is done, nothing on the device
  // reads this slot's host-side samples, crops, labels or jobs any more.
  arenas_.wait_for_slot(slot);
}

void NvjpegStage::fill(const FillLease& lease, uint32_t position, uint64_t index, uint64_t epoch) {
  const uint32_t slot = lease.slot;
  const size_t at = static_cast<size_t>(slot) * chunk_size_ + position;
  PreparedSample& s = samples_[at];
  const DatasetEntry& entry = source_.dataset()[index];
  s.path = entry.path;
  s.size = read_image_file(entry.path, s.bytes);
  const uint8_t* data = s.bytes.data();
  reinterpret_cast<int64_t*>(labels_.data())[at] = entry.label;
  // Checked before the split: under --decoder mixed a file is refused or accepted the same way
  // whichever side decodes it.
  const ImagePipeline& pipeline = source_.pipeline();
  const int64_t max_pixels = pipeline.options().max_image_pixels;
  const SampleHeader header = check_sample(data, s.size, entry.path, max_pixels);
  if (split_ && split_->cpu_decodes(lease.seq)) {
    crop_pipeline_->process_bytes(data, s.size, entry.path, epoch, index,
                                  crops_.data() + at * crop_bytes_);
    s.square = true;
    s.decoded_on_cpu = false;
    s.width = s.height = crop_pipeline_->options().image_size;
    s.geometry = square_geometry(s.width);
    return;
  }
  s.square = false;
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
    const size_t row = static_cast<size_t>(rgb.width) * 3;
    uint8_t* out = s.bytes.get(row * rgb.height);  // rgb lives in another (thread_local) buffer
    for (int y = 0; y < rgb.height; ++y)
      std::memcpy(out + y * row, rgb.pixels + y * rgb.stride, row);
    s.size = row * rgb.height;
  }
  // JPEG geometry carries the DCT-domain factor the GPU kernel's box filter imitates; the other
  // formats have none, as on the CPU.
  s.geometry = pipeline.geometry(s.width, s.height, jpeg, epoch, index, entry.path);
}

void NvjpegStage::decode_group(uint32_t slot, uint32_t first, uint32_t last, ResizeJob* jobs,
                               std::vector<bool>* failed) {
  cudaStream_t stream = stream_.get();
  std::vector<JpegBytes> jpegs;
  std::vector<uint8_t*> outs;
  std::vector<uint32_t> positions;
  uint64_t offset = 0;
  for (uint32_t k = first; k < last; ++k) {
    PreparedSample& s = samples_[static_cast<size_t>(slot) * chunk_size_ + k];
    jobs[k] = make_resize_job(s.geometry, s.width, s.height, offset, static_cast<int>(k));
    if (s.square) {  // mixed: the CPU's square, passed through like a CPU-decoded image
      cuda_check(cudaMemcpyAsync(
                     decoded_.data() + offset,
                     crops_.data() + (static_cast<size_t>(slot) * chunk_size_ + k) * crop_bytes_,
                     crop_bytes_, cudaMemcpyHostToDevice, stream),
                 "uploading the CPU-decoded square of " + s.path);
    } else if (s.decoded_on_cpu) {
      cuda_check(cudaMemcpyAsync(decoded_.data() + offset, s.bytes.data(), s.size,
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

void NvjpegStage::upload(const FillLease& lease, uint32_t sample_count) {
  CudaDeviceGuard guard(arena_.device());
  cudaStream_t stream = stream_.get();
  const size_t base = static_cast<size_t>(lease.slot) * chunk_size_;
  ResizeJob* jobs = reinterpret_cast<ResizeJob*>(jobs_.data()) + base;
  int64_t* labels = reinterpret_cast<int64_t*>(labels_.data()) + base;
  const PipelineOptions& o = source_.pipeline().options();
  const std::string where =
      " for chunk " + std::to_string(lease.seq) + " on cuda:" + std::to_string(arena_.device());
  // Crops, resizes, flips and normalises images[jobs[first, first + n)] into the slot.
  auto launch = [&](const uint8_t* images, uint32_t first, uint32_t n) {
    cuda_check(cudaMemcpyAsync(device_jobs_.data() + first * sizeof(ResizeJob), jobs + first,
                               n * sizeof(ResizeJob), cudaMemcpyHostToDevice, stream),
               "copying resize jobs" + where);
    launch_crop_resize(images, reinterpret_cast<const ResizeJob*>(device_jobs_.data()) + first, n,
                       o.image_size, table_.data(), element_bytes_, lease.data + layout_.offsets[0],
                       stream);
  };
  const auto first_sample = samples_.begin() + static_cast<std::ptrdiff_t>(base);
  if (split_ && std::all_of(first_sample, first_sample + sample_count,
                            [](const PreparedSample& s) { return s.square; })) {
    // Mixed, a chunk the CPU decoded whole: its finished squares in one copy, passed through.
    for (uint32_t k = 0; k < sample_count; ++k)
      jobs[k] = make_resize_job(square_geometry(o.image_size), o.image_size, o.image_size,
                                k * crop_bytes_, static_cast<int>(k));
    cuda_check(cudaMemcpyAsync(device_crops_.data(), crops_.data() + base * crop_bytes_,
                               sample_count * crop_bytes_, cudaMemcpyHostToDevice, stream),
               "copying the CPU-decoded samples" + where);
    launch(device_crops_.data(), 0, sample_count);
  } else {  // nvJPEG decodes the chunk (the CPU's squares aside), in groups that fit the budget
    std::vector<bool> failed(sample_count);
    for (uint32_t first = 0; first < sample_count;) {
      uint64_t bytes = 0;
      uint32_t last = first;
      while (last < sample_count) {
        const PreparedSample& s = samples_[base + last];
        uint64_t more = decoded_bytes(s.width, s.height);
        if (last > first && bytes + more > kDecodeBudget) break;
        bytes += more;
        ++last;
      }
      if (decoded_.size() < bytes) {
        cuda_check(cudaStreamSynchronize(stream), "waiting for the decode buffer to be free");
        decoded_ = DeviceBuffer();  // free first: peak memory is one buffer, not two
        decoded_ = DeviceBuffer::allocate(bytes);
      }
      decode_group(lease.slot, first, last, jobs, &failed);
      // on_error=skip: a position no decoder could read shows another image of its group.
      for (uint32_t k = first; k < last; ++k) {
        if (!failed[k]) continue;
        uint32_t good = first;
        while (good < last && failed[good]) ++good;
        if (good == last)
          throw Error("no image of chunk " + std::to_string(lease.seq) + " could be decoded");
        jobs[k] = jobs[good];
        jobs[k].output_index = static_cast<int32_t>(k);
        labels[k] = labels[good];
      }
      launch(decoded_.data(), first, last - first);
      first = last;
    }
  }
  cuda_check(cudaMemcpyAsync(lease.data + layout_.offsets[1], labels,
                             sample_count * sizeof(int64_t), cudaMemcpyHostToDevice, stream),
             "copying the labels of chunk " + std::to_string(lease.seq));
  cuda_check(cudaEventRecord(arena_.slot_event(lease.slot), stream),
             "recording the ready event of slot " + std::to_string(lease.slot));
  arenas_.replicate(lease.slot, layout_.bytes, stream);  // to the pool's other GPUs, if any
}

}  // namespace batchcast
