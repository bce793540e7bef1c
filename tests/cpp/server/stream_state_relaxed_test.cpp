// Relaxed order (docs/stream.md, "Order"; server/stream/relaxed_readers.h) on the fake clock:
// readers of random speeds, pauses, late joins, leaves and kills against a producer of a fixed
// capacity. Every epoch a relaxed reader completes is its shard exactly once, its descriptors'
// positions run on without a gap, and the producer decodes little more than the fastest reader
// reads.
#include <algorithm>
#include <limits>
#include <random>

#include "server/stream/stream_plan.h"
#include "stream_state_fixture.h"

namespace batchcast::testing {
namespace {

constexpr double kStep = 0.01;  // seconds of the fake clock a simulation step takes

struct ReaderPlan {
  std::string id;
  uint32_t rate = kChunk;  // samples it reads every `every` steps
  int every = 1;
  int join = 0;            // step it attaches at
  int leave = -1;          // step it says Goodbye at (-1: never)
  int killed = -1;         // step its process dies at (-1: never)
  int pause_from = -1, pause_to = -1;
  bool exact = false;  // reads in exact order (its Hello says so)
};

// Rules of a regenerating producer whose consumers read relaxed unless they say otherwise: rank 0
// of `world_size`, epochs of `per_epoch` chunks on that rank.
StreamRules make_rules(uint64_t per_epoch, uint64_t epochs, uint32_t slots,
                       uint32_t world_size = 1) {
  StreamRules r = regenerating(slots, per_epoch);
  r.epochs = epochs;
  r.default_order = protocol::Order::kRelaxed;
  r.dataset_size = per_epoch * kChunk * world_size;
  auto plan =
      std::make_shared<StreamPlan>(r.dataset_size, StreamPlanOptions{7, true, 0, world_size});
  r.epoch_shard = [plan](uint64_t e) { return plan->epoch_order(e); };
  return r;
}

// Fills a chunk decoded for relaxed readers (its samples' rows of one uint8 each) and publishes it.
void publish_relaxed(Stream& s, const StreamState::Fill& f) {
  const auto n = static_cast<int64_t>(f.samples.size());
  protocol::ChunkPosition p;
  p.epoch = f.seq;
  p.sample_count = static_cast<uint32_t>(n);
  s.state.publish(f.seq, f.slot, p, {{"#", DType::kUInt8, {n}, {1}, 0}}, f.samples);
}

class RelaxedSim {
 public:
  RelaxedSim(uint64_t per_epoch, uint64_t epochs, uint32_t slots, uint32_t capacity,
             uint32_t world_size = 1)
      : per_epoch_(per_epoch),
        epochs_(epochs),
        plan_(per_epoch * kChunk * world_size, {7, true, 0, world_size}),
        capacity_(capacity),
        s_(make_rules(per_epoch, epochs, slots, world_size)) {}

  void add(ReaderPlan p) {
    Reader r;
    r.plan = std::move(p);
    readers_.push_back(std::move(r));
  }

  // Runs until every reader ended, left or died (or `max_steps`); false if it did not.
  bool run(int max_steps = 200000) {
    for (step_ = 0; step_ < max_steps; ++step_) {
      s_.now += kStep;
      produce();
      for (auto& r : readers_) act(r);
      s_.tick();
      if (std::all_of(readers_.begin(), readers_.end(), [](const Reader& r) { return r.over; }))
        return true;
    }
    return false;
  }

  uint64_t decoded() const { return decoded_; }
  uint64_t samples(const std::string& id) const { return find(id).samples; }
  uint64_t epochs_done(const std::string& id) const { return find(id).epochs_done; }
  uint64_t decoded_at_end(const std::string& id) const { return find(id).decoded_at_end; }
  // Steps from its join to its End, against what it takes at its own rate, never kept waiting.
  double pace(const std::string& id) const {
    const Reader& r = find(id);
    const double alone = static_cast<double>(r.samples) / r.plan.rate * r.plan.every +
                         std::max(0, r.plan.pause_to - r.plan.pause_from);
    return alone / (r.end_step - r.plan.join);
  }
  const std::vector<std::string>& failures() const { return failures_; }
  uint64_t epoch_samples() const { return plan_.epoch_samples(); }

 private:
  struct Reader {
    ReaderPlan plan;
    bool joined = false, over = false;
    std::deque<std::pair<ChunkDescriptor, std::vector<uint64_t>>> queue;  // with its samples
    uint32_t read_of_front = 0;
    uint64_t samples = 0, epochs_done = 0;
    uint64_t decoded_at_end = 0;  // what the producer had decoded when it was sent End
    int end_step = -1;
    uint64_t epoch = 0, epoch_had = 0, index = 0, total = 0;
    std::vector<uint64_t> got;  // this epoch's samples
  };

