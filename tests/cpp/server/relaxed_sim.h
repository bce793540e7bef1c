// RelaxedSim: relaxed order (docs/stream.md, "Order"; server/stream/relaxed_readers.h) on the
// fake clock, for stream_state_relaxed*_test.cpp: readers of given speeds, pauses, late joins,
// leaves, kills and resumes against a producer of a fixed capacity, each reader's descriptors
// checked as its library and its user rely on them (positions without a gap, each row's sample
// named, each epoch it completes its shard exactly once; a resumed reader's: the samples it had
// before, then the rest). Also the rules of such a stream (make_rules) and the publishing of a
// chunk decoded for relaxed readers (publish_relaxed).
//
// Contract: test-only; not thread-safe (one test's main thread drives a simulation). A RelaxedSim
// owns its Stream and every reader's book.
#pragma once

#include <algorithm>
#include <deque>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "server/stream/stream_plan.h"
#include "stream_state_fixture.h"

namespace batchcast::testing {

constexpr double kStep = 0.01;  // seconds of the fake clock a simulation step takes

struct ReaderPlan {
  std::string id;
  uint32_t rate = kChunk;  // samples it reads every `every` steps
  int every = 1;
  int join = 0;     // step it attaches at
  int leave = -1;   // step it says Goodbye at (-1: never)
  int killed = -1;  // step its process dies at (-1: never)
  int pause_from = -1, pause_to = -1;
  bool exact = false;  // reads in exact order (its Hello says so)
  // At its join it resumes the state of this reader (over by then): the epoch it was reading,
  // after the samples it had read there (what Loader.state_dict() keeps).
  std::string resumes = "";
  std::string view = "";  // the view it reads (Stream::resolve_view: "" or "size=N")
};

// Rules of a regenerating producer whose consumers read relaxed unless they say otherwise: rank 0
// of `world_size`, epochs of `per_epoch` chunks on that rank.
inline StreamRules make_rules(uint64_t per_epoch, uint64_t epochs, uint32_t slots,
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
inline void publish_relaxed(Stream& s, const StreamState::Fill& f) {
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
        dataset_size_(per_epoch * kChunk * world_size),
        plan_(dataset_size_, {7, true, 0, world_size}),
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
  uint64_t sent() const { return s_.state.samples_sent(); }  // rows sent to every reader
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
  // The epoch it read last and the samples it had read there.
  std::pair<uint64_t, size_t> yielded(const std::string& id) const {
    return {find(id).yielded_epoch, find(id).yielded.size()};
  }

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
    std::vector<uint64_t> got;      // this epoch's samples
    uint64_t yielded_epoch = 0;     // the epoch of the last sample it read
    std::vector<uint64_t> yielded;  // the samples of that epoch it read
  };

  const Reader& find(const std::string& id) const {
    for (const auto& r : readers_)
      if (r.plan.id == id) return r;
    throw std::runtime_error("no reader " + id);
  }
  void fail(const std::string& what) {
    if (failures_.size() < 10) failures_.push_back("step " + std::to_string(step_) + ": " + what);
  }

  // `r` resumes where `from` left, as Loader.load_state_dict() does: the samples `from` read in
  // its last epoch, then a Seek after them. It expects the rest of that epoch's shard (or, had it
  // read the whole epoch, the next one).
  void resume(Reader& r, const Reader& from) {
    if (!from.over) fail(r.plan.id + " resumes " + from.plan.id + ", which still reads");
    std::vector<uint64_t> bits((dataset_size_ + 63) / 64, 0);
    for (uint64_t sample : from.yielded) bits[sample >> 6] |= uint64_t{1} << (sample & 63);
    for (const auto& part : protocol::had_parts(from.yielded_epoch, bits)) s_.send(r.plan.id, part);
    s_.send(r.plan.id, Seek{from.yielded_epoch, from.yielded.size()});
    auto replies = s_.take<SeekReply>(r.plan.id);
    if (replies.size() != 1 || !replies[0].available)
      fail(r.plan.id +
           ": its resume was refused: " + (replies.empty() ? "no reply" : replies[0].message));
    r.epoch = from.yielded_epoch;
    r.epoch_had = from.yielded.size();
    r.got = from.yielded;
    if (r.epoch_had == epoch_samples()) {
      ++r.epoch;
      r.epoch_had = 0;
      r.got.clear();
    }
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
      h.view = r.plan.view;
      s_.send(r.plan.id, h);
      if (!r.plan.resumes.empty()) resume(r, find(r.plan.resumes));
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
      if (d.position.epoch != r.yielded_epoch) r.yielded.clear();
      r.yielded_epoch = d.position.epoch;
      r.yielded.insert(r.yielded.end(), rows.begin() + r.read_of_front,
                       rows.begin() + r.read_of_front + n);
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
      if (std::vector<uint64_t>(d.samples.begin(), d.samples.end()) != rows)
        fail(r.plan.id + ": the descriptor's samples are not its rows'");
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
  uint64_t dataset_size_;
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

}  // namespace batchcast::testing
