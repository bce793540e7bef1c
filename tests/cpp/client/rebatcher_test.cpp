// The rebatcher alone: stream shapes fed as chunk positions, batches read back as piece lists.
// No server, no memory: each case is a few microseconds.
#include "client/rebatcher.h"

#include <gtest/gtest.h>

#include <deque>
#include <vector>

namespace batchcast {
namespace {

struct Piece {
  size_t chunk;  // index of the chunk in the fed stream
  uint32_t start, count;
  bool operator==(const Piece& o) const {
    return chunk == o.chunk && start == o.start && count == o.count;
  }
};

struct Cut {
  BatchSpan batch;
  std::vector<Piece> pieces;
};

// Feeds `chunks` (then the stream's end, unless open_ended) and records one epoch per element:
// the batches next() would yield before it returns nullptr.
class Driver {
 public:
  Driver(Rebatcher& r, std::vector<protocol::ChunkPosition> chunks, bool open_ended = false)
      : r_(r), chunks_(chunks.begin(), chunks.end()), open_ended_(open_ended) {}

  // One consumer-level next(): a batch, or nullopt at an epoch end.
  std::optional<Cut> next() {
    Cut cut;
    while (true) {
      auto s = r_.step();
      switch (s.kind) {
        case Rebatcher::Step::kNeedChunk:
          if (chunks_.empty()) {
            if (open_ended_) throw std::runtime_error("would wait for a chunk");
            r_.end_of_stream();
          } else {
            r_.push(chunks_.front());
            chunks_.pop_front();
            ++fed_;
          }
          break;
        case Rebatcher::Step::kPiece:
          cut.pieces.push_back({fed_ - 1, s.start, s.count});
          break;
        case Rebatcher::Step::kBatch:
          cut.batch = s.batch;
          return cut;
        case Rebatcher::Step::kEpochEnd:
          return std::nullopt;
      }
    }
  }
  // Every batch up to the next epoch end.
  std::vector<Cut> epoch() {
    std::vector<Cut> out;
    while (auto c = next()) out.push_back(std::move(*c));
    return out;
  }