  const Reader& find(const std::string& id) const {
    for (const auto& r : readers_)
      if (r.plan.id == id) return r;
    throw std::runtime_error("no reader " + id);
  }
  void fail(const std::string& what) {
    if (failures_.size() < 10) failures_.push_back("step " + std::to_string(step_) + ": " + what);
  }

  void produce() {
    for (uint32_t i = 0; i < capacity_; ++i) {
      // As SampleProducer: the stream's order for the server's epochs, then finish().
      if (stream_chunks_ == epochs_ * per_epoch_ && !finished_) {
        s_.state.finish();
        finished_ = true;
      }
      auto f = finished_ ? std::nullopt : s_.fill();
      if (f) {
        ++stream_chunks_;
        const uint64_t e = f->seq / per_epoch_, c = f->seq % per_epoch_;
        const auto order = plan_.epoch_order(e);
        std::vector<uint64_t> rows(order.begin() + c * kChunk, order.begin() + (c + 1) * kChunk);
        protocol::ChunkPosition p;
        p.epoch = e;
        p.index_in_epoch = c;
        p.sample_start = c * kChunk;
        p.sample_count = kChunk;
        p.epoch_samples = per_epoch_ * kChunk;
        p.epoch_end = c + 1 == per_epoch_;
        samples_[f->seq] = rows;
        s_.state.publish(f->seq, f->slot, p, {{"#", DType::kUInt8, {kChunk}, {1}, 0}}, rows);
        decoded_ += kChunk;
      } else if (auto g = s_.state.try_acquire_private(s_.now)) {
        EXPECT_TRUE(protocol::is_relaxed_seq(g->seq));
        samples_[g->seq] = g->samples;
        publish_relaxed(s_, *g);
        decoded_ += g->samples.size();
      } else {
        return;
      }
    }
  }

  void act(Reader& r) {
    if (r.over) return;
    if (!r.joined) {
      if (step_ < r.plan.join) return;
      protocol::Hello h;
      h.pid = s_.pid_of(r.plan.id);
      h.boot_id = kBoot;
      h.order = r.plan.exact ? protocol::Order::kExact : protocol::Order::kServer;
      s_.send(r.plan.id, h);
      s_.credit(r.plan.id, 2);
      r.joined = true;
    }
    if (step_ == r.plan.killed) {
      s_.dead.insert(s_.pid_of(r.plan.id));
      r.over = true;
      return;
    }
    if (step_ == r.plan.leave) {
      s_.send(r.plan.id, protocol::Goodbye{});
      r.over = true;
      return;
    }
    for (auto& d : s_.take<ChunkDescriptor>(r.plan.id)) {
      // As the consumer library does with a chunk it takes rows of: copied, released at once.
      if (!d.take.empty() || protocol::is_private_seq(d.seq)) s_.release(r.plan.id, d);
      check(r, d);
    }
    if (!s_.take<protocol::End>(r.plan.id).empty()) {
      r.over = true;
      r.decoded_at_end = decoded_;
      r.end_step = step_;
    }
    if (step_ >= r.plan.pause_from && step_ < r.plan.pause_to) return;
    if (step_ % r.plan.every != 0) return;
    for (uint32_t budget = r.plan.rate; budget > 0 && !r.queue.empty();) {
      auto& [d, rows] = r.queue.front();
      const uint32_t n = std::min(budget, d.position.sample_count - r.read_of_front);
      r.read_of_front += n;
      budget -= n;
      r.samples += n;
      if (r.read_of_front < d.position.sample_count) break;
      if (d.take.empty() && !protocol::is_private_seq(d.seq)) s_.release(r.plan.id, d);
      r.queue.pop_front();
      r.read_of_front = 0;
      s_.credit(r.plan.id, 1);
    }
  }

  // What the reader's library checks and the user relies on: positions without a gap, and each
  // epoch its shard once.
  void check(Reader& r, const ChunkDescriptor& d) {
    const auto& p = d.position;
    std::vector<uint64_t> rows;
    const auto& all = samples_.at(d.seq);
    if (d.take.empty()) {
      rows = all;
    } else {
      for (uint32_t row : d.take) rows.push_back(all.at(row));
    }
    if (p.sample_count != rows.size()) fail(r.plan.id + ": sample_count differs from its rows");
    if (!r.plan.exact) {
      if (p.epoch != r.epoch || p.sample_start != r.epoch_had || p.index_in_epoch != r.index ||
          p.stream_position != r.total)
        fail(r.plan.id + ": position out of step (epoch " + std::to_string(p.epoch) + " start " +
             std::to_string(p.sample_start) + ", expected epoch " + std::to_string(r.epoch) +
             " start " + std::to_string(r.epoch_had) + ")");
      if (p.epoch_samples != epoch_samples()) fail(r.plan.id + ": epoch_samples");
    }
    r.got.insert(r.got.end(), rows.begin(), rows.end());
    r.epoch_had += rows.size();
    r.total += rows.size();
    ++r.index;
    r.queue.push_back({d, rows});
    if (!p.epoch_end) return;
    auto shard = plan_.epoch_order(p.epoch);
    std::sort(shard.begin(), shard.end());
    std::sort(r.got.begin(), r.got.end());
    if (r.got != shard)
      fail(r.plan.id + ": epoch " + std::to_string(p.epoch) + " is not its shard once (" +
           std::to_string(r.got.size()) + " samples for " + std::to_string(shard.size()) + ")");
    r.got.clear();
    r.epoch = p.epoch + 1;
    r.epoch_had = r.index = 0;
    ++r.epochs_done;
  }

