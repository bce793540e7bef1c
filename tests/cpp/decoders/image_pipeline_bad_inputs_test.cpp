// ImagePipeline on bad inputs, in the train and the eval transform: each case (empty, truncated,
// corrupt, not an image, too large...) is a SampleError naming the file and the reason.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/error.h"
#include "decoders/image_pipeline.h"
#include "tests/cpp/decoders/image_pipeline_reference.h"
#include "tests/cpp/decoders/test_images.h"

namespace batchcast {
namespace {

using testing::encode_jpeg;
using testing::encode_png;
using testing::photo_rgb;
using testing::TempDir;
using testing::uint8_options;
using testing::write_file;

void expect_sample_error(const ImagePipeline& pipeline, const std::string& path,
                         const std::string& reason_part) {
  std::vector<uint8_t> out(pipeline.sample_bytes());
  try {
    pipeline.process(path, 0, 0, out.data());
    ADD_FAILURE() << path << ": no SampleError";
  } catch (const SampleError& e) {
    EXPECT_EQ(e.path(), path);
    std::string what = e.what();
    EXPECT_EQ(what.rfind(path + ": ", 0), 0u) << what;
    EXPECT_NE(what.find(reason_part), std::string::npos) << what;
  }
}

class BadInputs : public ::testing::TestWithParam<bool> {};

TEST_P(BadInputs, EachCaseNamesFileAndReason) {
  TempDir dir;
  ImagePipeline pipeline(uint8_options(64, GetParam()));
  std::vector<uint8_t> jpeg = encode_jpeg(photo_rgb(320, 240, 0), 90);

  write_file(dir.file("zero.jpg"), {});
  expect_sample_error(pipeline, dir.file("zero.jpg"), "empty file (0 bytes)");

  write_file(dir.file("truncated.jpg"),
             std::vector<uint8_t>(jpeg.begin(), jpeg.begin() + jpeg.size() / 2));
  expect_sample_error(pipeline, dir.file("truncated.jpg"), "truncated");
  write_file(dir.file("header_only.jpg"), std::vector<uint8_t>(jpeg.begin(), jpeg.begin() + 100));
  expect_sample_error(pipeline, dir.file("header_only.jpg"), "JPEG");

  // Garbage right after the scan header: every crop decodes it.
  std::vector<uint8_t> corrupt = jpeg;
  size_t sos = 0;
  for (size_t i = 2; i + 1 < corrupt.size(); ++i) {
    if (corrupt[i] == 0xFF && corrupt[i + 1] == 0xDA) {
      sos = i;
      break;
    }
  }
  ASSERT_GT(sos, 0u);
  size_t scan = sos + 2 + (corrupt[sos + 2] << 8 | corrupt[sos + 3]);
  for (size_t i = scan; i < scan + 400; ++i) corrupt[i] = (i % 5 == 0) ? 0xFF : 0x00 + (i & 0x3F);
  write_file(dir.file("corrupt.jpg"), corrupt);
  expect_sample_error(pipeline, dir.file("corrupt.jpg"), "corrupt");

  write_file(dir.file("text.jpg"), std::vector<uint8_t>{'h', 'e', 'l', 'l', 'o', '\n'});
  expect_sample_error(pipeline, dir.file("text.jpg"), "not an image");

  expect_sample_error(pipeline, dir.file("missing.jpg"), "cannot open: No such file");
  std::filesystem::create_directories(dir.file("folder.jpg"));
  expect_sample_error(pipeline, dir.file("folder.jpg"), "is a directory");
  if (::geteuid() != 0) {  // root reads anything whatever the mode
    write_file(dir.file("locked.jpg"), jpeg);
    ::chmod(dir.file("locked.jpg").c_str(), 0);
    expect_sample_error(pipeline, dir.file("locked.jpg"), "Permission denied");
  }

  // A valid JPEG whose frame header claims 60000 x 60000.
  std::vector<uint8_t> bomb = jpeg;
  size_t dims = testing::sof_dimensions_offset(bomb);
  ASSERT_GT(dims, 0u);
  bomb[dims] = bomb[dims + 2] = 60000 >> 8;
  bomb[dims + 1] = bomb[dims + 3] = 60000 & 0xFF;
  write_file(dir.file("bomb.jpg"), bomb);
  expect_sample_error(pipeline, dir.file("bomb.jpg"), "60000x60000 = 3600000000 pixels");
  expect_sample_error(pipeline, dir.file("bomb.jpg"), "decompression-bomb guard");

  // Same for PNG, from IHDR.
  std::vector<uint8_t> png = encode_png(photo_rgb(64, 48, 1));
  write_file(dir.file("good.png"), png);
  std::vector<uint8_t> png_bomb = png;
  for (int i = 0; i < 2; ++i) {
    png_bomb[16 + 4 * i] = 0;
    png_bomb[17 + 4 * i] = 0;
    png_bomb[18 + 4 * i] = 60000 >> 8;
    png_bomb[19 + 4 * i] = 60000 & 0xFF;
  }
  write_file(dir.file("bomb.png"), png_bomb);
  expect_sample_error(pipeline, dir.file("bomb.png"), "decompression-bomb guard");
  write_file(dir.file("truncated.png"),
             std::vector<uint8_t>(png.begin(), png.begin() + png.size() / 2));
  expect_sample_error(pipeline, dir.file("truncated.png"), "corrupt or truncated PNG");

  // A lower limit applies to ordinary images too.
  PipelineOptions small = uint8_options(64, GetParam());
  small.max_image_pixels = 320 * 240 - 1;
  write_file(dir.file("ok.jpg"), jpeg);
  expect_sample_error(ImagePipeline(small), dir.file("ok.jpg"), "above max_image_pixels=76799");
}

INSTANTIATE_TEST_SUITE_P(TrainAndEval, BadInputs, ::testing::Bool());

}  // namespace
}  // namespace batchcast
