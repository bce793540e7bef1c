// NvjpegStage: the ChunkStage of a GPU pool that decodes on the GPU (`serve --decoder nvjpeg`),
// or on the CPU workers first and on the GPU what they cannot keep up with (`--decoder mixed`).
//
// fill() runs on the producer's worker threads and does the CPU's small share: it reads the file,
// checks it with the CPU pipeline's own check sequence (decoders/sample_check.h: signature,
// header, decompression-bomb guard, JPEG EOI marker; so on_error=skip replaces such samples the
// usual way) and draws the sample's geometry with ImagePipeline::geometry, i.e. the CPU pipeline's
// own SampleRng draws.
// What nvJPEG cannot read (CMYK/YCCK JPEGs; PNG, BMP, PNM, TIFF, WebP) is decoded whole to RGB on
// the CPU right there (decoders/image_decode.h, as the CPU pipeline decodes it) and goes through
// the same GPU crop/resize kernel.
// upload() then, on the stage's engine lane (a CUDA stream): nvJPEG decodes the chunk's images to
// full-size RGB in a device buffer (hardware engine for baseline JPEGs where the GPU has one,
// hybrid otherwise), a kernel (launch_crop_resize) crops, resizes, flips and normalises them
// straight into the slot, the labels are copied from pinned memory, and the slot's interprocess
// event is recorded. A pool on several GPUs decodes on the first and the slot is then copied to
// the others (ArenaSet).
//
// Mixed (a DecodeSplit::Stream given): a DecodeSplit (server/produce/decode_split.h) gives each
// chunk to one side, in fill(), from the two sides' rates, which fill() (a worker's seconds per
// sample) and upload() (an engine chunk's) measure, or every chunk to the engine where its trial
// found that better for the consumers. A chunk the CPU takes is decoded and augmented by the CPU
// pipeline itself, as uint8 HWC squares into a pinned area per slot, and the same kernel passes
// those squares through unchanged (a 1:1 job), normalising them with the same table as `--decoder
// cpu`, so those samples are bit-identical to the CPU decoder's. An engine chunk is nvJPEG's
// (upload_decoded_chunk); the squares go up in one copy per view (upload_squares).
//
// Decoded cache (ImageSource::cache(), `--cache decoded`): a sample the cache holds is not read;
// its cached image goes up like a CPU-decoded file and the same kernel crops every view from it,
// each view's geometry drawn on the cached image's size (as the CPU pipeline draws it there).
// While the cache admits images, misses fill it on the CPU workers (decoders/shrink_decode.h),
// under nvjpeg and mixed alike: the first epoch decodes at the workers' pace and every later one
// reads no file; once it is full, the rest are decoded as without a cache. The cache's memory is
// pinned as it is reserved (pin_cache_block).
//
// Views (docs/views.md): view v of the pool has its own ArenaSet and is the source's view v (its
// own ImagePipeline: size, crop policy, flip, normalisation, seed). Each image is read, checked
// and decoded once for all views; fill() draws each view's geometry with that view's pipeline, and
// upload() launches one crop/resize per view from the one decode into that view's slot, so a
// view's slot holds what a one-view stage whose source options are the view's would write. A
// mixed CPU chunk is decoded once on the CPU for all views (process_views_bytes) into each view's
// uint8 squares. The stage learns a view when the first lease carrying it reaches begin(); only
// the views a lease fills (FillLease::views: a private chunk, its consumer's view alone) are
// drawn, launched, labelled and signalled.
//
// Output: the slot holds what the CPU pipeline's slot would hold (same tensors, dtypes, shapes,
// crops and flips); pixels agree within tolerance, not bit for bit: nvJPEG's IDCT and chroma
// upsampling differ from libjpeg-turbo's, and the CPU's DCT-domain downscale is approximated by a
// box filter. Corrupt entropy data that nvJPEG decodes without an error is not detected (the CPU
// pipeline would detect it where it decodes); an image nvJPEG refuses at decode time is decoded on
// the CPU, and if that fails too, the stream fails (on_error=raise) or the position is filled
// with another sample of the chunk and counted in skipped() (on_error=skip).
//
// Thread-safety: fill() from any worker (each position written by one worker), begin() from the
// producer thread, upload() from the producer's one upload thread (two lanes, one decoder, one
// decode buffer). Views live in a fixed array published by their count, so begin() may add one
// while workers fill others. Ownership: created after the StreamHost (it borrows its ArenaSets)
// and destroyed before it; it borrows the ImageSource (dataset + pipeline options), which outlives
// it. Compiled only with nvJPEG (BATCHCAST_HAVE_NVJPEG).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "decoders/gpu_convert.h"
#include "decoders/nvjpeg_decode.h"
#include "decoders/scratch_buffer.h"
#include "server/produce/chunk_stage.h"
#include "server/produce/decode_split.h"
#include "server/produce/image_source.h"
#include "server/produce/sample_producer.h"
#include "server/produce/slot_layout.h"
#include "shm/arena_set.h"
#include "shm/cuda_pool.h"

