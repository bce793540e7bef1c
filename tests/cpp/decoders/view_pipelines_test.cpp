// Views: process_views decodes each sample once for several pipelines, and every view's bytes
// equal what that view's own ImagePipeline writes (the oracle), whatever the other views are;
// View: parse, canonical text, identity by value, derived seeds and the errors that name the
// field.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "common/error.h"
#include "decoders/image_pipeline.h"
#include "decoders/view.h"
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
    views.push_back(View::parse(text).options());
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
  ImagePipeline a(View::parse("size=64,output=uint8").options());
  ImagePipeline b(View::parse("size=32,output=uint8").options());
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

TEST(View, ParsesOverTheBaseAndRoundTrips) {
  PipelineOptions base;
  base.image_size = 200;
  base.seed = 99;
  View v = View::parse("size=160,crop=center,resize=192,output=bfloat16", View(base));
  EXPECT_EQ(v.options().image_size, 160);
  EXPECT_FALSE(v.options().train);
  EXPECT_EQ(v.options().resize_size, 192);
  EXPECT_EQ(v.options().output, DType::kBFloat16);
  EXPECT_EQ(v.options().seed, 99u);
  EXPECT_FALSE(v.seed_given());
  EXPECT_EQ(View::parse("", View(base)).options().image_size, 200);
  // The canonical text reads back to the same view.
  for (const auto& o : sweep_views()) {
    const View view(o);
    EXPECT_EQ(View::parse(view.text()), view) << view.text();
    EXPECT_EQ(View::parse(view.text()).text(), view.text());
  }
  EXPECT_TRUE(View::parse("seed=5").seed_given());
  EXPECT_EQ(View::parse("seed=5").options().seed, 5u);
  EXPECT_EQ(View::parse("size=160,seed=4").text(false), View::parse("size=160").text(false));
}

// Identity is the value: a derived field compares as derived, a field training ignores is
// ignored, and every other field (the seed included) tells views apart.
TEST(View, IdentityIsTheValueNotTheSpelling) {
  EXPECT_EQ(View::parse("crop=center,size=224"), View::parse("crop=center,size=224,resize=256"));
  EXPECT_NE(View::parse("crop=center,size=224"), View::parse("crop=center,size=224,resize=300"));
  EXPECT_EQ(View::parse("resize=300"), View::parse(""));  // training: no resize step
  EXPECT_EQ(View::parse("flip=0.50,mean=0.485:0.456:0.406"), View::parse(""));
  EXPECT_NE(View::parse("seed=1"), View::parse("seed=2"));
  EXPECT_TRUE(View::parse("seed=1").same_transform(View::parse("seed=2")));
  EXPECT_NE(View::parse("output=uint8,layout=chw"), View::parse("output=uint8"));
}

// A consumer's view over the server's transform: the transform itself draws with the stream's
// seed; another view with a seed derived from its fields; a seed it names is its own.
TEST(View, ResolvesOverTheTransform) {
  PipelineOptions t;
  t.seed = 7;
  const View transform(t);
  EXPECT_EQ(View::resolve("", transform), transform);
  EXPECT_EQ(View::resolve("size=224", transform), transform);
  const View small = View::resolve("size=160", transform);
  EXPECT_EQ(small.options().seed, View::parse("size=160").derived_seed(7));
  EXPECT_NE(small.options().seed, 7u);
  EXPECT_EQ(View::resolve("size=160,seed=3", transform).options().seed, 3u);
}

TEST(View, DerivedSeedsSeparateViewsAndIgnoreTheSeedField) {
  const View a = View::parse("size=160");
  const View b = View::parse("size=128");
  const View a_seeded = View::parse("size=160,seed=4");
  EXPECT_EQ(a.derived_seed(1), a_seeded.derived_seed(1));
  EXPECT_NE(a.derived_seed(1), b.derived_seed(1));
  EXPECT_NE(a.derived_seed(1), a.derived_seed(2));
}

TEST(View, ErrorsNameTheField) {
  auto error_of = [](const std::string& text) {
    try {
      View::parse(text);
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
  EXPECT_NE(error_of("std=1:0:1").find("std must be other than 0"), std::string::npos);
  EXPECT_NE(error_of("colour=red").find("'colour' is not a view field"), std::string::npos);
  EXPECT_NE(error_of("size").find("is not FIELD=VALUE"), std::string::npos);
  EXPECT_NE(error_of("crop=center,size=224,resize=100").find("resize_size 100 must be"),
            std::string::npos);
  EXPECT_NE(error_of("size=0").find("view 'size=0'"), std::string::npos);
}

}  // namespace
}  // namespace batchcast