 private:
  Rebatcher& r_;
  std::deque<protocol::ChunkPosition> chunks_;
  bool open_ended_;
  size_t fed_ = 0;
};

// An epoch of `samples` cut into chunks of `chunk` samples, starting at stream position `pos`.
std::vector<protocol::ChunkPosition> epoch_chunks(uint64_t epoch, uint64_t samples, uint32_t chunk,
                                                  uint64_t pos = 0, bool known_length = true) {
  std::vector<protocol::ChunkPosition> out;
  for (uint64_t s = 0; s < samples; s += chunk) {
    protocol::ChunkPosition c;
    c.epoch = epoch;
    c.sample_start = s;
    c.sample_count = static_cast<uint32_t>(std::min<uint64_t>(chunk, samples - s));
    c.epoch_samples = known_length ? samples : 0;
    c.stream_position = pos + s;
    c.epoch_end = s + chunk >= samples;
    out.push_back(c);
  }
  return out;
}

std::vector<uint32_t> sizes(const std::vector<Cut>& cuts) {
  std::vector<uint32_t> v;
  for (const auto& c : cuts) v.push_back(c.batch.size);
  return v;
}

TEST(Rebatcher, BatchOfTheChunkSizeIsOnePieceEach) {
  Rebatcher r(32, false, 0, 100);
  Driver d(r, epoch_chunks(0, 100, 32));
  auto e = d.epoch();
  ASSERT_EQ(sizes(e), (std::vector<uint32_t>{32, 32, 32, 4}));
  for (size_t i = 0; i < e.size(); ++i) {
    EXPECT_EQ(e[i].pieces, (std::vector<Piece>{{i, 0, e[i].batch.size}}));
    EXPECT_EQ(e[i].batch.sample_start, 32 * i);
    EXPECT_EQ(e[i].batch.epoch, 0u);
  }
  EXPECT_EQ(r.batches_per_epoch(), 4u);
  EXPECT_FALSE(d.next().has_value());  // the stream's end is one more epoch end
  EXPECT_TRUE(r.finished());
  EXPECT_EQ(r.skipped(), 0u);
}

TEST(Rebatcher, SmallerBatchesCutOneChunkIntoSeveral) {
  Rebatcher r(10, false, 0, 32);
  Driver d(r, epoch_chunks(0, 32, 32));
  auto e = d.epoch();
  ASSERT_EQ(sizes(e), (std::vector<uint32_t>{10, 10, 10, 2}));
  EXPECT_EQ(e[1].pieces, (std::vector<Piece>{{0, 10, 10}}));
  EXPECT_EQ(e[3].pieces, (std::vector<Piece>{{0, 30, 2}}));
  EXPECT_EQ(e[3].batch.sample_start, 30u);
}

TEST(Rebatcher, LargerBatchesSpanChunks) {
  Rebatcher r(80, false, 0, 100);
  Driver d(r, epoch_chunks(0, 100, 32));
  auto e = d.epoch();
  ASSERT_EQ(sizes(e), (std::vector<uint32_t>{80, 20}));
  EXPECT_EQ(e[0].pieces, (std::vector<Piece>{{0, 0, 32}, {1, 0, 32}, {2, 0, 16}}));
  EXPECT_EQ(e[1].pieces, (std::vector<Piece>{{2, 16, 16}, {3, 0, 4}}));
  EXPECT_EQ(e[1].batch.sample_start, 80u);
}

TEST(Rebatcher, BatchSizeNotDividingTheChunkSize) {
  Rebatcher r(12, false, 0, 64);
  Driver d(r, epoch_chunks(0, 64, 32));
  auto e = d.epoch();
  ASSERT_EQ(sizes(e), (std::vector<uint32_t>{12, 12, 12, 12, 12, 4}));
  EXPECT_EQ(e[2].pieces, (std::vector<Piece>{{0, 24, 8}, {1, 0, 4}}));
  uint64_t start = 0;
  for (const auto& c : e) {
    EXPECT_EQ(c.batch.sample_start, start);
    start += c.batch.size;
  }
}

TEST(Rebatcher, DropLastDropsOnlyTheShortBatch) {
  Rebatcher r(12, true, 0, 64);
  Driver d(r, epoch_chunks(0, 64, 32));
  EXPECT_EQ(sizes(d.epoch()), (std::vector<uint32_t>{12, 12, 12, 12, 12}));
  EXPECT_EQ(r.batches_per_epoch(), 5u);
  Rebatcher exact(16, true, 0, 64);
  Driver d2(exact, epoch_chunks(0, 64, 32));
  EXPECT_EQ(sizes(d2.epoch()), (std::vector<uint32_t>{16, 16, 16, 16}));
}

TEST(Rebatcher, ShortLastChunkEndsTheEpochWithAShortBatch) {
  Rebatcher r(32, false, 0, 70);
  Driver d(r, epoch_chunks(0, 70, 32));
  auto e = d.epoch();
  ASSERT_EQ(sizes(e), (std::vector<uint32_t>{32, 32, 6}));
  EXPECT_EQ(e[2].pieces, (std::vector<Piece>{{2, 0, 6}}));
}

TEST(Rebatcher, EpochsNeverShareABatch) {
  Rebatcher r(48, false, 0, 0);
  auto chunks = epoch_chunks(0, 64, 32);
  auto next = epoch_chunks(1, 64, 32, 64);
  chunks.insert(chunks.end(), next.begin(), next.end());
  Driver d(r, chunks);
  EXPECT_EQ(sizes(d.epoch()), (std::vector<uint32_t>{48, 16}));
  EXPECT_EQ(r.epoch(), 0u);
  auto e1 = d.epoch();
  EXPECT_EQ(sizes(e1), (std::vector<uint32_t>{48, 16}));
  EXPECT_EQ(e1[0].batch.epoch, 1u);
  EXPECT_EQ(r.epoch(), 1u);
  EXPECT_FALSE(d.next().has_value());
  EXPECT_TRUE(r.finished());
}

TEST(Rebatcher, UnknownEpochLengthIsLearntFromTheChunks) {
  Rebatcher r(10, false, 0, 0);
  EXPECT_EQ(r.batches_per_epoch(), std::nullopt);
  auto chunks = epoch_chunks(0, 64, 32, 0, /*known_length=*/false);
  chunks.back().epoch_samples = 64;  // a producer knows the length once it reached the end
  Driver d(r, chunks);
  auto e = d.epoch();
  EXPECT_EQ(sizes(e), (std::vector<uint32_t>{10, 10, 10, 10, 10, 10, 4}));
  EXPECT_EQ(r.batches_per_epoch(), 7u);
}

TEST(Rebatcher, AChunkOfANewEpochEndsAnEpochThatLostItsEnd) {
  // The epoch's flagged last chunk was left behind: the next epoch's first chunk ends it.
  Rebatcher r(40, false, 0, 96);
  auto e0 = epoch_chunks(0, 96, 32);
  auto e1 = epoch_chunks(1, 96, 32, 96);
  Driver d(r, {e0[0], e0[1], e1[0], e1[1], e1[2]});
  auto first = d.epoch();
  EXPECT_EQ(sizes(first), (std::vector<uint32_t>{40, 24}));
  // Counted when the chunk after the gap arrived, so the epoch it cut short reports it.
  EXPECT_EQ(r.skipped(), 32u);
  auto second = d.epoch();
  EXPECT_EQ(sizes(second), (std::vector<uint32_t>{40, 40, 16}));
  EXPECT_EQ(second[0].pieces.front(), (Piece{2, 0, 32}));  // the chunk kept for the new epoch
  EXPECT_EQ(r.skipped(), 32u);
}

TEST(Rebatcher, LateJoinCountsTheEpochPartItMissed) {
  Rebatcher r(32, false, 3, 128);
  auto e3 = epoch_chunks(3, 128, 32, 3 * 128);
  Driver d(r, {e3[2], e3[3]});
  auto e = d.epoch();
  ASSERT_EQ(sizes(e), (std::vector<uint32_t>{32, 32}));
  EXPECT_EQ(e[0].batch.sample_start, 64u);
  EXPECT_EQ(r.skipped(), 64u);
  EXPECT_EQ(r.epoch(), 3u);
}

TEST(Rebatcher, SkippedChunksInsideAnEpochAreCounted) {
  Rebatcher r(32, false, 0, 160);
  auto e = epoch_chunks(0, 160, 32);
  Driver d(r, {e[0], e[3], e[4]});  // chunks 1 and 2 reused before this consumer got them
  EXPECT_EQ(sizes(d.epoch()), (std::vector<uint32_t>{32, 32, 32}));
  EXPECT_EQ(r.skipped(), 64u);
}

TEST(Rebatcher, EndOfStreamInsideAnEpochClosesIt) {
  Rebatcher r(48, true, 0, 0);
  auto chunks = epoch_chunks(0, 64, 32);
  chunks.back().epoch_end = false;  // the server stopped before the epoch's end
  Driver d(r, chunks);
  EXPECT_EQ(sizes(d.epoch()), (std::vector<uint32_t>{48}));
  EXPECT_TRUE(r.finished());
  EXPECT_FALSE(d.next().has_value());
}

TEST(Rebatcher, HoldsAChunkOnlyWhileItHasRowsToCut) {
  Rebatcher r(16, false, 0, 32);
  Driver d(r, epoch_chunks(0, 32, 32), /*open_ended=*/true);
  d.next();
  EXPECT_TRUE(r.holds_chunk());
  d.next();
  EXPECT_TRUE(r.holds_chunk());  // exhausted, but the epoch end it carries is not yet seen
  EXPECT_FALSE(d.next().has_value());
  EXPECT_FALSE(r.holds_chunk());
  EXPECT_FALSE(r.finished());  // the stream has not ended: the next epoch may come
}

TEST(Rebatcher, PositionIsTheNextSampleToYield) {
  Rebatcher r(10, false, 2, 25);
  auto e2 = epoch_chunks(2, 25, 8, 50);
  auto e3 = epoch_chunks(3, 25, 8, 75);
  std::vector<protocol::ChunkPosition> stream(e2);
  stream.insert(stream.end(), e3.begin(), e3.end());
  Driver d(r, stream);
  EXPECT_EQ(r.position(), std::make_pair(uint64_t{2}, uint64_t{0})) << "the first epoch's start";
  d.next();
  EXPECT_EQ(r.position(), std::make_pair(uint64_t{2}, uint64_t{10}));
  d.next();
  d.next();
  EXPECT_EQ(r.position(), std::make_pair(uint64_t{2}, uint64_t{25}));
  EXPECT_FALSE(d.next()) << "the epoch ends";
  EXPECT_EQ(r.position(), std::make_pair(uint64_t{3}, uint64_t{0}));
}

TEST(Rebatcher, ASeekDropsTheRowsBeforeItsSampleWithoutCountingThemSkipped) {
  Rebatcher r(4, false, 0, 40);
  auto e0 = epoch_chunks(0, 40, 8);
  Driver first(r, {e0[0], e0[1]}, /*open_ended=*/true);
  first.next();  // a batch of epoch 0, then the user leaves
  r.seek(0, 19);
  EXPECT_EQ(r.position(), std::make_pair(uint64_t{0}, uint64_t{19}));
  EXPECT_FALSE(r.holds_chunk()) << "the chunk being cut is let go";
  Driver d(r, {e0[2], e0[3], e0[4]});
  auto e = d.epoch();
  ASSERT_EQ(sizes(e), (std::vector<uint32_t>{4, 4, 4, 4, 4, 1}))
      << "the rest of epoch 0: samples 19 to 39";
  EXPECT_EQ(e[0].batch.sample_start, 19u);
  EXPECT_EQ(e[0].pieces[0].start, 3u) << "rows 16-18 of chunk 2 were asked away";
  EXPECT_EQ(r.skipped(), 0u);
  EXPECT_EQ(r.position(), std::make_pair(uint64_t{1}, uint64_t{0}));
}

TEST(Rebatcher, ASeekPastAnEpochsEndStartsTheNextEpoch) {
  Rebatcher r(8, false, 0, 16);
  r.seek(0, 16);  // the server answers with epoch 1's first chunk
  Driver d(r, epoch_chunks(1, 16, 8, 16));
  auto e = d.epoch();
  ASSERT_EQ(sizes(e), (std::vector<uint32_t>{8, 8}));
  EXPECT_EQ(e[0].batch.epoch, 1u);
  EXPECT_EQ(e[0].batch.sample_start, 0u);
}

}  // namespace
}  // namespace batchcast