namespace batchcast {

class NvjpegStage : public ChunkStage {
 public:
  // View v's arenas (the StreamHost's pool of that view); called from begin(), once per view.
  using ArenasOf = std::function<const ArenaSet*(uint32_t view)>;
  // mixed: `--decoder mixed` (above) on this stream, with the producer's `workers`; nullopt:
  // `--decoder nvjpeg`. View 0 is set up here.
  NvjpegStage(ArenasOf arenas_of, const ImageSource& source, uint32_t chunk_size,
              OnErrorPolicy on_error, std::optional<DecodeSplit::Stream> mixed, uint32_t workers);
  ~NvjpegStage() override;
  NvjpegStage(const NvjpegStage&) = delete;
  NvjpegStage& operator=(const NvjpegStage&) = delete;

  std::vector<SampleTensor> slot_tensors() const override { return source_.tensors(); }
  void begin(const FillLease& lease, uint32_t samples) override;
  void fill(const FillLease& lease, uint32_t position, uint64_t index, uint64_t epoch) override;
  void upload(const FillLease& lease, uint32_t sample_count) override;

  const char* backend() const { return decoder_.backend(); }
  // Samples whose GPU and CPU decodes both failed at upload time (on_error=skip only).
  uint64_t skipped() const override { return skipped_.load(); }

 private:
  // One position of one slot: the file's bytes (or, for what nvJPEG cannot read, CPU-decoded RGB)
  // and where upload() decoded it.
  struct PreparedSample {
    ScratchBuffer bytes;
    size_t size = 0;
    // `pixels` holds width*height*3 RGB: CPU-decoded (CMYK JPEGs, other formats; in `bytes`) or
    // the decoded cache's image.
    bool decoded_on_cpu = false;
    const uint8_t* pixels = nullptr;
    bool square = false;  // mixed: the CPU made each filled view's square (ViewStage::crops)
    int width = 0;
    int height = 0;
    uint64_t offset = 0;  // into decoded_, set by decode_group()
    std::string path;
  };
  // View v: the source's view v, written into its own arenas.
  struct ViewStage {
    const ArenaSet* arenas = nullptr;
    const ImagePipeline* pipeline = nullptr;  // the source's view
    SlotLayout layout;
    std::vector<SampleGeometry> geometry;  // slot_count * chunk_size, drawn by fill()
    PinnedBuffer jobs;                     // slot_count * chunk_size ResizeJob
    DeviceBuffer table;     // normalisation table (float outputs), identity (planar uint8)
    int element_bytes = 0;  // of table's entries
    // Mixed only:
    std::optional<ImagePipeline> crop_pipeline;  // the view's options, uint8 HWC output
    size_t crop_bytes = 0;                       // one uint8 square
    PinnedBuffer crops;                          // slot_count * chunk_size squares
    PinnedBuffer square_jobs;                    // slot_count * chunk_size ResizeJob, for crops
    DeviceBuffer device_crops;                   // chunk_size squares, reused in squares_' order
  };
  void add_view(uint32_t view);  // from begin() (or the constructor)
  // With a decoded cache whose side every view the lease fills fits: sample `index`'s cached
  // image, or a miss decoded and shrunk on this worker into the cache (or into s.bytes when
  // another worker caches it or the cache is full) while the cache admits images. nullopt:
  // decode the file as without a cache.
  std::optional<RgbView> cached_image(const FillLease& lease, uint64_t index, PreparedSample& s);
  // The decoded cache's reserved blocks are pinned (page-locked for the GPU) as they are
  // reserved, so that a cached image goes up in an asynchronous copy: the upload thread queues a
  // chunk's copies and kernels at once instead of waiting on each copy (under time-slicing, each
  // wait is a turn of the GPU). Unpinned in the destructor. Under the cache's allocation lock.
  void pin_cache_block(uint8_t* block, uint64_t bytes);

