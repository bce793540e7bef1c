// Windows/OS2 bitmaps: a small reader (no Debian library decodes BMP alone). The variants PIL
// reads: 1/4/8-bit palettes (uncompressed, RLE8, RLE4), 16-bit (5-5-5 by default, or any
// BITFIELDS masks), 24-bit BGR, 32-bit BGRX or BITFIELDS (alpha dropped); bottom-up or top-down.
// Channels narrower than 8 bits scale as PIL's BGR;15/BGR;16 unpackers do: v * 255 / max.
#include <cstring>
#include <vector>

#include "common/error.h"
#include "decoders/format_decoders.h"
#include "decoders/sample_check.h"

namespace batchcast {
namespace {

uint32_t le32(const uint8_t* p) {
  return (uint32_t{p[3]} << 24) | (uint32_t{p[2]} << 16) | (uint32_t{p[1]} << 8) | p[0];
}
uint16_t le16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }

constexpr uint32_t kRgb = 0;
constexpr uint32_t kRle8 = 1;
constexpr uint32_t kRle4 = 2;
constexpr uint32_t kBitfields = 3;
constexpr uint32_t kAlphaBitfields = 6;

// One channel of a 16/32-bit pixel: its mask, where it starts and how many levels it has.
struct Channel {
  uint32_t mask = 0;
  int shift = 0;
  uint32_t max = 0;
  explicit Channel(uint32_t m) : mask(m) {
    if (m == 0) return;
    shift = __builtin_ctz(m);
    max = m >> shift;
  }
  uint8_t operator()(uint32_t pixel) const {
    if (max == 0) return 0;
    const uint32_t v = (pixel & mask) >> shift;
    return static_cast<uint8_t>(max == 255 ? v : v * 255 / max);
  }
};

// Expands RLE8/RLE4 data into one palette index per pixel, bottom-up rows; pixels the data never
// sets stay 0, as in PIL.
void expand_rle(const uint8_t* p, const uint8_t* end, bool four_bit, int width, int height,
                uint8_t* indices, const std::string& name) {
  std::memset(indices, 0, static_cast<size_t>(width) * height);
  int x = 0;
  int y = 0;
  auto put = [&](uint8_t index) {
    if (x < width && y < height) indices[static_cast<size_t>(y) * width + x] = index;
    ++x;
  };
  auto truncated = [&]() { return SampleError(name, "truncated BMP (RLE data ends early)"); };
  while (y < height) {
    if (end - p < 2) throw truncated();
    const uint8_t count = p[0];
    const uint8_t value = p[1];
    p += 2;
    if (count > 0) {  // a run
      for (int i = 0; i < count; ++i) put(four_bit ? ((i & 1) ? value & 15 : value >> 4) : value);
    } else if (value == 0) {  // end of line
      x = 0;
      ++y;
    } else if (value == 1) {  // end of bitmap
      break;
    } else if (value == 2) {  // delta
      if (end - p < 2) throw truncated();
      x += p[0];
      y += p[1];
      p += 2;
    } else {  // `value` literal pixels, padded to 16 bits
      const size_t bytes = four_bit ? (value + 1) / 2 : value;
      if (static_cast<size_t>(end - p) < bytes) throw truncated();
      for (int i = 0; i < value; ++i)
        put(four_bit ? ((i & 1) ? p[i / 2] & 15 : p[i / 2] >> 4) : p[i]);
      p += bytes + (bytes & 1);
      if (p > end) p = end;
    }
  }
}

}  // namespace