  uint64_t per_epoch_, epochs_;
  uint64_t stream_chunks_ = 0;
  bool finished_ = false;
  StreamPlan plan_;
  uint32_t capacity_;
  Stream s_;
  std::vector<Reader> readers_;
  std::map<uint64_t, std::vector<uint64_t>> samples_;
  uint64_t decoded_ = 0;
  int step_ = 0;
  std::vector<std::string> failures_;
};

// A fast reader beside one k times slower, from the start: the fast one reads every epoch at
// its pace, the slow one every epoch of its own, and the producer decodes little more than the
// fast one reads.
class RelaxedPairTest : public ::testing::TestWithParam<uint32_t> {};

TEST_P(RelaxedPairTest, SlowerReaderCostsFewDecodes) {
  const uint32_t k = GetParam();
  RelaxedSim sim(/*per_epoch=*/50, /*epochs=*/k + 2, /*slots=*/16, /*capacity=*/1);
  sim.add({"fast"});
  sim.add({"slow", kChunk, static_cast<int>(k)});
  ASSERT_TRUE(sim.run()) << "the readers did not finish";
  EXPECT_TRUE(sim.failures().empty()) << ::testing::PrintToString(sim.failures());
  EXPECT_EQ(sim.epochs_done("fast"), k + 2);
  EXPECT_EQ(sim.epochs_done("slow"), k + 2);
  // The producer decodes exactly what the fast one reads: it is never slowed down, and the slow
  // one reads at its own pace from the fast one's decodes (its tail aside).
  EXPECT_LE(sim.decoded_at_end("fast"), sim.samples("fast") * 11 / 10);
  EXPECT_GE(sim.pace("fast"), 0.95);
  EXPECT_GE(sim.pace("slow"), 0.95);
}

INSTANTIATE_TEST_SUITE_P(Speeds, RelaxedPairTest, ::testing::Values(2u, 4u, 13u, 20u));

// A reader that starts when the first is half through its first epoch reads from the first
// chunk on (no replay, no private chunks), at its own pace.
TEST(RelaxedTest, LateJoinerReadsAtOnce) {
  RelaxedSim sim(50, 4, 16, 1);
  sim.add({"first"});
  sim.add({"late", kChunk, 1, 25});
  ASSERT_TRUE(sim.run());
  EXPECT_TRUE(sim.failures().empty()) << ::testing::PrintToString(sim.failures());
  EXPECT_EQ(sim.epochs_done("late"), 4u);
  EXPECT_GE(sim.pace("first"), 0.95);
  EXPECT_GE(sim.pace("late"), 0.95);
  EXPECT_LE(sim.decoded_at_end("first"), sim.samples("first") * 11 / 10);
}

// A reader that stops for a long while (validation) holds nobody back, and reads on after.
TEST(RelaxedTest, PausedReaderHoldsNobodyBack) {
  RelaxedSim sim(50, 4, 16, 1);
  sim.add({"busy"});
  sim.add({"paused", kChunk, 2, 0, -1, -1, 40, 240});
  ASSERT_TRUE(sim.run());
  EXPECT_TRUE(sim.failures().empty()) << ::testing::PrintToString(sim.failures());
  EXPECT_GE(sim.pace("busy"), 0.95);
  EXPECT_EQ(sim.epochs_done("paused"), 4u);
}

// Readers of random speeds, pauses, late joins, leaves and kills, on one rank of two (each
// epoch a different shard): every epoch a reader completes is its shard once, and the producer
// decodes at most 1.1 x what the fastest reads while it reads, plus one epoch for the tails of
// the others.
TEST(RelaxedTest, RandomReadersGetEachEpochOnce) {
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    std::mt19937 rng(seed);
    auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
    RelaxedSim sim(30, 3, pick(8, 24), 1, 2);
    sim.add({"fastest"});
    for (int i = 0; i < 3; ++i) {
      ReaderPlan p{"r" + std::to_string(i), static_cast<uint32_t>(pick(1, kChunk)), pick(1, 6),
                   pick(0, 100)};
      if (pick(0, 3) == 0) p.leave = p.join + pick(20, 200);
      if (pick(0, 3) == 0) p.killed = p.join + pick(20, 200);
      if (pick(0, 2) == 0) {
        p.pause_from = p.join + pick(0, 50);
        p.pause_to = p.pause_from + pick(10, 300);
      }
      sim.add(p);
    }
    ASSERT_TRUE(sim.run()) << "seed " << seed;
    EXPECT_TRUE(sim.failures().empty()) << "seed " << seed << ": "
                                        << ::testing::PrintToString(sim.failures());
    EXPECT_EQ(sim.epochs_done("fastest"), 3u) << "seed " << seed;
    EXPECT_LE(sim.decoded_at_end("fastest"),
              sim.samples("fastest") * 11 / 10 + sim.epoch_samples())
        << "seed " << seed;
  }
}

// An exact reader and a relaxed one share the stream: the exact one reads the seeded order,
// the relaxed one takes its rows from the same chunks and nothing is decoded for it alone
// while it keeps up.
TEST(RelaxedTest, ExactAndRelaxedShareOneStream) {
  RelaxedSim sim(50, 3, 16, 1);
  sim.add({"exact", kChunk, 1, 0, -1, -1, -1, -1, true});
  sim.add({"relaxed"});
  ASSERT_TRUE(sim.run());
  EXPECT_TRUE(sim.failures().empty()) << ::testing::PrintToString(sim.failures());
  EXPECT_EQ(sim.epochs_done("exact"), 3u);
  EXPECT_EQ(sim.epochs_done("relaxed"), 3u);
  EXPECT_LE(sim.decoded(), sim.samples("exact") * 11 / 10);
}

// A reader of a view added after the stream's chunks were made (in view 0 only) is not left
// waiting for them: the samples it needs are decoded for it, in its view.
TEST(RelaxedTest, AReaderOfALaterViewIsDecodedFor) {
  Stream s(make_rules(3, 1, 11));
  for (uint64_t i = 0; i < 3; ++i) {  // made before anyone attached: view 0 only
    auto f = s.fill();
    ASSERT_TRUE(f);
    protocol::ChunkPosition p;
    p.index_in_epoch = i;
    p.sample_start = i * kChunk;
    p.sample_count = kChunk;
    p.epoch_end = i == 2;
    s.state.publish(f->seq, f->slot, p, {{"#", DType::kUInt8, {kChunk}, {1}, 0}},
                    {4 * i, 4 * i + 1, 4 * i + 2, 4 * i + 3});
  }
  s.hello("b", protocol::LateJoin::kReplay, true, "size=8");
  s.credit("b", 4);
  s.tick();
  EXPECT_TRUE(s.take<ChunkDescriptor>("b").empty()) << "sent chunks of another view";
  auto f = s.state.try_acquire_private(s.now);
  ASSERT_TRUE(f) << "nothing decoded for the reader of the later view";
  publish_relaxed(s, *f);
  s.tick();
  auto sent = s.take<ChunkDescriptor>("b");
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].tensors[0].shape[1], 8) << "not its view's tensors";
}

