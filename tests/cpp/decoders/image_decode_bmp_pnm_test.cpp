// decode_image on BMP and PNM, written by hand: the bitmap variants (bit depths, palettes, masks,
// RLE, top-down) and PNM's as Pillow reads them, truncated and bomb files refused.
#include <gtest/gtest.h>

#include "tests/cpp/decoders/image_decode_files.h"

namespace batchcast {
namespace {

using namespace batchcast::testing;

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
  // A header claiming 1320 x 51717 (a fuzzer input) is refused before anything is allocated.
  Bytes huge = make_bmp(1320, 51717, 24, 0, {}, {1, 2, 3, 0});
  EXPECT_TRUE(contains(refusal(huge, 4 << 20), "1320x51717")) << refusal(huge, 4 << 20);
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

}  // namespace
}  // namespace batchcast
