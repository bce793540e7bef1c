// Readers of a small ring (a GPU pool's 8 slots) reading as the client does, against StreamState
// alone (stream_state_fixture.h): which of two readers in lockstep is decoupled, readers waiting
// for a busy producer, a reader decoupled while warming up, a slow reader's bursts.
#include <gtest/gtest.h>

#include "tests/cpp/server/stream_state_fixture.h"

namespace batchcast {
namespace {

using namespace batchcast::testing;

// A GPU pool's ring of 8 slots, endless epochs of `per_epoch` chunks, the default stall bound.
StreamRules gpu_ring(uint64_t per_epoch) {
  StreamRules r = regenerating(8, per_epoch);
  r.epochs = 0;
  r.stall_timeout_s = 3;
  return r;
}

// Lockstep on a small ring (a GPU pool's 8 slots), the readers reading as the client does
// (client/consumer.cpp): each asks for `prefetch` (2) chunks, asks for one more as its user
// takes one, copies a private chunk out and releases it as it arrives, and releases a stream
// chunk once the user is done with it. The fast one keeps one chunk in hand and takes one every
// round; the slow one works on one every 4 rounds and keeps 3 in hand (`eager`: it takes each
// chunk as it arrives, a GPU trainer whose loader runs ahead while its batches wait for the
// GPU, so it never has one left unread and always has credits). The ring fills with what the
// slow one holds and the fast one waits for each of its releases. The producer takes
// `fill_rounds` rounds to fill a chunk (nvJPEG on a GPU time-sliced with the trainers): while it
// fills the slot the slow one freed, the fast one still waits for the slow one.
// Returns the reads of the fast and the slow reader; `stats` the stream's.
std::pair<uint64_t, uint64_t> read_fast_beside_slow(int fill_rounds, bool eager, StreamStats* stats,
                                                    int slow_every = 4) {
  constexpr uint64_t kPerEpoch = 100;
  Stream s(gpu_ring(kPerEpoch));
  s.join("fast", 2);
  s.join("slow", 2);
  struct Reader {
    std::vector<ChunkDescriptor> queued, in_hand;
    uint64_t read = 0;
    double wait_s = 0;  // rounds it had nothing to work on, told in its heartbeats
  };
  std::map<std::string, Reader> readers;
  auto take = [&](const std::string& id) {  // the user takes the next chunk
    Reader& rd = readers[id];
    const ChunkDescriptor d = rd.queued.front();
    rd.queued.erase(rd.queued.begin());
    s.credit(id, 1);
    if (protocol::is_private_seq(d.seq))
      s.release(id, d);  // copied out on arrival (its copy is in hand)
    else
      rd.in_hand.push_back(d);
  };
  auto done_with_oldest = [&](const std::string& id, size_t keep) {
    Reader& rd = readers[id];
    while (rd.in_hand.size() > keep) {
      s.release(id, rd.in_hand.front());
      rd.in_hand.erase(rd.in_hand.begin());
    }
  };
  std::optional<StreamState::Fill> filling;
  int filled_in = 0;
  for (int round = 0; round < 2000; ++round) {
    if (!filling) filling = s.fill(), filled_in = fill_rounds;
    if (filling && --filled_in <= 0) s.publish(*filling, kPerEpoch), filling.reset();
    s.regenerate(kPerEpoch);
    s.tick();
    for (const char* id : {"fast", "slow"})
      for (auto& d : s.take<ChunkDescriptor>(id)) readers[id].queued.push_back(d);
    if (!readers["fast"].queued.empty()) {
      take("fast");
      ++readers["fast"].read;
      done_with_oldest("fast", 1);
    }
    Reader& slow = readers["slow"];
    if (eager)
      while (!slow.queued.empty()) take("slow");
    if (round % slow_every == 0 && (eager ? !slow.in_hand.empty() : !slow.queued.empty())) {
      if (!eager) take("slow");
      ++slow.read;
      done_with_oldest("slow", eager ? slow.in_hand.size() - 1 : 3);
    }
    // Its heartbeats carry its pace: a slow reader is not caught up first (it is not faster
    // than the stream), so it stays decoupled instead of holding the stream back again.
    for (const char* id : {"fast", "slow"}) {
      Reader& rd = readers[id];
      if (rd.queued.empty() && (std::string(id) == "fast" || rd.in_hand.empty()))
        rd.wait_s += 0.05;
      s.send(id, protocol::Heartbeat{rd.read * kChunk, rd.wait_s, {}});
    }
    s.now += 0.05;
  }
  *stats = s.state.stats();
  for (auto& c : stats->consumers) c.name = c.pid == s.pid_of("slow") ? "slow" : "fast";
  return {readers["fast"].read, readers["slow"].read};
}

// The slow one holds the stream back as a cursor left behind would, and it (not the fast one) is
// decoupled, however long the producer takes to fill a chunk, and whether or not it has taken
// every chunk it was sent.
TEST(StreamState, TheSlowerOfTwoReadersHoldingTheirChunksInLockstepIsDecoupled) {
  for (int fill_rounds : {1, 2}) {
    for (bool eager : {false, true}) {
      StreamStats st;
      auto [fast, slow] = read_fast_beside_slow(fill_rounds, eager, &st);
      const std::string what =
          "fill_rounds " + std::to_string(fill_rounds) + (eager ? ", eager" : "");
      EXPECT_EQ(st.decouplings, 1u) << what;
      for (const auto& c : st.consumers) EXPECT_EQ(c.decoupled, c.name == "slow") << c.name;
      // Lockstep reads both at the slow one's pace; decoupled, the producer fills for both, so
      // the fast one gets what the slow one leaves of it (2 rounds a chunk: about 150 of 200).
      EXPECT_GT(2 * fast, 3 * slow) << what << ": the fast one no longer waits for the slow one";
    }
  }
}

// Two readers of one speed are never decoupled, however many chunks one keeps in hand.
TEST(StreamState, ReadersOfOneSpeedInLockstepAreNotDecoupled) {
  for (int fill_rounds : {1, 2}) {
    for (bool eager : {false, true}) {
      StreamStats st;
      auto [fast, slow] = read_fast_beside_slow(fill_rounds, eager, &st, 1);
      EXPECT_EQ(st.decouplings, 0u) << "fill_rounds " << fill_rounds << (eager ? ", eager" : "");
      EXPECT_NEAR(double(fast), double(slow), 0.02 * fast);
    }
  }
}

// Two readers at the head of a producer that is the bottleneck (nvJPEG on a GPU both trainers
// keep busy): it fills as many chunks as the ring lets it and finishes one every 3 rounds; each
// reader takes each chunk as it arrives, and the slower one keeps the one before too (its GPU
// still works on that batch). The producer keeps finding the ring full with a reader waiting, but
// nobody holds the stream back: it goes at the producer's pace with or without them, and
// decoupling one would only add its private chunks to the producer's work.
TEST(StreamState, ReadersWaitingForABusyProducerHoldNobodyBack) {
  constexpr uint64_t kPerEpoch = 100;
  Stream s(gpu_ring(kPerEpoch));
  s.join("fast", 2);
  s.join("slow", 2);
  std::deque<StreamState::Fill> filling;
  std::map<std::string, std::deque<ChunkDescriptor>> in_hand;
  uint64_t published = 0, found_full = 0;
  for (int round = 0; round < 600; ++round) {  // 30 s, ten stall bounds
    while (auto f = s.fill()) filling.push_back(*f);
    found_full += filling.size() >= 2;
    if (round % 3 == 0 && !filling.empty()) {
      s.publish(filling.front(), kPerEpoch);
      filling.pop_front();
      ++published;
    }
    s.tick();
    for (const auto& [id, keep] : {std::pair<const char*, size_t>{"fast", 1}, {"slow", 2}}) {
      for (auto& d : s.take<ChunkDescriptor>(id)) {
        s.credit(id, 1);
        in_hand[id].push_back(d);
      }
      while (in_hand[id].size() > keep) {
        s.release(id, in_hand[id].front());
        in_hand[id].pop_front();
      }
    }
    s.now += 0.05;
  }
  ASSERT_GT(found_full, 500u) << "the producer had chunks in hand and wanted more slots";
  EXPECT_GE(published, 199u) << "the stream went at the producer's pace";
  EXPECT_EQ(s.state.stats().decouplings, 0u);
  EXPECT_GE(s.state.producer_blocked_s(s.now), 20.0) << "it found the ring full";
}

// Two GPU trainers of one speed at the head of a producer that is what both wait for (nvJPEG on
// a GPU the trainers keep busy): it fills chunks in the order they were asked for, stream and
// private alike, and finishes one every `fill_rounds` rounds. Each reader takes each chunk as it
// arrives, gives its credit back, keeps one in hand, and tells its counters in heartbeats (a
// round with nothing to take is waited for). `b` warms up for its first `warm_up_s` seconds: it
// holds its first chunk and reads nothing more (cudnn autotuning, a validation pass). With
// `b_every`, b is paced instead: a chunk every `b_every` rounds on schedule, and as many as it
// is sent while it is behind it (a trainer that sleeps until its next batch is due). Returns
// each reader's chunks read over the last `tail_rounds` rounds; `stats` the stream's.
std::pair<uint64_t, uint64_t> read_after_warm_up(double warm_up_s, int rounds, int tail_rounds,
                                                 StreamStats* stats, int b_every = 0) {
  constexpr uint64_t kPerEpoch = 100;
  constexpr int kFillRounds = 2;
  constexpr double kRoundS = 0.05;
  Stream s(gpu_ring(kPerEpoch));
  s.join("a", 2);
  s.join("b", 2);
  std::deque<StreamState::Fill> filling;
  int busy = kFillRounds;
  struct Reader {
    std::deque<ChunkDescriptor> in_hand;
    uint64_t read = 0, tail = 0;
    double wait_s = 0;
  };
  std::map<std::string, Reader> readers;
  const double start = s.now;
  for (int round = 0; round < rounds; ++round) {
    while (auto f = s.state.try_acquire_private(s.now)) filling.push_back(*f);
    while (auto f = s.fill()) filling.push_back(*f);
    if (!filling.empty() && --busy <= 0) {
      const StreamState::Fill f = filling.front();
      filling.pop_front();
      if (f.regenerate)
        s.publish_at(f, f.regenerate->epoch, f.regenerate->index, kPerEpoch);
      else
        s.publish(f, kPerEpoch);
      busy = kFillRounds;
    }
    s.tick();
    for (const char* id : {"a", "b"}) {
      Reader& rd = readers[id];
      const bool warming = std::string(id) == "b" && s.now - start < warm_up_s;
      if (warming && rd.read > 0) continue;  // its first batch takes that long
      if (b_every && std::string(id) == "b" && rd.read > uint64_t(round / b_every)) continue;
      auto got = s.take<ChunkDescriptor>(id);
      if (got.empty()) rd.wait_s += kRoundS;
      for (auto& d : got) {
        s.credit(id, 1);
        ++rd.read;
        if (round >= rounds - tail_rounds) ++rd.tail;
        if (protocol::is_private_seq(d.seq))
          s.release(id, d);  // copied out on arrival
        else
          rd.in_hand.push_back(d);
      }
      while (rd.in_hand.size() > 1) {
        s.release(id, rd.in_hand.front());
        rd.in_hand.pop_front();
      }
      s.send(id, protocol::Heartbeat{rd.read * kChunk, rd.wait_s, {}});
    }
    s.now += kRoundS;
  }
  *stats = s.state.stats();
  for (auto& c : stats->consumers) c.name = c.pid == s.pid_of("b") ? "b" : "a";
  return {readers["a"].tail, readers["b"].tail};
}

// A trainer decoupled while it warmed up reads faster than the stream once warm, but the
// producer is what everyone waits for: on private chunks it would take half of it from the
// stream for good and never close its gap. The stream waits while it catches up, once; then
// both read every chunk the producer makes.
TEST(StreamState, AFastReaderDecoupledWhileWarmingUpCatchesUpAndMerges) {
  StreamStats st;
  constexpr int kTail = 400;  // the last 20 s: the producer makes a chunk every 2 rounds
  auto [a, b] = read_after_warm_up(5.0, 1200, kTail, &st);
  EXPECT_EQ(st.decouplings, 1u) << "b held the stream back while it warmed up";
  for (const auto& c : st.consumers) EXPECT_FALSE(c.decoupled) << c.name << " merged back";
  EXPECT_GE(a, 0.9 * kTail / 2) << "a reads at the producer's pace again";
  EXPECT_GE(b, 0.9 * kTail / 2) << "b too, on the stream's chunks";
  EXPECT_LE(st.chunks_regenerated, 150u) << "b's gap, made once";
}

// A reader decoupled for reading slower than the stream is never caught up first, even though
// it reads in bursts as fast as it is served while behind its schedule: the stream would wait
// for it each time it is decoupled again.
TEST(StreamState, ASlowReaderDecoupledIsNotCaughtUpFirstWhateverItsBursts) {
  StreamStats st;
  constexpr int kTail = 400;
  auto [a, b] = read_after_warm_up(0.0, 1200, kTail, &st, 3);
  EXPECT_EQ(st.decouplings, 1u);
  for (const auto& c : st.consumers) EXPECT_EQ(c.decoupled, c.name == "b") << c.name;
  EXPECT_LE(b, kTail / 3 + 2) << "b reads at most on its schedule";
  EXPECT_GE(a, kTail / 2 - b - 10) << "a gets what b's private chunks leave of the producer";
}

}  // namespace
}  // namespace batchcast