// The mixed decoder's rule (decode_split.h): the chunk being filled for a relaxed reader that
// has credit and nothing to take is the one waited for.
TEST(RelaxedTest, TheChunkAStarvedReaderWaitsForIsTheWaitedChunk) {
  Stream s(make_rules(5, 2, 16));
  s.join("a", 2);
  s.tick();
  auto f = s.state.try_acquire_private(s.now);
  ASSERT_TRUE(f);
  s.tick();
  EXPECT_EQ(s.state.waited_chunk(), std::optional<uint64_t>(f->seq));
}

// A resumed trainer seeks to the start of its saved epoch and reads it whole; a seek inside an
// epoch is refused, since its order within the epoch was the server's.
TEST(RelaxedTest, AResumedReaderStartsItsEpochOver) {
  Stream s(make_rules(5, 4, 16));
  s.join("a", 4);
  s.send("a", Seek{2, 5});
  auto refused = s.take<SeekReply>("a");
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_FALSE(refused[0].available);
  EXPECT_NE(refused[0].message.find("epoch start"), std::string::npos) << refused[0].message;
  s.send("a", Seek{2, 0});
  auto answered = s.take<SeekReply>("a");
  ASSERT_EQ(answered.size(), 1u);
  EXPECT_TRUE(answered[0].available);
  s.tick();
  auto f = s.state.try_acquire_private(s.now);
  ASSERT_TRUE(f && !f->samples.empty());
  publish_relaxed(s, *f);
  s.tick();
  auto sent = s.take<ChunkDescriptor>("a");
  ASSERT_FALSE(sent.empty());
  EXPECT_EQ(sent[0].position.epoch, 2u);
  EXPECT_EQ(sent[0].position.sample_start, 0u);
}

}  // namespace
}  // namespace batchcast::testing
