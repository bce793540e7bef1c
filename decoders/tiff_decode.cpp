// TIFF through libtiff, read from memory, first page only (as PIL's Image.open). Common layouts
// (8/16-bit grayscale, RGB and 8-bit CMYK, with or without extra samples, strips or tiles,
// interleaved) are read raw and converted as PIL does; anything else (palettes, YCbCr, bilevel,
// planar-separate, other bit depths) goes through libtiff's TIFFRGBAImage with the file's
// orientation ignored (PIL ignores it too). That path premultiplies alpha, which PIL does not:
// such files (rare) then differ from torchvision where they are not opaque. Errors and warnings
// go to per-file handlers (libtiff's global ones are process-wide, not thread-safe to set).
#include <tiffio.h>

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "common/error.h"
#include "decoders/format_decoders.h"
#include "decoders/pil_convert.h"
#include "decoders/sample_check.h"

namespace batchcast {
namespace {

struct TiffInput {
  const uint8_t* data;
  size_t size;
  toff_t at;
  std::string message;  // the first error libtiff reported
};

tmsize_t read_proc(thandle_t handle, void* out, tmsize_t n) {
  auto* input = static_cast<TiffInput*>(handle);
  if (n <= 0 || input->at >= input->size) return 0;
  const size_t count = std::min<size_t>(static_cast<size_t>(n), input->size - input->at);
  std::memcpy(out, input->data + input->at, count);
  input->at += count;
  return static_cast<tmsize_t>(count);
}
tmsize_t write_proc(thandle_t, void*, tmsize_t) { return 0; }
toff_t seek_proc(thandle_t handle, toff_t offset, int whence) {
  auto* input = static_cast<TiffInput*>(handle);
  const toff_t base = whence == SEEK_CUR ? input->at : whence == SEEK_END ? input->size : 0;
  input->at = base + offset;
  return input->at;
}
int close_proc(thandle_t) { return 0; }
toff_t size_proc(thandle_t handle) { return static_cast<TiffInput*>(handle)->size; }
int map_proc(thandle_t, void**, toff_t*) { return 0; }
void unmap_proc(thandle_t, void*, toff_t) {}

int on_error(TIFF*, void* user, const char* module, const char* format, va_list args) {
  auto* input = static_cast<TiffInput*>(user);
  if (input->message.empty()) {
    char text[512];
    std::vsnprintf(text, sizeof(text), format, args);
    input->message = std::string(module ? module : "libtiff") + ": " + text;
  }
  return 1;  // handled: libtiff's global handler (stderr) is not called
}
// Unknown tags, odd but readable fields: the pixels are intact, and PIL ignores them too.
int on_warning(TIFF*, void*, const char*, const char*, va_list) { return 1; }

struct TiffCloser {
  void operator()(TIFF* tif) const { TIFFClose(tif); }
};
struct OptionsFreer {
  void operator()(TIFFOpenOptions* options) const { TIFFOpenOptionsFree(options); }
};

template <typename T>
T field(TIFF* tif, ttag_t tag) {
  T value{};
  TIFFGetFieldDefaulted(tif, tag, &value);
  return value;
}

// Reads the interleaved samples of the whole image into `raw` (rows of `row_bytes`); false on a
// libtiff error (its message is in the input) or a tile above `max_bytes`.
bool read_interleaved(TIFF* tif, uint32_t width, uint32_t height, size_t row_bytes,
                      uint64_t max_bytes, uint8_t* raw) {
  const size_t total = row_bytes * height;
  if (!TIFFIsTiled(tif)) {
    const uint32_t rows_per_strip = std::min(field<uint32_t>(tif, TIFFTAG_ROWSPERSTRIP), height);
    for (uint32_t row = 0; row < height; row += rows_per_strip) {
      const size_t at = row_bytes * row;
      const size_t want = std::min(row_bytes * rows_per_strip, total - at);
      const tmsize_t got = TIFFReadEncodedStrip(tif, TIFFComputeStrip(tif, row, 0), raw + at,
                                                static_cast<tmsize_t>(want));
      if (got < 0 || static_cast<size_t>(got) < want) return false;
    }
    return true;
  }
  const uint32_t tile_w = field<uint32_t>(tif, TIFFTAG_TILEWIDTH);
  const uint32_t tile_h = field<uint32_t>(tif, TIFFTAG_TILELENGTH);
  const tmsize_t tile_size = TIFFTileSize(tif);
  if (tile_w == 0 || tile_h == 0 || tile_size <= 0 ||
      static_cast<uint64_t>(tile_size) > max_bytes ||
      static_cast<uint64_t>(tile_size) / (tile_w * uint64_t{tile_h}) < row_bytes / width)
    return false;
  const size_t pixel_bytes = row_bytes / width;
  thread_local ScratchBuffer tile_buffer;
  uint8_t* tile = tile_buffer.get(static_cast<size_t>(tile_size));
  for (uint32_t ty = 0; ty < height; ty += tile_h) {
    for (uint32_t tx = 0; tx < width; tx += tile_w) {
      if (TIFFReadTile(tif, tile, tx, ty, 0, 0) < 0) return false;
      const size_t copy = pixel_bytes * std::min(tile_w, width - tx);
      for (uint32_t y = 0; y < tile_h && ty + y < height; ++y) {
        std::memcpy(raw + row_bytes * (ty + y) + pixel_bytes * tx, tile + pixel_bytes * tile_w * y,
                    copy);
      }
    }
  }
  return true;
}

}  // namespace

RgbView decode_tiff(const uint8_t* data, size_t size, const DecodeTarget& target) {
  const std::string& name = target.name;
  TiffInput input{data, size, 0, {}};
  std::unique_ptr<TIFFOpenOptions, OptionsFreer> options(TIFFOpenOptionsAlloc());
  if (!options) throw Error("libtiff could not allocate its open options (out of memory)");
  TIFFOpenOptionsSetErrorHandlerExtR(options.get(), on_error, &input);
  TIFFOpenOptionsSetWarningHandlerExtR(options.get(), on_warning, &input);
  // libtiff allocates strips and tiles from what the header claims: no single buffer beyond what
  // the bomb guard admits for a whole image (8 bytes a pixel: RGBA at 16 bits).
  TIFFOpenOptionsSetMaxSingleMemAlloc(options.get(),
                                      static_cast<tmsize_t>(target.max_image_pixels) * 8);
  // "m": no memory mapping (the client procs read the caller's bytes).
  std::unique_ptr<TIFF, TiffCloser> tif(
      TIFFClientOpenExt(name.c_str(), "rm", &input, read_proc, write_proc, seek_proc, close_proc,
                        size_proc, map_proc, unmap_proc, options.get()));
  auto failed = [&](const char* what) {
    return SampleError(name, std::string("corrupt or truncated TIFF (") + what + ")" +
                                 (input.message.empty() ? "" : ": " + input.message));
  };
  if (!tif) throw failed("cannot read the header");
  const uint32_t width = field<uint32_t>(tif.get(), TIFFTAG_IMAGEWIDTH);
  const uint32_t height = field<uint32_t>(tif.get(), TIFFTAG_IMAGELENGTH);
  check_pixel_count(width, height, target.max_image_pixels, name);
  const uint16_t bits = field<uint16_t>(tif.get(), TIFFTAG_BITSPERSAMPLE);
  const uint16_t spp = field<uint16_t>(tif.get(), TIFFTAG_SAMPLESPERPIXEL);
  const uint16_t photometric = field<uint16_t>(tif.get(), TIFFTAG_PHOTOMETRIC);
  const uint16_t planar = field<uint16_t>(tif.get(), TIFFTAG_PLANARCONFIG);
  const uint16_t sample_format = field<uint16_t>(tif.get(), TIFFTAG_SAMPLEFORMAT);
  const uint16_t inkset = field<uint16_t>(tif.get(), TIFFTAG_INKSET);
  const bool gray =
      (photometric == PHOTOMETRIC_MINISBLACK || photometric == PHOTOMETRIC_MINISWHITE);
  const bool rgb = photometric == PHOTOMETRIC_RGB && spp >= 3;
  const bool cmyk =
      photometric == PHOTOMETRIC_SEPARATED && inkset == INKSET_CMYK && spp >= 4 && bits == 8;
  const bool raw_path = planar == PLANARCONFIG_CONTIG && sample_format == SAMPLEFORMAT_UINT &&
                        (bits == 8 || bits == 16) && spp >= 1 && spp <= 8 && (gray || rgb || cmyk);

  if (raw_path) {
    const size_t sample_bytes = bits / 8;
    const size_t pixel_bytes = sample_bytes * spp;
    const size_t row_bytes = pixel_bytes * width;
    thread_local ScratchBuffer raw_buffer;
    uint8_t* raw = raw_buffer.get(row_bytes * height);
    if (!read_interleaved(tif.get(), width, height, row_bytes,
                          static_cast<uint64_t>(target.max_image_pixels) * 8, raw))
      throw failed("pixel data");
    uint8_t* out = target.allocate(width, height);
    const bool invert = photometric == PHOTOMETRIC_MINISWHITE;
    for (uint32_t y = 0; y < height; ++y) {
      const uint8_t* in = raw + row_bytes * y;
      uint8_t* o = out + size_t{y} * width * 3;
      for (uint32_t x = 0; x < width; ++x, in += pixel_bytes, o += 3) {
        if (cmyk) {
          cmyk_to_rgb(in, o);
        } else if (bits == 8) {
          if (rgb) {
            std::memcpy(o, in, 3);
          } else {
            o[0] = o[1] = o[2] = invert ? 255 - in[0] : in[0];
          }
        } else {  // 16-bit samples in host order (libtiff swabs them)
          uint16_t s[3];
          std::memcpy(s, in, sample_bytes * (rgb ? 3 : 1));
          if (rgb) {  // PIL's RGB;16: the high byte
            for (int c = 0; c < 3; ++c) o[c] = static_cast<uint8_t>(s[c] >> 8);
          } else {  // PIL's mode I;16: clipped
            o[0] = o[1] = o[2] = clip_to_8(invert ? 65535u - s[0] : s[0]);
          }
        }
      }
    }
    return target.view(static_cast<int>(width), static_cast<int>(height));
  }

  char reason[1024] = "";
  if (!TIFFRGBAImageOK(tif.get(), reason))
    throw SampleError(name, std::string("unsupported TIFF variant: ") + reason);
  TIFFRGBAImage image;
  if (!TIFFRGBAImageBegin(&image, tif.get(), 0, reason))
    throw SampleError(name, std::string("unsupported TIFF variant: ") + reason);
  // Rows in stored order, whatever the Orientation tag says (PIL ignores it).
  image.req_orientation = ORIENTATION_TOPLEFT;
  image.orientation = ORIENTATION_TOPLEFT;
  thread_local ScratchBuffer abgr_buffer;
  auto* abgr = reinterpret_cast<uint32_t*>(abgr_buffer.get(size_t{width} * height * 4));
  const int ok = TIFFRGBAImageGet(&image, abgr, width, height);
  TIFFRGBAImageEnd(&image);
  if (!ok) throw failed("pixel data");
  uint8_t* out = target.allocate(width, height);
  for (size_t i = 0, n = size_t{width} * height; i < n; ++i) {
    out[i * 3] = static_cast<uint8_t>(TIFFGetR(abgr[i]));
    out[i * 3 + 1] = static_cast<uint8_t>(TIFFGetG(abgr[i]));
    out[i * 3 + 2] = static_cast<uint8_t>(TIFFGetB(abgr[i]));
  }
  return target.view(static_cast<int>(width), static_cast<int>(height));
}

}  // namespace batchcast