  // Decodes samples [first, last) of `slot` into decoded_ (one group that fits the buffer),
  // recording each one's offset there; a sample no decoder can read is skipped or thrown.
  void decode_group(uint32_t slot, uint32_t first, uint32_t last, std::vector<bool>* failed);
  // Mixed: every filled view's CPU-made squares of the chunk passed through into its slot, and
  // the `unfilled` positions (no decoder could read them, nor another image of their group) show
  // the chunk's first square.
  void upload_squares(const FillLease& lease, uint32_t sample_count,
                      const std::vector<bool>& unfilled);
  // nvJPEG: the chunk's samples that are not the CPU's squares, decoded once, in groups that fit
  // the decode budget, each group cropped and resized into every filled view's slot. Returns the
  // positions left unfilled (see upload_squares).
  std::vector<bool> upload_decoded_chunk(const FillLease& lease, uint32_t sample_count);
  // A CUDA stream and the device copy of the resize jobs launched on it (chunk_size ResizeJob,
  // reused in stream order by every view).
  struct Lane {
    CudaStream stream;
    DeviceBuffer jobs;
  };
  // Crops, resizes, flips and normalises images[jobs[first, first + n)] into view v's slot, on
  // `lane`.
  void launch(const Lane& lane, const ViewStage& v, uint8_t* slot, const uint8_t* images,
              const ResizeJob* jobs, uint32_t first, uint32_t n, const std::string& where);

  ArenasOf arenas_of_;
  const ImageSource& source_;
  int device_;  // the primary GPU of every view's arenas: where chunks are decoded and written
  uint32_t slot_count_;
  uint32_t chunk_size_;
  OnErrorPolicy on_error_;
  std::vector<PreparedSample> samples_;  // slot_count * chunk_size
  PinnedBuffer labels_;                  // slot_count * chunk_size int64
  std::array<std::unique_ptr<ViewStage>, SampleSource::kMaxViews> views_;
  std::atomic<uint32_t> view_count_{0};
  // Set up by the constructor, then used by upload() only (one thread); skipped() reads skipped_
  // from others:
  NvjpegDecoder decoder_;
  // Two lanes, so that a chunk of the CPU's squares never waits behind the engine: a hardware
  // decode first waits for everything queued on its stream (nvjpeg_decode.h), and under
  // time-slicing each such wait is a turn of the GPU.
  Lane engine_;   // nvJPEG's decodes and the images decoded whole (cached, CMYK, other formats)
  Lane squares_;  // the CPU's squares (mixed)
  CudaEvent squares_done_;  // a chunk with both kinds: its slot is ready after both lanes
  DeviceBuffer decoded_;      // full-size RGB images of one group, grown on demand
  std::atomic<uint64_t> skipped_{0};
  std::optional<DecodeSplit> split_;  // mixed only; its counts and rates logged at the end
  std::vector<uint8_t*> pinned_cache_;  // by pin_cache_block(), under the cache's lock
};

}  // namespace batchcast
