// make_dataset: ImageNet-like JPEGs from real photos, deterministic per seed, clear error
// without photos; the pipeline decodes what it writes.
#include "decoders/make_dataset.h"

#include <gtest/gtest.h>

#include "common/error.h"
#include "decoders/dataset.h"
#include "decoders/image_pipeline.h"
#include "decoders/jpeg_decode.h"
#include "tests/cpp/decoders/test_images.h"

namespace batchcast {
namespace {

using testing::TempDir;

TEST(MakeDataset, WritesImageFolderOfTypicalJpegs) {
  TempDir a, b;
  MakeDatasetOptions options;
  options.source_dir = "/usr/share/backgrounds/mate";
  options.out_dir = a.path();
  options.classes = 3;
  options.images_per_class = 6;
  options.seed = 9;
  MakeDatasetReport report = make_dataset(options);
  EXPECT_EQ(report.images, 18u);
  EXPECT_EQ(report.classes, 3);
  EXPECT_GT(report.sources, 5u);
  Dataset dataset = Dataset::image_folder(a.path());
  ASSERT_EQ(dataset.size(), 18u);
  EXPECT_EQ(dataset.classes()[2], "class_002");
  ImagePipeline pipeline(PipelineOptions{});
  std::vector<uint8_t> out(pipeline.sample_bytes());
  for (size_t i = 0; i < dataset.size(); ++i) {
    std::vector<uint8_t> bytes = testing::read_file_bytes(dataset[i].path);
    JpegHeader h = read_jpeg_header(bytes.data(), bytes.size(), dataset[i].path);
    int shorter = std::min(h.width, h.height), longer = std::max(h.width, h.height);
    EXPECT_GE(shorter, 300);
    EXPECT_LE(shorter, 500);
    EXPECT_LE(longer, shorter * 4 / 3 + 1);
    pipeline.process(dataset[i].path, 0, i, out.data());
  }
  // Same seed, same files.
  options.out_dir = b.path();
  make_dataset(options);
  Dataset again = Dataset::image_folder(b.path());
  for (size_t i = 0; i < dataset.size(); ++i) {
    EXPECT_EQ(testing::read_file_bytes(dataset[i].path), testing::read_file_bytes(again[i].path));
  }
}

TEST(MakeDataset, NoPhotosIsAClearError) {
  TempDir empty, out;
  MakeDatasetOptions options;
  options.source_dir = empty.path();
  options.out_dir = out.path();
  try {
    make_dataset(options);
    FAIL() << "no throw";
  } catch (const Error& e) {
    std::string what = e.what();
    EXPECT_NE(what.find(empty.path()), std::string::npos) << what;
    EXPECT_NE(what.find("apt-get install mate-backgrounds"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace batchcast
