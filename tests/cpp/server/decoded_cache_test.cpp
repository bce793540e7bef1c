// DecodedCache (server/produce/decoded_cache.h): images kept whole and found again, a budget
// that is never exceeded (a full cache admits no more and says so), one winner when workers race
// to cache one sample, and no name left in /dev/shm.
#include "server/produce/decoded_cache.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <utility>
#include <thread>
#include <vector>

namespace batchcast {
namespace {

// A width x height image whose bytes tell its index apart.
std::vector<uint8_t> pixels_of(uint64_t index, int width, int height) {
  std::vector<uint8_t> p(static_cast<size_t>(width) * height * 3);
  for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<uint8_t>(index * 31 + i * 7);
  return p;
}

RgbView view_of(const std::vector<uint8_t>& p, int width, int height) {
  return RgbView{p.data(), width, height, static_cast<size_t>(width) * 3};
}

bool same(const RgbView& a, const std::vector<uint8_t>& b) {
  return std::memcmp(a.pixels, b.data(), b.size()) == 0 && a.stride == size_t(a.width) * 3;
}

size_t cache_names_in_dev_shm() {
  size_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm"))
    n += e.path().filename().string().rfind("batchcast-cache-", 0) == 0;
  return n;
}

TEST(DecodedCache, KeepsImagesAndCountsHitsAndMisses) {
  DecodedCache cache(10, 256, 1 << 20);
  EXPECT_EQ(cache_names_in_dev_shm(), 0u) << "the segment is unlinked as it is made";
  EXPECT_FALSE(cache.find(3));
  const auto a = pixels_of(3, 40, 30), b = pixels_of(7, 17, 5);  // 17 * 5 * 3: not 8-aligned
  EXPECT_TRUE(cache.insert(3, view_of(a, 40, 30)));
  EXPECT_TRUE(cache.insert(7, view_of(b, 17, 5)));
  EXPECT_FALSE(cache.insert(3, view_of(b, 17, 5))) << "a sample is cached once";
  auto found = cache.find(3);
  ASSERT_TRUE(found);
  EXPECT_EQ(found->width, 40);
  EXPECT_EQ(found->height, 30);
  EXPECT_TRUE(same(*found, a));
  EXPECT_TRUE(same(*cache.find(7), b));
  const DecodedCache::Stats s = cache.stats();
  EXPECT_EQ(s.images, 2u);
  EXPECT_EQ(s.hits, 2u);
  EXPECT_EQ(s.misses, 1u);
  EXPECT_EQ(s.bytes, DecodedCache::image_bytes(40, 30) + DecodedCache::image_bytes(17, 5));
  EXPECT_FALSE(s.full);
}

TEST(DecodedCache, ABudgetThatIsFullAdmitsNoMore) {
  const uint64_t one = DecodedCache::image_bytes(100, 100);
  DecodedCache cache(10, 256, 3 * one + one / 2);
  const auto p = pixels_of(0, 100, 100);
  for (uint64_t i = 0; i < 3; ++i) EXPECT_TRUE(cache.insert(i, view_of(p, 100, 100)));
  EXPECT_TRUE(cache.admitting());
  EXPECT_FALSE(cache.insert(3, view_of(p, 100, 100)));
  EXPECT_FALSE(cache.admitting());
  EXPECT_FALSE(cache.find(3));
  const auto tiny = pixels_of(4, 2, 2);
  EXPECT_FALSE(cache.insert(4, view_of(tiny, 2, 2))) << "a full cache admits nothing more";
  const DecodedCache::Stats s = cache.stats();
  EXPECT_TRUE(s.full);
  EXPECT_EQ(s.images, 3u);
  EXPECT_LE(s.bytes, s.capacity);
  EXPECT_TRUE(cache.find(2)) << "what it holds stays";
}

TEST(DecodedCache, WorkersRacingForOneSampleCacheItOnce) {
  constexpr uint64_t kSamples = 200;
  DecodedCache cache(kSamples, 256, 64 << 20);
  std::atomic<uint64_t> won{0};
  std::vector<std::thread> workers;
  for (int w = 0; w < 4; ++w)
    workers.emplace_back([&] {
      for (uint64_t i = 0; i < kSamples; ++i) {
        const int width = 10 + static_cast<int>(i % 13);
        const auto p = pixels_of(i, width, 9);
        won += cache.insert(i, view_of(p, width, 9)).has_value();
        if (auto found = cache.find(i)) EXPECT_TRUE(same(*found, p)) << "sample " << i;
      }
    });
  for (auto& t : workers) t.join();
  EXPECT_EQ(won.load(), kSamples);
  EXPECT_EQ(cache.stats().images, kSamples);
}

TEST(DecodedCache, EveryReservedBlockGoesToTheHookAndNoImageSpansTwo) {
  DecodedCache cache(5, 256, uint64_t{400} << 20);
  const uint64_t one = DecodedCache::image_bytes(4000, 3000);  // 36 MB: two overflow a block
  const auto big = pixels_of(0, 4000, 3000);
  ASSERT_TRUE(cache.insert(0, view_of(big, 4000, 3000)));
  std::vector<std::pair<uint8_t*, uint64_t>> blocks;
  cache.on_reserve([&](uint8_t* block, uint64_t bytes) { blocks.emplace_back(block, bytes); });
  ASSERT_EQ(blocks.size(), 1u) << "the blocks reserved before, at once";
  for (uint64_t i = 1; i < 4; ++i) ASSERT_TRUE(cache.insert(i, view_of(big, 4000, 3000)));
  EXPECT_EQ(blocks.size(), 4u);
  for (uint64_t i = 0; i < 4; ++i) {
    const uint8_t* image = cache.find(i)->pixels;
    int within = 0;
    for (const auto& [block, bytes] : blocks)
      within += image >= block && image + one <= block + bytes;
    EXPECT_EQ(within, 1) << "image " << i << " lies in exactly one block";
  }
  cache.on_reserve(nullptr);
  ASSERT_TRUE(cache.insert(4, view_of(big, 4000, 3000)));
  EXPECT_EQ(blocks.size(), 4u) << "no hook after it is removed";
}

}  // namespace
}  // namespace batchcast
