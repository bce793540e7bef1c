#include "decoders/jpeg_decode.h"

// jpeglib.h needs size_t and FILE declared before it.
#include <jerror.h>
#include <jpeglib.h>

#include <algorithm>
#include <csetjmp>
#include <cstdio>
#include <cstring>

#include "common/error.h"
#include "decoders/pil_convert.h"
#include "decoders/scratch_buffer.h"
#include "decoders/tj_handle.h"

namespace batchcast {

static_assert(TJCS_CMYK == 3 && TJCS_YCCK == 4, "JpegHeader::cmyk() spells these out");
namespace {

// Decoded pixels of the calling thread (see the header's contract on lifetime).
ScratchBuffer& pixel_buffer() {
  thread_local ScratchBuffer buffer;
  return buffer;
}

// One compressor per thread for baseline and one for progressive encodes: libjpeg-turbo 2.1's
// tjCompress2 leaves a handle in progressive mode after a TJFLAG_PROGRESSIVE call, so the next
// baseline encode on it came out progressive and, for some images, undecodable ("bad Huffman
// code" from libjpeg).
TjHandle& thread_compressor(bool progressive) {
  thread_local TjHandle baseline(TjHandle::Kind::kCompress);
  thread_local TjHandle progressive_handle(TjHandle::Kind::kCompress);
  return progressive ? progressive_handle : baseline;
}

TjHandle& thread_decompressor() {
  thread_local TjHandle handle(TjHandle::Kind::kDecompress);
  return handle;
}

// A progressive JPEG may declare any number of scans, each one a full pass over the coefficients;
// crafted files use that to burn CPU. Real encoders emit at most a few dozen.
constexpr int kMaxScans = 500;

// Warnings after which the decoded pixels are wrong (truncation, bad entropy data). Others
// (extraneous bytes between markers, odd JFIF versions, bad ICC profiles) leave pixels intact, are
// common in real photo collections, and are ignored as libjpeg, PIL and torchvision ignore them.
bool is_corrupting_warning(int code) {
  switch (code) {
    case JWRN_JPEG_EOF:
    case JWRN_HIT_MARKER:
    case JWRN_HUFF_BAD_CODE:
    case JWRN_MUST_RESYNC:
    case JWRN_BOGUS_PROGRESSION:
      return true;
    default:
      return false;
  }
}

// libjpeg reports errors through callbacks; this one jumps back to the decode call. The jump only
// crosses libjpeg's C frames, and the frame that called setjmp creates no C++ objects after it.
struct ErrorManager {
  jpeg_error_mgr pub;  // first member: libjpeg hands back a pointer to it
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

[[noreturn]] void on_error_exit(j_common_ptr cinfo) {
  auto* manager = reinterpret_cast<ErrorManager*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, manager->message);
  std::longjmp(manager->jump, 1);
}

void on_emit_message(j_common_ptr cinfo, int level) {
  if (level >= 0) return;  // trace output
  if (is_corrupting_warning(cinfo->err->msg_code)) on_error_exit(cinfo);
  cinfo->err->num_warnings++;
}

void on_progress(j_common_ptr cinfo) {
  auto* dinfo = reinterpret_cast<j_decompress_ptr>(cinfo);
  if (dinfo->input_scan_number > kMaxScans) {
    auto* manager = reinterpret_cast<ErrorManager*>(cinfo->err);
    std::snprintf(manager->message, sizeof(manager->message),
                  "progressive JPEG with more than %d scans", kMaxScans);
    std::longjmp(manager->jump, 1);
  }
}

// One libjpeg decompressor per thread, reused across images (its memory pools and tables survive
// jpeg_abort_decompress), like a TurboJPEG handle.
class LibjpegDecompressor {
 public:
  LibjpegDecompressor() {
    cinfo_.err = jpeg_std_error(&errors_.pub);
    errors_.pub.error_exit = on_error_exit;
    errors_.pub.emit_message = on_emit_message;
    if (setjmp(errors_.jump)) throw Error(std::string("libjpeg: ") + errors_.message);
    jpeg_create_decompress(&cinfo_);
    progress_.progress_monitor = on_progress;
    cinfo_.progress = &progress_;
  }
  ~LibjpegDecompressor() noexcept { jpeg_destroy_decompress(&cinfo_); }
  LibjpegDecompressor(const LibjpegDecompressor&) = delete;
  LibjpegDecompressor& operator=(const LibjpegDecompressor&) = delete;

