#include "decoders/image_header.h"

#include <cstring>

#include "decoders/jpeg_decode.h"

namespace batchcast {
namespace {

bool starts_with(const uint8_t* data, size_t size, const char* magic, size_t n, size_t at = 0) {
  return size >= at + n && std::memcmp(data + at, magic, n) == 0;
}

uint32_t be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}
uint32_t le32(const uint8_t* p) {
  return (uint32_t{p[3]} << 24) | (uint32_t{p[2]} << 16) | (uint32_t{p[1]} << 8) | p[0];
}
uint32_t le24(const uint8_t* p) { return (uint32_t{p[2]} << 16) | (uint32_t{p[1]} << 8) | p[0]; }
uint16_t le16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }

bool png_dimensions(const uint8_t* data, size_t size, int64_t* w, int64_t* h) {
  // IHDR must be the first chunk: length(4) "IHDR" width(4) height(4).
  if (size < 24 || std::memcmp(data + 12, "IHDR", 4) != 0) return false;
  *w = be32(data + 16);
  *h = be32(data + 20);
  return true;
}

bool bmp_dimensions(const uint8_t* data, size_t size, int64_t* w, int64_t* h) {
  if (size < 26) return false;
  const uint32_t header_size = le32(data + 14);
  if (header_size == 12) {  // OS/2 BITMAPCOREHEADER: 16-bit fields
    *w = le16(data + 18);
    *h = le16(data + 20);
    return true;
  }
  // BITMAPINFOHEADER and later: signed 32-bit, negative height = top-down rows.
  *w = static_cast<int32_t>(le32(data + 18));
  const int64_t height = static_cast<int32_t>(le32(data + 22));
  *h = height < 0 ? -height : height;
  return true;
}

// P1..P6: magic, then width and height as ASCII decimals separated by whitespace or # comments.
bool pnm_dimensions(const uint8_t* data, size_t size, int64_t* w, int64_t* h) {
  size_t i = 2;
  int64_t values[2] = {0, 0};
  for (int64_t& value : values) {
    while (i < size) {
      if (data[i] == '#') {
        while (i < size && data[i] != '\n' && data[i] != '\r') ++i;
      } else if (data[i] == ' ' || data[i] == '\t' || data[i] == '\n' || data[i] == '\r' ||
                 data[i] == '\v' || data[i] == '\f') {
        ++i;
      } else {
        break;
      }
    }
    if (i >= size || data[i] < '0' || data[i] > '9') return false;
    while (i < size && data[i] >= '0' && data[i] <= '9') {
      value = value * 10 + (data[i] - '0');
      if (value > (int64_t{1} << 40)) return false;
      ++i;
    }
  }
  *w = values[0];
  *h = values[1];
  return true;
}

// First IFD's ImageWidth (256) and ImageLength (257) tags, SHORT or LONG.
bool tiff_dimensions(const uint8_t* data, size_t size, int64_t* w, int64_t* h) {
  if (size < 8) return false;
  const bool little = data[0] == 'I';
  auto u16 = [&](size_t at) -> uint32_t {
    return little ? le16(data + at) : static_cast<uint32_t>((data[at] << 8) | data[at + 1]);
  };
  auto u32 = [&](size_t at) -> uint32_t { return little ? le32(data + at) : be32(data + at); };
  const size_t ifd = u32(4);
  if (ifd > size || size - ifd < 2) return false;
  const size_t count = u16(ifd);
  if ((size - ifd - 2) / 12 < count) return false;
  int64_t width = -1;
  int64_t height = -1;
  for (size_t e = 0; e < count; ++e) {
    const size_t at = ifd + 2 + 12 * e;
    const uint32_t tag = u16(at);
    const uint32_t type = u16(at + 2);
    if (tag != 256 && tag != 257) continue;
    int64_t value = type == 3 ? u16(at + 8) : type == 4 ? u32(at + 8) : -1;
    (tag == 256 ? width : height) = value;
  }
  if (width < 0 || height < 0) return false;
  *w = width;
  *h = height;
  return true;
}

// RIFF....WEBP then a VP8 (lossy), VP8L (lossless) or VP8X (extended) chunk.
bool webp_dimensions(const uint8_t* data, size_t size, int64_t* w, int64_t* h) {
  if (size < 30) return false;
  const uint8_t* chunk = data + 12;
  if (std::memcmp(chunk, "VP8 ", 4) == 0) {
    *w = le16(chunk + 14) & 0x3FFF;
    *h = le16(chunk + 16) & 0x3FFF;
    return true;
  }
  if (std::memcmp(chunk, "VP8L", 4) == 0) {
    const uint32_t bits = le32(chunk + 9);
    *w = (bits & 0x3FFF) + 1;
    *h = ((bits >> 14) & 0x3FFF) + 1;
    return true;
  }
  if (std::memcmp(chunk, "VP8X", 4) == 0) {
    *w = int64_t{le24(chunk + 12)} + 1;
    *h = int64_t{le24(chunk + 15)} + 1;
    return true;
  }
  return false;
}

}  // namespace

ImageFormat sniff_image_format(const uint8_t* data, size_t size) {
  if (looks_like_jpeg(data, size)) return ImageFormat::kJpeg;
  if (starts_with(data, size, "\x89PNG\r\n\x1a\n", 8)) return ImageFormat::kPng;
  if (starts_with(data, size, "BM", 2)) return ImageFormat::kBmp;
  if (starts_with(data, size, "II*\0", 4) || starts_with(data, size, "MM\0*", 4)) {
    return ImageFormat::kTiff;
  }
  if (starts_with(data, size, "RIFF", 4) && starts_with(data, size, "WEBP", 4, 8)) {
    return ImageFormat::kWebp;
  }
  if (size >= 3 && data[0] == 'P' && data[1] >= '1' && data[1] <= '6') return ImageFormat::kPnm;
  return ImageFormat::kUnknown;
}

const char* image_format_name(ImageFormat format) {
  switch (format) {
    case ImageFormat::kJpeg:
      return "JPEG";
    case ImageFormat::kPng:
      return "PNG";
    case ImageFormat::kBmp:
      return "BMP";
    case ImageFormat::kPnm:
      return "PNM";
    case ImageFormat::kTiff:
      return "TIFF";
    case ImageFormat::kWebp:
      return "WebP";
    case ImageFormat::kUnknown:
      break;
  }
  return "unknown";
}

bool read_image_dimensions(ImageFormat format, const uint8_t* data, size_t size, int64_t* width,
                           int64_t* height) {
  switch (format) {
    case ImageFormat::kPng:
      return png_dimensions(data, size, width, height);
    case ImageFormat::kBmp:
      return bmp_dimensions(data, size, width, height);
    case ImageFormat::kPnm:
      return pnm_dimensions(data, size, width, height);
    case ImageFormat::kTiff:
      return tiff_dimensions(data, size, width, height);
    case ImageFormat::kWebp:
      return webp_dimensions(data, size, width, height);
    case ImageFormat::kJpeg:
    case ImageFormat::kUnknown:
      break;
  }
  return false;
}

}  // namespace batchcast
