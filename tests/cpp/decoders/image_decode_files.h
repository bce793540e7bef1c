// Image files of every non-JPEG format for the decode tests (image_decode_*_test.cpp), written
// with libpng and libtiff or by hand, and decode_image's answer for them: its pixels as packed
// RGB8, or its refusal's text. The expected pixels are PIL's convert("RGB") rules applied to the
// pixels a file was written from, so the tests need no image library beyond the product's.
//
// Contract: test-only; not thread-safe (call from the test's main thread); make_tiff writes and
// removes a temporary file.
#pragma once

#include <gtest/gtest.h>
#include <png.h>
#include <tiffio.h>
#include <unistd.h>
#include <webp/encode.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"
#include "decoders/image_decode.h"
#include "decoders/image_pipeline.h"
#include "decoders/sample_check.h"

namespace batchcast::testing {

using Bytes = std::vector<uint8_t>;
using Rgb = std::vector<uint8_t>;  // packed RGB8, row-major

constexpr int64_t kLimit = 178956970;

inline Rgb decode(const Bytes& bytes, int64_t limit = kLimit) {
  const ImageFormat format = sniff_image_format(bytes.data(), bytes.size());
  EXPECT_NE(format, ImageFormat::kUnknown);
  EXPECT_NE(format, ImageFormat::kJpeg);
  RgbView view = decode_image(format, bytes.data(), bytes.size(), "f", limit);
  Rgb out;
  for (int y = 0; y < view.height; ++y) {
    const uint8_t* row = view.pixels + y * view.stride;
    out.insert(out.end(), row, row + view.width * 3);
  }
  return out;
}

// The SampleError text decode_image gives for `bytes` ("" if it decodes them).
inline std::string refusal(const Bytes& bytes, int64_t limit = kLimit) {
  try {
    decode(bytes, limit);
    return "";
  } catch (const SampleError& e) {
    EXPECT_EQ(e.path(), "f");
    return e.what();
  }
}

inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Gray values to RGB: PIL replicates them.
inline Rgb gray_rgb(const std::vector<uint8_t>& gray) {
  Rgb out;
  for (uint8_t v : gray) out.insert(out.end(), {v, v, v});
  return out;
}

// PNG, written with libpng.

struct PngSpec {
  PngSpec(int w, int h, int type, int depth, bool adam7, Bytes stored)
      : width(w),
        height(h),
        color_type(type),
        bit_depth(depth),
        interlaced(adam7),
        rows(std::move(stored)) {}
  int width;
  int height;
  int color_type;
  int bit_depth;
  bool interlaced;
  Bytes rows;                      // packed rows as PNG stores them (16-bit big-endian)
  std::vector<png_color> palette;  // PNG_COLOR_TYPE_PALETTE
  Bytes transparency;              // tRNS alphas of the palette entries
};

inline void append(png_structp png, png_bytep data, size_t n) {
  auto* out = static_cast<Bytes*>(png_get_io_ptr(png));
  out->insert(out->end(), data, data + n);
}

inline Bytes encode_png(const PngSpec& spec) {
  Bytes out;
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png_create_info_struct(png);
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, &info);
    ADD_FAILURE() << "libpng could not write the test image";
    return {};
  }
  png_set_write_fn(png, &out, append, nullptr);
  png_set_IHDR(png, info, spec.width, spec.height, spec.bit_depth, spec.color_type,
               spec.interlaced ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  if (!spec.palette.empty())
    png_set_PLTE(png, info, spec.palette.data(), static_cast<int>(spec.palette.size()));
  if (!spec.transparency.empty()) {
    png_set_tRNS(png, info, spec.transparency.data(), static_cast<int>(spec.transparency.size()),
                 nullptr);
  }
  png_write_info(png, info);
  const size_t row_bytes = spec.rows.size() / spec.height;
  std::vector<png_bytep> rows;
  for (int y = 0; y < spec.height; ++y)
    rows.push_back(const_cast<png_bytep>(spec.rows.data()) + y * row_bytes);
  png_write_image(png, rows.data());
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  return out;
}

// A w x h ramp of `channels` 8-bit samples that differ everywhere.
inline Bytes ramp(int width, int height, int channels, int seed = 0) {
  Bytes out(static_cast<size_t>(width) * height * channels);
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<uint8_t>(i * 37 + seed * 11 + i / 7);
  return out;
}

// PNM text and bytes.
inline Bytes text(const std::string& s) { return Bytes(s.begin(), s.end()); }
inline Bytes concat(Bytes a, const Bytes& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// TIFF, written with libtiff.

// Writes a TIFF with the given tags (set by `tags`) and stored rows, returns its bytes.
inline Bytes make_tiff(int width, int height, const std::function<void(TIFF*)>& tags,
                       const Bytes& rows, bool tiled = false) {
  std::string path = (std::filesystem::temp_directory_path() / "bc_tiff_XXXXXX").string();
  const int fd = ::mkstemp(path.data());
  EXPECT_GE(fd, 0);
  ::close(fd);
  TIFF* tif = TIFFOpen(path.c_str(), "w");
  EXPECT_NE(tif, nullptr);
  TIFFSetField(tif, TIFFTAG_IMAGEWIDTH, width);
  TIFFSetField(tif, TIFFTAG_IMAGELENGTH, height);
  TIFFSetField(tif, TIFFTAG_PLANARCONFIG, PLANARCONFIG_CONTIG);
  TIFFSetField(tif, TIFFTAG_COMPRESSION, COMPRESSION_LZW);
  tags(tif);
  const size_t row_bytes = rows.size() / height;
  if (tiled) {
    TIFFSetField(tif, TIFFTAG_TILEWIDTH, 16);
    TIFFSetField(tif, TIFFTAG_TILELENGTH, 16);
    const size_t pixel = row_bytes / width;
    Bytes tile(16 * 16 * pixel, 0);
    for (int ty = 0; ty < height; ty += 16) {
      for (int tx = 0; tx < width; tx += 16) {
        std::fill(tile.begin(), tile.end(), 0);
        for (int y = 0; y < 16 && ty + y < height; ++y) {
          const int n = std::min(16, width - tx);
          std::memcpy(tile.data() + y * 16 * pixel, rows.data() + (ty + y) * row_bytes + tx * pixel,
                      n * pixel);
        }
        TIFFWriteTile(tif, tile.data(), tx, ty, 0, 0);
      }
    }
  } else {
    TIFFSetField(tif, TIFFTAG_ROWSPERSTRIP, 2);
    for (int y = 0; y < height; ++y)
      TIFFWriteScanline(tif, const_cast<uint8_t*>(rows.data()) + y * row_bytes, y, 0);
  }
  TIFFClose(tif);
  std::ifstream in(path, std::ios::binary);
  Bytes bytes{std::istreambuf_iterator<char>(in), {}};
  std::filesystem::remove(path);
  return bytes;
}

inline std::function<void(TIFF*)> tiff_tags(int photometric, int spp, int bits, int extra = -1) {
  return [=](TIFF* tif) {
    TIFFSetField(tif, TIFFTAG_PHOTOMETRIC, photometric);
    TIFFSetField(tif, TIFFTAG_SAMPLESPERPIXEL, spp);
    TIFFSetField(tif, TIFFTAG_BITSPERSAMPLE, bits);
    if (extra >= 0) {
      uint16_t kind = static_cast<uint16_t>(extra);
      TIFFSetField(tif, TIFFTAG_EXTRASAMPLES, 1, &kind);
    }
  };
}

}  // namespace batchcast::testing