  // Decodes `rect` of the image scaled by `factor`. Returns false and fills `error` on failure.
  bool decode_region(const uint8_t* data, size_t size, ScalingFactor factor, PixelRect rect,
                     RgbView* view, std::string* error) {
    // Everything with a destructor lives outside this frame or was created before setjmp.
    ScratchBuffer& buffer = pixel_buffer();
    if (setjmp(errors_.jump)) {
      jpeg_abort_decompress(&cinfo_);
      error->assign(errors_.message);
      return false;
    }
    jpeg_abort_decompress(&cinfo_);  // a bad_alloc may have left the last call mid-way
    jpeg_mem_src(&cinfo_, data, static_cast<unsigned long>(size));
    jpeg_read_header(&cinfo_, TRUE);
    cinfo_.out_color_space = JCS_RGB;
    cinfo_.scale_num = static_cast<unsigned>(factor.num);
    cinfo_.scale_denom = static_cast<unsigned>(factor.denom);
    cinfo_.dct_method = JDCT_ISLOW;     // TurboJPEG's default: accurate integer IDCT
    cinfo_.do_fancy_upsampling = TRUE;  // ditto (PIL decodes the same way)
    jpeg_start_decompress(&cinfo_);
    if (rect.left < 0 || rect.top < 0 || rect.width <= 0 || rect.height <= 0 ||
        static_cast<JDIMENSION>(rect.left + rect.width) > cinfo_.output_width ||
        static_cast<JDIMENSION>(rect.top + rect.height) > cinfo_.output_height ||
        cinfo_.output_components != 3) {
      std::snprintf(errors_.message, sizeof(errors_.message),
                    "crop %dx%d+%d+%d outside the %ux%u decoded image", rect.width, rect.height,
                    rect.left, rect.top, cinfo_.output_width, cinfo_.output_height);
      std::longjmp(errors_.jump, 1);
    }
    // jpeg_crop_scanline aligns the columns to iMCU boundaries (x_offset down, width up) and then
    // only inverse-transforms, upsamples and converts those columns. Fancy upsampling treats the
    // cropped edges as image edges, so the outermost column on each side differs from a full
    // decode; ask for kEdgeMargin extra columns each side so the rectangle's own pixels are exact.
    constexpr int kEdgeMargin = 2;
    const int padded_left = rect.left > kEdgeMargin ? rect.left - kEdgeMargin : 0;
    const int padded_right = static_cast<int>(std::min<JDIMENSION>(
        cinfo_.output_width, static_cast<JDIMENSION>(rect.left + rect.width + kEdgeMargin)));
    JDIMENSION x_offset = static_cast<JDIMENSION>(padded_left);
    JDIMENSION width = static_cast<JDIMENSION>(padded_right - padded_left);
    if (width < cinfo_.output_width) jpeg_crop_scanline(&cinfo_, &x_offset, &width);
    size_t stride = size_t{width} * 3;
    uint8_t* rows = buffer.get(stride * static_cast<size_t>(rect.height));
    if (rect.top > 0 && jpeg_skip_scanlines(&cinfo_, static_cast<JDIMENSION>(rect.top)) !=
                            static_cast<JDIMENSION>(rect.top)) {
      std::snprintf(errors_.message, sizeof(errors_.message), "cannot skip to row %d", rect.top);
      std::longjmp(errors_.jump, 1);
    }
    const JDIMENSION end_row = static_cast<JDIMENSION>(rect.top + rect.height);
    while (cinfo_.output_scanline < end_row) {
      JSAMPROW row_pointers[16];
      JDIMENSION wanted = end_row - cinfo_.output_scanline;
      if (wanted > 16) wanted = 16;
      for (JDIMENSION r = 0; r < wanted; ++r) {
        row_pointers[r] = rows + (cinfo_.output_scanline - rect.top + r) * stride;
      }
      if (jpeg_read_scanlines(&cinfo_, row_pointers, wanted) == 0) {
        std::snprintf(errors_.message, sizeof(errors_.message), "decoder stalled at row %u",
                      cinfo_.output_scanline);
        std::longjmp(errors_.jump, 1);
      }
    }
    // Rows below the crop are never decoded: stop here rather than jpeg_finish_decompress.
    jpeg_abort_decompress(&cinfo_);
    view->pixels = rows + (static_cast<size_t>(rect.left) - x_offset) * 3;
    view->width = rect.width;
    view->height = rect.height;
    view->stride = stride;
    return true;
  }

