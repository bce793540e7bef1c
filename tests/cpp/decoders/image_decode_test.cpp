// decode_image: every non-JPEG format torchvision's ImageFolder accepts, each colour type
// converted as PIL's convert("RGB") converts it (the expected pixels are PIL's rules applied to
// the pixels the file was written from), truncated files refused, the decompression-bomb guard
// applied before any pixel is decoded. The files are written here with libpng, libtiff and
// libwebp, or by hand (BMP, PNM), so the test needs no image library beyond the product's.
#include "decoders/image_decode.h"

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
#include "decoders/image_pipeline.h"
#include "decoders/sample_check.h"

namespace batchcast {
namespace {

using Bytes = std::vector<uint8_t>;
using Rgb = std::vector<uint8_t>;  // packed RGB8, row-major

constexpr int64_t kLimit = 178956970;

Rgb decode(const Bytes& bytes, int64_t limit = kLimit) {
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
std::string refusal(const Bytes& bytes, int64_t limit = kLimit) {
  try {
    decode(bytes, limit);
    return "";
  } catch (const SampleError& e) {
    EXPECT_EQ(e.path(), "f");
    return e.what();
  }
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Gray values to RGB: PIL replicates them.
Rgb gray_rgb(const std::vector<uint8_t>& gray) {
  Rgb out;
  for (uint8_t v : gray) out.insert(out.end(), {v, v, v});
  return out;
}

// ---- PNG, written with libpng -------------------------------------------------------------------

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

void append(png_structp png, png_bytep data, size_t n) {
  auto* out = static_cast<Bytes*>(png_get_io_ptr(png));
  out->insert(out->end(), data, data + n);
}

Bytes encode_png(const PngSpec& spec) {
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
Bytes ramp(int width, int height, int channels, int seed = 0) {
  Bytes out(static_cast<size_t>(width) * height * channels);
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<uint8_t>(i * 37 + seed * 11 + i / 7);
  return out;
}

TEST(ImageDecode, PngRgbAndGrayAre8BitExact) {
  PngSpec rgb{5, 3, PNG_COLOR_TYPE_RGB, 8, false, ramp(5, 3, 3)};
  EXPECT_EQ(decode(encode_png(rgb)), rgb.rows);
  PngSpec gray{5, 3, PNG_COLOR_TYPE_GRAY, 8, false, ramp(5, 3, 1)};
  EXPECT_EQ(decode(encode_png(gray)), gray_rgb(gray.rows));
}

TEST(ImageDecode, PngAlphaIsDroppedNotComposited) {
  PngSpec rgba{4, 2, PNG_COLOR_TYPE_RGBA, 8, false, ramp(4, 2, 4)};
  rgba.rows[3] = 0;  // a fully transparent pixel keeps its colour, as in PIL
  Rgb expected;
  for (size_t i = 0; i < rgba.rows.size(); i += 4)
    expected.insert(expected.end(), rgba.rows.begin() + i, rgba.rows.begin() + i + 3);
  EXPECT_EQ(decode(encode_png(rgba)), expected);
  PngSpec gray_alpha{4, 2, PNG_COLOR_TYPE_GRAY_ALPHA, 8, false, ramp(4, 2, 2)};
  std::vector<uint8_t> gray;
  for (size_t i = 0; i < gray_alpha.rows.size(); i += 2) gray.push_back(gray_alpha.rows[i]);
  EXPECT_EQ(decode(encode_png(gray_alpha)), gray_rgb(gray));
}

TEST(ImageDecode, PngPaletteIsExpandedAndItsTransparencyIgnored) {
  PngSpec p{4, 1, PNG_COLOR_TYPE_PALETTE, 8, false, {2, 0, 1, 2}};
  p.palette = {{10, 20, 30}, {40, 50, 60}, {70, 80, 90}};
  p.transparency = {0, 128};
  EXPECT_EQ(decode(encode_png(p)), (Rgb{70, 80, 90, 10, 20, 30, 40, 50, 60, 70, 80, 90}));
  // 2-bit indices, packed four to a byte.
  PngSpec packed{4, 1, PNG_COLOR_TYPE_PALETTE, 2, false, {0b00011011}};
  packed.palette = {{1, 2, 3}, {4, 5, 6}, {7, 8, 9}, {10, 11, 12}};
  EXPECT_EQ(decode(encode_png(packed)), (Rgb{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}));
}

TEST(ImageDecode, PngLowBitGrayIsScaledToFullRange) {
  // 1-bit is PIL's mode "1" (0 or 255), 2-bit its L;2 (x 85).
  PngSpec one{8, 1, PNG_COLOR_TYPE_GRAY, 1, false, {0b10100000}};
  EXPECT_EQ(decode(encode_png(one)), gray_rgb({255, 0, 255, 0, 0, 0, 0, 0}));
  PngSpec two{4, 1, PNG_COLOR_TYPE_GRAY, 2, false, {0b00011011}};
  EXPECT_EQ(decode(encode_png(two)), gray_rgb({0, 85, 170, 255}));
}

TEST(ImageDecode, Png16BitAsPil) {
  // Grayscale is PIL's mode "I", clipped to 255; RGB and gray + alpha keep the high byte.
  PngSpec gray{5, 1, PNG_COLOR_TYPE_GRAY, 16, false, {0, 0, 0, 100, 0, 255, 1, 0, 0x80, 0xFF}};
  EXPECT_EQ(decode(encode_png(gray)), gray_rgb({0, 100, 255, 255, 255}));
  PngSpec rgb{2,  1,     PNG_COLOR_TYPE_RGB,
              16, false, {0x12, 0x34, 0x56, 0x78, 0x9A, 0xBC, 0, 0xFF, 1, 0, 0xFF, 0xFF}};
  EXPECT_EQ(decode(encode_png(rgb)), (Rgb{0x12, 0x56, 0x9A, 0, 1, 0xFF}));
  PngSpec gray_alpha{2, 1, PNG_COLOR_TYPE_GRAY_ALPHA, 16, false, {0x40, 0x01, 0, 0, 2, 0, 9, 9}};
  EXPECT_EQ(decode(encode_png(gray_alpha)), gray_rgb({0x40, 2}));
}

TEST(ImageDecode, PngInterlacedEqualsPlain) {
  PngSpec plain{13, 11, PNG_COLOR_TYPE_RGB, 8, false, ramp(13, 11, 3, 4)};
  PngSpec adam7 = plain;
  adam7.interlaced = true;
  EXPECT_EQ(decode(encode_png(adam7)), plain.rows);
}

TEST(ImageDecode, PngTruncatedCorruptOrBombIsRefused) {
  Bytes png = encode_png({64, 64, PNG_COLOR_TYPE_RGB, 8, false, ramp(64, 64, 3)});
  Bytes cut(png.begin(), png.begin() + static_cast<long>(png.size() / 2));
  EXPECT_TRUE(contains(refusal(cut), "truncated PNG")) << refusal(cut);
  Bytes corrupt = png;
  corrupt[png.size() / 2] ^= 0xFF;  // IDAT's CRC no longer matches
  EXPECT_TRUE(contains(refusal(corrupt), "corrupt or truncated PNG")) << refusal(corrupt);
  const std::string bomb = refusal(png, 64 * 63);
  EXPECT_TRUE(contains(bomb, "64x64 = 4096 pixels, above max_image_pixels=4032")) << bomb;
}

// ---- BMP and PNM, written by hand ---------------------------------------------------------------

void put16(Bytes& b, size_t at, uint32_t v) {
  b[at] = static_cast<uint8_t>(v);
  b[at + 1] = static_cast<uint8_t>(v >> 8);
}
void put32(Bytes& b, size_t at, uint32_t v) {
  for (int i = 0; i < 4; ++i) b[at + i] = static_cast<uint8_t>(v >> (8 * i));
}

// A BITMAPINFOHEADER (or V4 with masks when `masks` is given) bitmap of `bpp` bits, `height`
// negative for top-down, `palette` as BGRX entries, `pixels` the stored rows (already padded).
Bytes make_bmp(int width, int height, int bpp, uint32_t compression, const Bytes& palette,
               const Bytes& pixels, const std::vector<uint32_t>& masks = {}) {
  const uint32_t header = masks.empty() ? 40 : 108;
  const uint32_t offset = 14 + header + static_cast<uint32_t>(palette.size());
  Bytes b(offset, 0);
  b[0] = 'B';
  b[1] = 'M';
  put32(b, 2, offset + static_cast<uint32_t>(pixels.size()));
  put32(b, 10, offset);
  put32(b, 14, header);
  put32(b, 18, static_cast<uint32_t>(width));
  put32(b, 22, static_cast<uint32_t>(height));
  put16(b, 26, 1);
  put16(b, 28, static_cast<uint32_t>(bpp));
  put32(b, 30, compression);
  put32(b, 46, static_cast<uint32_t>(palette.size() / 4));
  for (size_t i = 0; i < masks.size(); ++i) put32(b, 54 + 4 * i, masks[i]);
  if (!palette.empty()) std::memcpy(b.data() + 14 + header, palette.data(), palette.size());
  b.insert(b.end(), pixels.begin(), pixels.end());
  return b;
}

TEST(ImageDecode, BmpVariants) {
  // 24-bit BGR, bottom-up, rows padded to 4 bytes.
  Bytes bgr24 = make_bmp(2, 2, 24, 0, {}, {1, 2, 3, 4, 5, 6, 0, 0, 7, 8, 9, 10, 11, 12, 0, 0});
  EXPECT_EQ(decode(bgr24), (Rgb{9, 8, 7, 12, 11, 10, 3, 2, 1, 6, 5, 4}));
  // Top-down (negative height).
  Bytes top_down = make_bmp(2, -2, 24, 0, {}, {1, 2, 3, 4, 5, 6, 0, 0, 7, 8, 9, 10, 11, 12, 0, 0});
  EXPECT_EQ(decode(top_down), (Rgb{3, 2, 1, 6, 5, 4, 9, 8, 7, 12, 11, 10}));
  // 8-bit palette.
  Bytes palette = {30, 20, 10, 0, 60, 50, 40, 0};
  EXPECT_EQ(decode(make_bmp(3, 1, 8, 0, palette, {1, 0, 1, 0})),
            (Rgb{40, 50, 60, 10, 20, 30, 40, 50, 60}));
  // 1-bit palette.
  EXPECT_EQ(decode(make_bmp(3, 1, 1, 0, palette, {0b10100000, 0, 0, 0})),
            (Rgb{40, 50, 60, 10, 20, 30, 40, 50, 60}));
  // RLE8: a run of 3 x index 1, then 1 literal... then end of bitmap; unset pixels are index 0.
  Bytes rle = {3, 1, 0, 1};
  EXPECT_EQ(decode(make_bmp(4, 1, 8, 1, palette, rle)),
            (Rgb{40, 50, 60, 40, 50, 60, 40, 50, 60, 10, 20, 30}));
  // 32-bit BITFIELDS with alpha: alpha dropped.
  Bytes bgra = {1, 2, 3, 0, 4, 5, 6, 255};
  EXPECT_EQ(decode(make_bmp(2, 1, 32, 3, {}, bgra, {0xFF0000, 0xFF00, 0xFF, 0xFF000000})),
            (Rgb{3, 2, 1, 6, 5, 4}));
  // 16-bit 5-6-5: channels scaled v * 255 / max as PIL's BGR;16.
  Bytes rgb565(4, 0);
  put16(rgb565, 0, (31u << 11) | (32u << 5) | 1u);
  EXPECT_EQ(decode(make_bmp(1, 1, 16, 3, {}, rgb565, {0xF800, 0x07E0, 0x001F, 0})),
            (Rgb{255, 32 * 255 / 63, 255 / 31}));
  // 16-bit default 5-5-5.
  Bytes rgb555(4, 0);
  put16(rgb555, 0, (16u << 10) | (31u << 5));
  EXPECT_EQ(decode(make_bmp(1, 1, 16, 0, {}, rgb555)), (Rgb{16 * 255 / 31, 255, 0}));
}

TEST(ImageDecode, BmpTruncatedOrBombIsRefused) {
  Bytes bmp = make_bmp(2, 2, 24, 0, {}, {1, 2, 3, 4, 5, 6, 0, 0, 7, 8, 9, 10, 11, 12, 0, 0});
  Bytes cut(bmp.begin(), bmp.end() - 8);
  EXPECT_TRUE(contains(refusal(cut), "truncated BMP")) << refusal(cut);
  // A header claiming 1320 x 51717 (found by the fuzzer) is refused before anything is allocated.
  Bytes huge = make_bmp(1320, 51717, 24, 0, {}, {1, 2, 3, 0});
  EXPECT_TRUE(contains(refusal(huge, 4 << 20), "1320x51717")) << refusal(huge, 4 << 20);
}

Bytes text(const std::string& s) { return Bytes(s.begin(), s.end()); }
Bytes concat(Bytes a, const Bytes& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST(ImageDecode, PnmVariantsAsPillow) {
  EXPECT_EQ(decode(concat(text("P6\n# comment\n2 1\n255\n"), {1, 2, 3, 4, 5, 6})),
            (Rgb{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(decode(concat(text("P5 3 1 255 "), {0, 128, 255})), gray_rgb({0, 128, 255}));
  // PGM above 8 bits is PIL's mode "I": clipped to 255.
  EXPECT_EQ(decode(concat(text("P5 3 1 65535\n"), {0, 100, 0, 255, 1, 0})),
            gray_rgb({100, 255, 255}));
  // PPM with another maxval: rescaled to 0..255, rounded.
  EXPECT_EQ(decode(concat(text("P6 1 1 1000\n"), {0, 255, 1, 244, 3, 232})), (Rgb{65, 128, 255}));
  EXPECT_EQ(decode(concat(text("P6 1 1 100\n"), {1, 50, 99})), (Rgb{3, 128, 252}));
  // Bitmaps: 1 is black.
  EXPECT_EQ(decode(concat(text("P4 3 1\n"), {0b10100000})), gray_rgb({0, 255, 0}));
  EXPECT_EQ(decode(text("P1 3 1\n101")), gray_rgb({0, 255, 0}));
  EXPECT_EQ(decode(text("P2 2 1 255\n7 200\n")), gray_rgb({7, 200}));
  EXPECT_EQ(decode(text("P3 1 1 255\n7 8 9\n")), (Rgb{7, 8, 9}));
  EXPECT_TRUE(contains(refusal(concat(text("P6 2 2 255\n"), {1, 2, 3})), "truncated PNM"));
  EXPECT_TRUE(contains(refusal(text("P6 100000 100000 255\n"), 1 << 20), "decompression-bomb"));
}

// ---- TIFF, written with libtiff; WebP with libwebp ----------------------------------------------

// Writes a TIFF with the given tags (set by `tags`) and stored rows, returns its bytes.
Bytes make_tiff(int width, int height, const std::function<void(TIFF*)>& tags, const Bytes& rows,
                bool tiled = false) {
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

std::function<void(TIFF*)> tiff_tags(int photometric, int spp, int bits, int extra = -1) {
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

// Native-endian 16-bit samples, as libtiff writes what it is given.
Bytes samples16(const std::vector<uint16_t>& values) {
  Bytes out(values.size() * 2);
  std::memcpy(out.data(), values.data(), out.size());
  return out;
}

TEST(ImageDecode, TiffColourTypesAsPil) {
  Bytes rgb = ramp(20, 5, 3);
  EXPECT_EQ(decode(make_tiff(20, 5, tiff_tags(PHOTOMETRIC_RGB, 3, 8), rgb)), rgb);
  EXPECT_EQ(decode(make_tiff(20, 5, tiff_tags(PHOTOMETRIC_RGB, 3, 8), rgb, true)), rgb);  // tiles
  Bytes gray = ramp(7, 3, 1);
  EXPECT_EQ(decode(make_tiff(7, 3, tiff_tags(PHOTOMETRIC_MINISBLACK, 1, 8), gray)), gray_rgb(gray));
  Bytes inverted = gray;
  for (uint8_t& v : inverted) v = static_cast<uint8_t>(255 - v);
  EXPECT_EQ(decode(make_tiff(7, 3, tiff_tags(PHOTOMETRIC_MINISWHITE, 1, 8), gray)),
            gray_rgb(inverted));
  // RGBA with unassociated alpha: dropped, colours kept even where transparent.
  Bytes rgba = ramp(3, 2, 4);
  rgba[3] = 0;
  Rgb rgb_of_rgba;
  for (size_t i = 0; i < rgba.size(); i += 4)
    rgb_of_rgba.insert(rgb_of_rgba.end(), rgba.begin() + i, rgba.begin() + i + 3);
  EXPECT_EQ(decode(make_tiff(3, 2, tiff_tags(PHOTOMETRIC_RGB, 4, 8, EXTRASAMPLE_UNASSALPHA), rgba)),
            rgb_of_rgba);
  // 16 bits: grayscale clipped (PIL's I;16), RGB by the high byte.
  EXPECT_EQ(decode(make_tiff(3, 1, tiff_tags(PHOTOMETRIC_MINISBLACK, 1, 16),
                             samples16({100, 255, 40000}))),
            gray_rgb({100, 255, 255}));
  EXPECT_EQ(
      decode(make_tiff(1, 1, tiff_tags(PHOTOMETRIC_RGB, 3, 16), samples16({0x1234, 0xFF, 0xABCD}))),
      (Rgb{0x12, 0, 0xAB}));
  // CMYK: PIL's cmyk2rgb.
  Bytes cmyk = {0, 0, 0, 0, 255, 0, 0, 0, 0, 0, 0, 255, 100, 50, 20, 10};
  EXPECT_EQ(decode(make_tiff(
                4, 1,
                [](TIFF* tif) {
                  tiff_tags(PHOTOMETRIC_SEPARATED, 4, 8)(tif);
                  TIFFSetField(tif, TIFFTAG_INKSET, INKSET_CMYK);
                },
                cmyk)),
            (Rgb{255, 255, 255, 0, 255, 255, 0, 0, 0, 149, 197, 226}));
  // A palette (libtiff's RGBA path): 16-bit colour map entries, as TIFF stores them.
  std::vector<uint16_t> red = {0x0A00, 0xF000}, green = {0x1400, 0x0000}, blue = {0x1E00, 0x0100};
  red.resize(256), green.resize(256), blue.resize(256);
  EXPECT_EQ(decode(make_tiff(2, 1,
                             [&](TIFF* tif) {
                               tiff_tags(PHOTOMETRIC_PALETTE, 1, 8)(tif);
                               TIFFSetField(tif, TIFFTAG_COLORMAP, red.data(), green.data(),
                                            blue.data());
                             },
                             {1, 0})),
            (Rgb{0xF0, 0, 1, 0x0A, 0x14, 0x1E}));
}

TEST(ImageDecode, TiffTruncatedOrBombIsRefused) {
  Bytes tiff = make_tiff(64, 64, tiff_tags(PHOTOMETRIC_RGB, 3, 8), ramp(64, 64, 3));
  // libtiff writes the directory last: keep it, cut the strips' data instead.
  Bytes holed = tiff;
  std::fill(holed.begin() + 8, holed.begin() + 8 + (holed.size() - 8) / 2, 0xFF);
  EXPECT_TRUE(contains(refusal(holed), "corrupt or truncated TIFF")) << refusal(holed);
  Bytes cut(tiff.begin(), tiff.begin() + static_cast<long>(tiff.size() / 2));
  EXPECT_TRUE(contains(refusal(cut), "TIFF")) << refusal(cut);
  EXPECT_TRUE(contains(refusal(tiff, 64 * 63), "decompression-bomb")) << refusal(tiff, 64 * 63);
}

TEST(ImageDecode, WebpLosslessIsExactAndAlphaDropped) {
  Bytes rgba = ramp(9, 4, 4);
  for (size_t i = 3; i < rgba.size(); i += 4) rgba[i] = 255;
  rgba[3] = 7;  // one translucent pixel: its colour is kept, not blended
  uint8_t* encoded = nullptr;
  WebPConfig config;
  ASSERT_TRUE(WebPConfigInit(&config));
  config.lossless = 1;
  config.exact = 1;  // keep colours under transparency
  WebPPicture picture;
  ASSERT_TRUE(WebPPictureInit(&picture));
  picture.use_argb = 1;
  picture.width = 9;
  picture.height = 4;
  ASSERT_TRUE(WebPPictureImportRGBA(&picture, rgba.data(), 9 * 4));
  WebPMemoryWriter writer;
  WebPMemoryWriterInit(&writer);
  picture.writer = WebPMemoryWrite;
  picture.custom_ptr = &writer;
  ASSERT_TRUE(WebPEncode(&config, &picture));
  WebPPictureFree(&picture);
  encoded = writer.mem;
  Bytes webp(encoded, encoded + writer.size);
  WebPMemoryWriterClear(&writer);
  Rgb expected;
  for (size_t i = 0; i < rgba.size(); i += 4)
    expected.insert(expected.end(), rgba.begin() + i, rgba.begin() + i + 3);
  EXPECT_EQ(decode(webp), expected);
  Bytes cut(webp.begin(), webp.begin() + static_cast<long>(webp.size() * 2 / 3));
  EXPECT_TRUE(contains(refusal(cut), "WebP")) << refusal(cut);
  EXPECT_TRUE(contains(refusal(webp, 9 * 3), "decompression-bomb")) << refusal(webp, 9 * 3);
}

// Through the pipeline: a PNG and the same pixels as an uncompressed bitmap give the same sample
// (the crop/resize path is the one JPEG takes), and the pipeline refuses a truncated one.
TEST(ImageDecode, PipelineServesEveryFormatTheSame) {
  const int w = 40, h = 30;
  Bytes rgb = ramp(w, h, 3, 9);
  Bytes png = encode_png({w, h, PNG_COLOR_TYPE_RGB, 8, false, rgb});
  Bytes ppm = concat(text("P6 40 30 255\n"), rgb);
  Bytes tiff = make_tiff(w, h, tiff_tags(PHOTOMETRIC_RGB, 3, 8), rgb);
  PipelineOptions options;
  options.image_size = 16;
  options.output = DType::kUInt8;
  options.train = true;
  ImagePipeline pipeline(options);
  std::vector<uint8_t> a(pipeline.sample_bytes()), b(pipeline.sample_bytes());
  for (uint64_t index = 0; index < 5; ++index) {
    pipeline.process_bytes(png.data(), png.size(), "a.png", 1, index, a.data());
    for (const Bytes* other : {&ppm, &tiff}) {
      pipeline.process_bytes(other->data(), other->size(), "b", 1, index, b.data());
      EXPECT_EQ(a, b) << index;
    }
  }
  Bytes cut(png.begin(), png.begin() + static_cast<long>(png.size() / 2));
  EXPECT_THROW(pipeline.process_bytes(cut.data(), cut.size(), "cut.png", 0, 0, a.data()),
               SampleError);
}

}  // namespace
}  // namespace batchcast