RgbView decode_bmp(const uint8_t* data, size_t size, const DecodeTarget& target) {
  const std::string& name = target.name;
  auto bad = [&](const std::string& why) { return SampleError(name, "corrupt BMP: " + why); };
  if (size < 26) throw SampleError(name, "truncated BMP (no complete header)");
  const uint32_t offset = le32(data + 10);
  const uint32_t header_size = le32(data + 14);
  int64_t width = 0;
  int64_t height = 0;
  int bpp = 0;
  uint32_t compression = kRgb;
  uint32_t colors = 0;
  size_t entry_bytes = 4;
  if (header_size == 12) {  // OS/2 BITMAPCOREHEADER
    width = le16(data + 18);
    height = le16(data + 20);
    bpp = le16(data + 24);
    entry_bytes = 3;
  } else if (header_size >= 40 && size >= 54) {
    width = static_cast<int32_t>(le32(data + 18));
    height = static_cast<int32_t>(le32(data + 22));
    bpp = le16(data + 28);
    compression = le32(data + 30);
    colors = le32(data + 46);
  } else {
    throw bad("unknown header size " + std::to_string(header_size));
  }
  const bool top_down = height < 0;
  if (top_down) height = -height;
  check_pixel_count(width, height, target.max_image_pixels, name);
  const bool paletted = bpp == 1 || bpp == 2 || bpp == 4 || bpp == 8;
  const bool rle = compression == kRle8 || compression == kRle4;
  if (!(paletted || bpp == 16 || bpp == 24 || bpp == 32) ||
      (rle && bpp != (compression == kRle8 ? 8 : 4)) ||
      !(compression == kRgb || rle || compression == kBitfields ||
        compression == kAlphaBitfields) ||
      ((compression == kBitfields || compression == kAlphaBitfields) && bpp != 16 && bpp != 32)) {
    throw SampleError(name, "unsupported BMP variant (" + std::to_string(bpp) +
                                " bits per pixel, compression " + std::to_string(compression) +
                                ")");
  }

  // Palette (BGR entries after the header and, for a 40-byte header, the BITFIELDS masks).
  std::vector<uint8_t> palette;  // RGB triplets, 256 entries (indices past the table are black)
  if (paletted) {
    const size_t start = 14 + size_t{header_size};
    const uint32_t max_colors = 1u << bpp;
    if (colors == 0 || colors > max_colors) colors = max_colors;
    if (start + colors * entry_bytes > size) throw SampleError(name, "truncated BMP (palette)");
    palette.assign(256 * 3, 0);
    for (uint32_t i = 0; i < colors; ++i) {
      const uint8_t* e = data + start + i * entry_bytes;
      palette[i * 3] = e[2];
      palette[i * 3 + 1] = e[1];
      palette[i * 3 + 2] = e[0];
    }
  }
  // Channel masks: BITFIELDS masks follow the 40-byte header (or are part of a longer one).
  uint32_t masks[3] = {0x7C00, 0x03E0, 0x001F};
  if (bpp == 32) {
    masks[0] = 0xFF0000;
    masks[1] = 0xFF00;
    masks[2] = 0xFF;
  }
  if (compression == kBitfields || compression == kAlphaBitfields) {
    if (size < 66) throw SampleError(name, "truncated BMP (channel masks)");
    for (int c = 0; c < 3; ++c) masks[c] = le32(data + 54 + 4 * c);
  }
  const Channel channels[3] = {Channel(masks[0]), Channel(masks[1]), Channel(masks[2])};

  if (offset >= size) throw SampleError(name, "truncated BMP (no pixel data)");
  const uint8_t* pixels = data + offset;
  const size_t available = size - offset;
  const int w = static_cast<int>(width);
  const int h = static_cast<int>(height);
  thread_local std::vector<uint8_t> indices;
  size_t stride = ((static_cast<size_t>(w) * bpp + 31) / 32) * 4;
  if (rle) {
    indices.resize(static_cast<size_t>(w) * h);
    expand_rle(pixels, pixels + available, compression == kRle4, w, h, indices.data(), name);
    stride = static_cast<size_t>(w);
  } else {
    const size_t last_row = (static_cast<size_t>(w) * bpp + 7) / 8;
    if (available < stride * (h - 1) + last_row)
      throw SampleError(name, "truncated BMP (pixel data ends early)");
  }

  uint8_t* out = target.allocate(w, h);
  for (int y = 0; y < h; ++y) {
    const int file_row = rle || !top_down ? h - 1 - y : y;
    const uint8_t* row = rle ? indices.data() + static_cast<size_t>(file_row) * w
                             : pixels + static_cast<size_t>(file_row) * stride;
    uint8_t* o = out + static_cast<size_t>(y) * w * 3;
    for (int x = 0; x < w; ++x, o += 3) {
      if (paletted) {
        uint32_t index;
        if (rle || bpp == 8) {
          index = row[x];
        } else {
          const size_t bit = static_cast<size_t>(x) * bpp;
          index = (row[bit / 8] >> (8 - bpp - bit % 8)) & ((1u << bpp) - 1);
        }
        std::memcpy(o, &palette[index * 3], 3);
      } else if (bpp == 24) {
        const uint8_t* px = row + static_cast<size_t>(x) * 3;
        o[0] = px[2];
        o[1] = px[1];
        o[2] = px[0];
      } else {
        const uint32_t px = bpp == 16 ? le16(row + static_cast<size_t>(x) * 2)
                                      : le32(row + static_cast<size_t>(x) * 4);
        for (int c = 0; c < 3; ++c) o[c] = channels[c](px);
      }
    }
  }
  return target.view(w, h);
}

}  // namespace batchcast