 private:
  jpeg_decompress_struct cinfo_{};
  ErrorManager errors_{};
  jpeg_progress_mgr progress_{};
};

LibjpegDecompressor& thread_libjpeg() {
  thread_local LibjpegDecompressor decompressor;
  return decompressor;
}

// TurboJPEG reports warnings as failures too; keep the same policy as the libjpeg path.
bool is_harmless_turbo_warning(tjhandle handle) {
  if (tjGetErrorCode(handle) != TJERR_WARNING) return false;
  const char* message = tjGetErrorStr2(handle);
  return std::strstr(message, "extraneous bytes") != nullptr ||
         std::strstr(message, "JFIF revision") != nullptr ||
         std::strstr(message, "ICC") != nullptr ||
         std::strstr(message, "Adobe color transform") != nullptr;
}

}  // namespace

bool has_end_marker(const uint8_t* data, size_t size) {
  constexpr size_t kTailBytes = 4096;
  size_t start = size > kTailBytes ? size - kTailBytes : 0;
  for (size_t i = size; i-- > start + 1;) {
    if (data[i] == 0xD9 && data[i - 1] == 0xFF) return true;
  }
  return false;
}

bool looks_like_jpeg(const uint8_t* data, size_t size) {
  return size >= 3 && data[0] == 0xFF && data[1] == 0xD8 && data[2] == 0xFF;
}

JpegHeader read_jpeg_header(const uint8_t* data, size_t size, const std::string& name) {
  TjHandle& handle = thread_decompressor();
  JpegHeader header;
  if (tjDecompressHeader3(handle.get(), data, static_cast<unsigned long>(size), &header.width,
                          &header.height, &header.subsampling, &header.colorspace) != 0) {
    throw SampleError(name, "corrupt JPEG header: " + handle.last_error());
  }
  if (header.width <= 0 || header.height <= 0) {
    throw SampleError(name, "JPEG header has no pixels");
  }
  return header;
}

ScalingFactor choose_scaling(int crop_w, int crop_h, int out_w, int out_h) {
  ScalingFactor best;
  if (crop_w < 2 * out_w || crop_h < 2 * out_h) return best;
  int count = 0;
  const tjscalingfactor* factors = tjGetScalingFactors(&count);
  for (int i = 0; factors != nullptr && i < count; ++i) {
    ScalingFactor candidate{factors[i].num, factors[i].denom};
    if (candidate.num >= candidate.denom) continue;  // enlargements
    if (candidate.scale(crop_w) < out_w || candidate.scale(crop_h) < out_h) continue;
    // Smaller num/denom = larger reduction; compare without division.
    if (int64_t{candidate.num} * best.denom < int64_t{best.num} * candidate.denom) {
      best = candidate;
    }
  }
  return best;
}

RgbView decode_jpeg_full_turbo(const uint8_t* data, size_t size, const std::string& name,
                               ScalingFactor factor) {
  TjHandle& handle = thread_decompressor();
  JpegHeader header = read_jpeg_header(data, size, name);
  const int width = factor.scale(header.width);
  const int height = factor.scale(header.height);
  const size_t pixel_count = static_cast<size_t>(width) * static_cast<size_t>(height);
  const size_t stride = static_cast<size_t>(width) * 3;
  uint8_t* pixels = pixel_buffer().get(pixel_count * 3);
  // libjpeg-turbo 2.1 cannot convert CMYK/YCCK to RGB itself ("Unsupported color conversion
  // request"): decode to CMYK and convert here.
  const bool cmyk = header.cmyk();
  thread_local ScratchBuffer cmyk_buffer;
  uint8_t* target = cmyk ? cmyk_buffer.get(pixel_count * 4) : pixels;
  if (tjDecompress2(handle.get(), data, static_cast<unsigned long>(size), target, width, 0, height,
                    cmyk ? TJPF_CMYK : TJPF_RGB, 0) != 0 &&
      !is_harmless_turbo_warning(handle.get())) {
    throw SampleError(name, "corrupt or truncated JPEG: " + handle.last_error());
  }
  if (cmyk) {
    // libjpeg hands back Adobe's inverted CMYK (255 = no ink), which PIL reads as "CMYK;I"
    // (inverted back) before its cmyk2rgb: the same here, so pixels equal PIL's.
    for (size_t i = 0; i < pixel_count; ++i) {
      const uint8_t* in = target + i * 4;
      const uint8_t cmyk[4] = {static_cast<uint8_t>(255 - in[0]), static_cast<uint8_t>(255 - in[1]),
                               static_cast<uint8_t>(255 - in[2]),
                               static_cast<uint8_t>(255 - in[3])};
      cmyk_to_rgb(cmyk, pixels + i * 3);
    }
  }
  return RgbView{pixels, width, height, stride};
}

RgbView decode_jpeg_region(const uint8_t* data, size_t size, const std::string& name,
                           const JpegHeader& header, ScalingFactor factor, PixelRect rect) {
  if (header.cmyk()) {
    // libjpeg cannot convert CMYK to RGB, so these rare files take a full decode.
    RgbView full = decode_jpeg_full_turbo(data, size, name, factor);
    if (rect.left < 0 || rect.top < 0 || rect.left + rect.width > full.width ||
        rect.top + rect.height > full.height) {
      throw SampleError(name, "crop outside the decoded image");
    }
    full.pixels += static_cast<size_t>(rect.top) * full.stride + static_cast<size_t>(rect.left) * 3;
    full.width = rect.width;
    full.height = rect.height;
    return full;
  }
  RgbView view;
  std::string error;
  if (!thread_libjpeg().decode_region(data, size, factor, rect, &view, &error)) {
    throw SampleError(name, "corrupt or truncated JPEG: " + error);
  }
  return view;
}

std::vector<uint8_t> encode_jpeg(const uint8_t* pixels, int width, int height, size_t stride,
                                 bool gray, int quality, int subsampling, int flags) {
  TjHandle& compressor = thread_compressor((flags & TJFLAG_PROGRESSIVE) != 0);
  TjBuffer buffer;
  unsigned long size = 0;
  if (tjCompress2(compressor.get(), pixels, width, static_cast<int>(stride), height,
                  gray ? TJPF_GRAY : TJPF_RGB, buffer.out_ptr(), &size,
                  gray ? TJSAMP_GRAY : subsampling, quality, flags) != 0) {
    throw Error("JPEG encoding of a " + std::to_string(width) + "x" + std::to_string(height) +
                " image failed: " + compressor.last_error());
  }
  return std::vector<uint8_t>(buffer.data(), buffer.data() + size);
}

}  // namespace batchcast
