// decode_image on TIFF (written with libtiff, image_decode_files.h) and WebP (libwebp): TIFF's
// colour types as PIL converts them, WebP lossless exact with its alpha dropped, truncated and
// bomb files refused.
#include <gtest/gtest.h>

#include "tests/cpp/decoders/image_decode_files.h"

namespace batchcast {
namespace {

using namespace batchcast::testing;

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

}  // namespace
}  // namespace batchcast
