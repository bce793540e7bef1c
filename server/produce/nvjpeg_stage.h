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
// upload() then, on the stage's stream: nvJPEG decodes the chunk's images to full-size RGB in a
// device buffer (hardware engine for baseline JPEGs where the GPU has one, hybrid otherwise), a
// kernel (launch_crop_resize) crops, resizes, flips and normalises them straight into the slot,
// the labels are copied from pinned memory, and the slot's interprocess event is recorded. A pool
// on several GPUs decodes on the first and the slot is then copied to the others (ArenaSet).
//
// Mixed (a WaitedChunk given): a DecodeSplit (server/produce/decode_split.h) decides per sample,
// in fill(). A sample the CPU takes is decoded and augmented by the CPU pipeline itself, as uint8
// HWC squares into a pinned area per slot, and the same kernel passes those squares through
// unchanged (a 1:1 job), normalising them with the same table as `--decoder cpu`, so those samples
// are bit-identical to the CPU decoder's. A chunk all on the CPU is copied to the device in one
// copy; in a chunk the engine shares, each square goes up like an image the CPU decoded whole.
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
// producer thread, upload() from the producer's one upload thread (one stream, one decoder, one
// decode buffer). Ownership: created after the StreamHost (it borrows its ArenaSet) and
// destroyed before it; it borrows the ImageSource (dataset + pipeline options), which outlives
// it. Compiled only with nvJPEG (BATCHCAST_HAVE_NVJPEG).
#pragma once

#include <atomic>
#include <cstdint>
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
  // waited_chunk: `--decoder mixed` (above; StreamHost::waited_chunk); empty: `--decoder nvjpeg`.
  NvjpegStage(const ArenaSet& arenas, const ImageSource& source, uint32_t chunk_size,
              OnErrorPolicy on_error, DecodeSplit::WaitedChunk waited_chunk);
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
  // and its geometry.
  struct PreparedSample {
    ScratchBuffer bytes;
    size_t size = 0;
    bool decoded_on_cpu = false;  // `bytes` holds width*height*3 RGB (CMYK JPEGs, other formats)
    bool square = false;          // mixed: the CPU's finished square is in crops_ (1:1 geometry)
    int width = 0;
    int height = 0;
    SampleGeometry geometry;
    std::string path;
  };

  // Decodes samples [first, last) of `slot` into decoded_ (one group that fits the buffer) and
  // fills `jobs` with where each image landed; a sample no decoder can read is skipped or thrown.
  void decode_group(uint32_t slot, uint32_t first, uint32_t last, ResizeJob* jobs,
                    std::vector<bool>* failed);

  const ArenaSet& arenas_;
  const DeviceArena& arena_;  // the primary: chunks are written there
  const ImageSource& source_;
  uint32_t chunk_size_;
  OnErrorPolicy on_error_;
  std::vector<SampleTensor> tensors_;  // #0 images, #1 labels
  SlotLayout layout_;
  std::vector<PreparedSample> samples_;  // slot_count * chunk_size
  PinnedBuffer labels_;                  // slot_count * chunk_size int64
  PinnedBuffer jobs_;                    // slot_count * chunk_size ResizeJob
  // Set up by the constructor, then used by upload() only (one thread); skipped() reads skipped_
  // from others:
  NvjpegDecoder decoder_;
  CudaStream stream_;
  DeviceBuffer device_jobs_;  // chunk_size ResizeJob, reused in stream order
  DeviceBuffer table_;        // normalisation table (float outputs), identity (planar uint8)
  int element_bytes_ = 0;     // of table_'s entries
  DeviceBuffer decoded_;      // full-size RGB images of one group, grown on demand
  std::atomic<uint64_t> skipped_{0};
  // Mixed only:
  std::optional<DecodeSplit> split_;            // counts each side's samples, logged at the end
  std::optional<ImagePipeline> crop_pipeline_;  // the source's options, uint8 HWC output
  size_t crop_bytes_ = 0;                       // one uint8 square
  PinnedBuffer crops_;                          // slot_count * chunk_size squares
  DeviceBuffer device_crops_;                   // chunk_size squares, reused in stream order
};

}  // namespace batchcast
