// decode_image on PNG (written with libpng, image_decode_files.h): every colour type and bit depth
// converted as PIL's convert("RGB") converts it, interlacing, truncated, corrupt and bomb files.
#include <gtest/gtest.h>

#include "tests/cpp/decoders/image_decode_files.h"

namespace batchcast {
namespace {

using namespace batchcast::testing;

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

}  // namespace
}  // namespace batchcast
