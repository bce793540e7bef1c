// Views: process_views decodes each sample once for several pipelines, and every view's bytes
// equal what that view's own ImagePipeline writes (the oracle), whatever the other views are;
// view texts: parse, canonical form, derived seeds and the errors that name the field.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "common/error.h"
#include "decoders/image_pipeline.h"
#include "decoders/view_spec.h"
#include "tests/cpp/decoders/test_images.h"

namespace batchcast {
namespace {

using testing::encode_jpeg;
using testing::encode_png;
using testing::photo_rgb;
using testing::TempDir;
using testing::write_file;

std::vector<PipelineOptions> sweep_views() {
  std::vector<PipelineOptions> views;
  for (const char* text :
       {"size=224", "size=160,flip=0", "size=128,output=uint8",
        "size=96,crop=center,output=float16", "size=64,scale=0.5:1,seed=3",
        "size=48,interpolation=nearest,output=uint8,layout=chw", "size=224,seed=11"}) {
    views.push_back(parse_view_spec(text).options);
  }
  return views;
}

// Every view of every file, for several (epoch, index): byte-identical to the view alone.
TEST(ViewPipelines, EachViewEqualsItsOwnPipeline) {
  TempDir dir;
  std::vector<std::string> files;
  const std::vector<std::pair<int, int>> sizes = {{640, 480}, {1200, 900}, {300, 500}, {97, 61}};
  for (size_t i = 0; i < sizes.size(); ++i) {
    cv::Mat rgb = photo_rgb(sizes[i].first, sizes[i].second, static_cast<int>(i));
    files.push_back(dir.file("p" + std::to_string(i) + ".jpg"));
    write_file(files.back(), encode_jpeg(rgb, 90, i % 2 ? TJSAMP_444 : TJSAMP_420));
  }
  files.push_back(dir.file("p.png"));
  write_file(files.back(), encode_png(photo_rgb(400, 300, 9)));

  std::vector<ImagePipeline> pipelines;
  for (const auto& o : sweep_views()) pipelines.emplace_back(o);
  std::vector<const ImagePipeline*> views;
  for (const auto& p : pipelines) views.push_back(&p);
  int shared_factor_samples = 0;
  for (const auto& file : files) {
    for (uint64_t epoch = 0; epoch < 2; ++epoch) {
      for (uint64_t index = 0; index < 12; ++index) {
        std::vector<std::vector<uint8_t>> together(views.size());
        std::vector<void*> outs;
        for (size_t v = 0; v < views.size(); ++v) {
          together[v].assign(views[v]->sample_bytes(), 0xAB);
          outs.push_back(together[v].data());
        }
        process_views(views.data(), outs.data(), views.size(), file, epoch, index);
        for (size_t v = 0; v < views.size(); ++v) {
          std::vector<uint8_t> alone(views[v]->sample_bytes(), 0xCD);
          views[v]->process(file, epoch, index, alone.data());
          ASSERT_EQ(together[v], alone)
              << file << " view " << v << " epoch " << epoch << " index " << index;
        }
        ++shared_factor_samples;
      }
    }
  }
  EXPECT_EQ(shared_factor_samples, 5 * 2 * 12);
}

// A view left out (null out) is not written; the others are as before.
TEST(ViewPipelines, NullOutSkipsThatView) {
  TempDir dir;
  const std::string file = dir.file("a.jpg");
  write_file(file, encode_jpeg(photo_rgb(500, 400, 1)));
  ImagePipeline a(parse_view_spec("size=64,output=uint8").options);
  ImagePipeline b(parse_view_spec("size=32,output=uint8").options);
  const ImagePipeline* views[] = {&a, &b};
  std::vector<uint8_t> out_b(b.sample_bytes()), alone(b.sample_bytes());
  void* outs[] = {nullptr, out_b.data()};
  process_views(views, outs, 2, file, 0, 5);
  b.process(file, 0, 5, alone.data());
  EXPECT_EQ(out_b, alone);
}

// A bad sample names the file once, as process() does.
TEST(ViewPipelines, BadSampleThrowsSampleError) {
  TempDir dir;
  const std::string file = dir.file("bad.jpg");
  write_file(file, {0xFF, 0xD8, 0xFF, 0xE0, 0x00});
  ImagePipeline a(PipelineOptions{});
  const ImagePipeline* views[] = {&a, &a};
  std::vector<uint8_t> x(a.sample_bytes()), y(a.sample_bytes());
  void* outs[] = {x.data(), y.data()};
  EXPECT_THROW(process_views(views, outs, 2, file, 0, 0), SampleError);
}

TEST(ViewSpec, ParsesOverTheBaseAndRoundTrips) {
  PipelineOptions base;
  base.image_size = 200;
  base.seed = 99;
  ViewSpec s = parse_view_spec("size=160,crop=center,resize=192,output=bfloat16", base);
  EXPECT_EQ(s.options.image_size, 160);
  EXPECT_FALSE(s.options.train);
  EXPECT_EQ(s.options.resize_size, 192);
  EXPECT_EQ(s.options.output, DType::kBFloat16);
  EXPECT_FALSE(s.seed.has_value());
  EXPECT_EQ(parse_view_spec("", base).options.image_size, 200);
  // The canonical text reads back to the same view.
  for (const auto& o : sweep_views()) {
    const std::string text = view_spec_text(o, true);
    EXPECT_EQ(view_spec_text(parse_view_spec(text).options, true), text);
  }
  EXPECT_EQ(parse_view_spec("seed=5").seed, 5u);
}

TEST(ViewSpec, DerivedSeedsSeparateViewsAndIgnoreTheSeedField) {
  PipelineOptions a = parse_view_spec("size=160").options;
  PipelineOptions b = parse_view_spec("size=128").options;
  PipelineOptions a_seeded = parse_view_spec("size=160,seed=4").options;
  EXPECT_EQ(view_seed(1, a), view_seed(1, a_seeded));
  EXPECT_NE(view_seed(1, a), view_seed(1, b));
  EXPECT_NE(view_seed(1, a), view_seed(2, a));
}

TEST(ViewSpec, ErrorsNameTheField) {
  auto error_of = [](const std::string& text) {
    try {
      parse_view_spec(text);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error_of("size=0").find("size must be in 1..16384"), std::string::npos);
  EXPECT_NE(error_of("size=abc").find("size must be a whole number"), std::string::npos);
  EXPECT_NE(error_of("interpolation=bicubic").find("interpolation 'bicubic' is not one of"),
            std::string::npos);
  EXPECT_NE(error_of("crop=none").find("crop 'none' is not one of center|random"),
            std::string::npos);
  EXPECT_NE(error_of("flip=2").find("flip must be in 0..1"), std::string::npos);
  EXPECT_NE(error_of("scale=0.5").find("scale takes 2 numbers"), std::string::npos);
  EXPECT_NE(error_of("scale=0.9:0.1").find("scale must satisfy"), std::string::npos);
  EXPECT_NE(error_of("std=1:0:1").find("std must be finite and non-zero"), std::string::npos);
  EXPECT_NE(error_of("colour=red").find("'colour' is not a view field"), std::string::npos);
  EXPECT_NE(error_of("size").find("is not FIELD=VALUE"), std::string::npos);
  EXPECT_NE(error_of("crop=center,size=224,resize=100").find("resize_size 100 must be"),
            std::string::npos);
  EXPECT_NE(error_of("size=0").find("view 'size=0'"), std::string::npos);
}

}  // namespace
}  // namespace batchcast
