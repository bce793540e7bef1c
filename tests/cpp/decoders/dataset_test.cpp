// Dataset::image_folder (torchvision ImageFolder ordering and errors) and Dataset::file_list.
#include "decoders/dataset.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "common/error.h"
#include "tests/cpp/decoders/test_images.h"

namespace batchcast {
namespace {

using testing::TempDir;
using testing::write_file;

void touch(const std::string& path) { write_file(path, {'x'}); }

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(ImageFolder, OrderAndLabelsFollowTorchvision) {
  TempDir dir;
  const std::string root = dir.path();
  // Classes sort by code point: "B" < "a" < "a b" < "a-b" < "a_b".
  touch(root + "/a/x2.JPG");
  touch(root + "/a/x1.jpeg");
  touch(root + "/a/notes.txt");  // not an image: skipped
  touch(root + "/a/sub/deep/z.png");
  touch(root + "/a/sub-dir/y.PnG");  // "sub-dir" < "sub/deep" because '-' < '/'
  touch(root + "/a/sub/w.webp");
  touch(root + "/B/only.tif");
  touch(root + "/a b/c.bmp");
  touch(root + "/a-b/d.ppm");
  touch(root + "/a_b/e.pgm");
  touch(root + "/a_b/f.tiff");
  touch(root + "/a_b/g.gif");  // gif is not in IMG_EXTENSIONS
  touch(root + "/loose.jpg");  // files at the top level are not samples
  Dataset d = Dataset::image_folder(root);
  EXPECT_EQ(d.classes(), (std::vector<std::string>{"B", "a", "a b", "a-b", "a_b"}));
  std::vector<std::pair<std::string, int64_t>> got;
  for (size_t i = 0; i < d.size(); ++i) got.emplace_back(d[i].path.substr(root.size()), d[i].label);
  std::vector<std::pair<std::string, int64_t>> want = {
      {"/B/only.tif", 0},      {"/a/x1.jpeg", 1},        {"/a/x2.JPG", 1},  {"/a/sub/w.webp", 1},
      {"/a/sub-dir/y.PnG", 1}, {"/a/sub/deep/z.png", 1}, {"/a b/c.bmp", 2}, {"/a-b/d.ppm", 3},
      {"/a_b/e.pgm", 4},       {"/a_b/f.tiff", 4}};
  // torchvision sorts os.walk tuples by root: "a/sub" < "a/sub-dir" < "a/sub/deep".
  EXPECT_EQ(got, want);
}

TEST(ImageFolder, FollowsSymlinkedClassAndSubfolders) {
  TempDir dir;
  touch(dir.path() + "/elsewhere/p.jpg");
  touch(dir.path() + "/root/real/q.jpg");
  std::filesystem::create_directory_symlink(dir.path() + "/elsewhere", dir.path() + "/root/linked");
  std::filesystem::create_directory_symlink(dir.path() + "/root/real",
                                            dir.path() + "/root/real/loop");  // a cycle
  Dataset d = Dataset::image_folder(dir.path() + "/root");
  EXPECT_EQ(d.classes(), (std::vector<std::string>{"linked", "real"}));
  ASSERT_GE(d.size(), 2u);
  EXPECT_EQ(d[0].path, dir.path() + "/root/linked/p.jpg");
  EXPECT_EQ(d[1].path, dir.path() + "/root/real/q.jpg");
}

TEST(ImageFolder, ErrorsNameTheFolder) {
  TempDir dir;
  std::string missing = dir.path() + "/nope";
  EXPECT_NE(error_of([&] { Dataset::image_folder(missing); }).find(missing + "' does not exist"),
            std::string::npos);
  std::filesystem::create_directories(dir.path() + "/empty");
  EXPECT_NE(
      error_of([&] { Dataset::image_folder(dir.path() + "/empty"); }).find("no class folders"),
      std::string::npos);
  touch(dir.path() + "/flat/a.jpg");
  EXPECT_NE(error_of([&] { Dataset::image_folder(dir.path() + "/flat"); }).find("no class folders"),
            std::string::npos);
  touch(dir.path() + "/some/cat/a.jpg");
  touch(dir.path() + "/some/dog/readme.txt");
  std::string e = error_of([&] { Dataset::image_folder(dir.path() + "/some"); });
  EXPECT_NE(e.find(dir.path() + "/some"), std::string::npos) << e;
  EXPECT_NE(e.find("no image file in the class folders dog"), std::string::npos) << e;
  touch(dir.path() + "/file");
  EXPECT_NE(error_of([&] { Dataset::image_folder(dir.path() + "/file"); }).find("not a directory"),
            std::string::npos);
}

TEST(FileList, ParsesPathsLabelsCommentsAndBlankLines) {
  TempDir dir;
  write_file(dir.file("lists/train.txt"), std::vector<uint8_t>([] {
               std::string s =
                   "# header comment\n"
                   "\n"
                   "img/a.jpg 0\n"
                   "  img/with space.jpg\t3  \r\n"
                   "/abs/b.png 12\n"
                   "   # indented comment\n"
                   "c.jpg -0\n";
               return std::vector<uint8_t>(s.begin(), s.end());
             }()));
  Dataset d = Dataset::file_list(dir.file("lists/train.txt"));
  ASSERT_EQ(d.size(), 4u);
  EXPECT_EQ(d[0].path, dir.file("lists/img/a.jpg"));
  EXPECT_EQ(d[0].label, 0);
  EXPECT_EQ(d[1].path, dir.file("lists/img/with space.jpg"));
  EXPECT_EQ(d[1].label, 3);
  EXPECT_EQ(d[2].path, "/abs/b.png");
  EXPECT_EQ(d[2].label, 12);
  EXPECT_EQ(d[3].path, dir.file("lists/c.jpg"));
  EXPECT_TRUE(d.classes().empty());
}

TEST(FileList, ErrorsNameTheLine) {
  TempDir dir;
  auto list_error = [&](const std::string& text) {
    write_file(dir.file("l.txt"), std::vector<uint8_t>(text.begin(), text.end()));
    return error_of([&] { Dataset::file_list(dir.file("l.txt")); });
  };
  std::string e = list_error("a.jpg 1\nb.jpg\n");
  EXPECT_NE(e.find(dir.file("l.txt") + ":2: expected '<path> <label>', got 'b.jpg'"),
            std::string::npos)
      << e;
  e = list_error("# c\na.jpg one\n");
  EXPECT_NE(e.find("l.txt:2: label 'one' is not an integer"), std::string::npos) << e;
  e = list_error("a.jpg 1x\n");
  EXPECT_NE(e.find("l.txt:1: label '1x' is not an integer"), std::string::npos) << e;
  e = list_error("a.jpg 99999999999999999999\n");
  EXPECT_NE(e.find("l.txt:1:"), std::string::npos) << e;
  e = list_error("a.jpg -3\n");
  EXPECT_NE(e.find("l.txt:1: label -3 is negative"), std::string::npos) << e;
  e = list_error("# only comments\n\n");
  EXPECT_NE(e.find("lists no samples"), std::string::npos) << e;
  e = error_of([&] { Dataset::file_list(dir.file("missing.txt")); });
  EXPECT_NE(e.find(dir.file("missing.txt") + "' cannot be opened"), std::string::npos) << e;
}

TEST(ImageExtensions, CaseInsensitiveTorchvisionList) {
  for (const char* name : {"a.jpg", "a.JPEG", "a.Png", "a.ppm", "a.bmp", "a.pgm", "a.tif", "a.TIFF",
                           "a.webp", "x.tar.jpg"}) {
    EXPECT_TRUE(has_image_extension(name)) << name;
  }
  for (const char* name : {"a.gif", "a.jpg.txt", "jpg", "a.jpe", "a.heic", ""}) {
    EXPECT_FALSE(has_image_extension(name)) << name;
  }
}

}  // namespace
}  // namespace batchcast
