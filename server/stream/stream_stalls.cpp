// StreamState's stalls (stream_state.h): who holds the stream back, decoupling such a consumer
// onto private chunks and merging it back, the stall log and what each consumer is told it
// waits for. The rest of the state machine is in stream_state.cpp and stream_seek.cpp.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <string>

#include "server/stream/stream_state.h"

namespace batchcast {

namespace {
// The others are told about a consumer once it has held the stream back this long: shorter
// holds are the ordinary rhythm of a ring shared by consumers of different speeds.
constexpr double kTellAfterS = 1.0;
}  // namespace

bool StreamState::pins_stream(const ConsumerRecord& c, double now) const {
  if (c.relaxed) return false;  // it needs samples, not chunks: nobody waits for it
  const auto* p = private_.find(c.id);
  if (p && !p->until) return false;  // private for good, or decoupled
  if (c.end_sent || c.closing || c.waiting_epoch_start || c.seek) return false;
  const bool stalled = c.credits == 0 && now - c.last_activity > stall_bound(c);
  return !(rules_.stall_policy == StallPolicy::kSkip && stalled);
}

bool StreamState::reads_stream(const ConsumerRecord& c, double now) const {
  return pins_stream(c, now) && !private_.find(c.id);
}

bool StreamState::private_chunk_waits(double now) const {
  return private_.next_request() && count_slots(now).pinned_stream == usable_slots();
}

void StreamState::trace_stalls(double now) {
  if (!spdlog::should_log(spdlog::level::debug) || now < next_stall_trace_) return;
  next_stall_trace_ = now + 1.0;
  std::string line =
      fmt::format("stalls: producer {}, filling {} chunk(s), next chunk {}, a reader waits: {}",
                  blocked_since_ ? fmt::format("blocked {:.1f} s", now - *blocked_since_)
                                 : std::string("not blocked"),
                  ring_.filling(), next_publish_seq_, reader_waits(now) ? "yes" : "no");
  for (const auto& [id, c] : consumers_.all()) {
    const bool holds = std::find(holding_.begin(), holding_.end(), id) != holding_.end();
    line += fmt::format(
        "; consumer {}: next {}, credits {} of {}, holds {}, {}held back {:.1f} s, lagged {:.1f} s",
        id, c.next_seq, c.credits, c.credit_window, ring_.held_by(id),
        holds ? "holding the stream back, " : "", c.held_back_s, c.lagging_s);
  }
  spdlog::debug("{}", line);
}

bool StreamState::reader_waits_for_a_slot(double now) const {
  // With two chunks in hand the producer has work for its workers and its uploader alike: a
  // reader then waits for the producer's speed (nvJPEG on a GPU the trainers keep busy), not for
  // a slot, and decoupling anyone would only add private chunks to its work.
  return !finished_ && ring_.filling() < 2 && reader_waits(now);
}

bool StreamState::reader_waits(double now) const {
  return std::any_of(consumers_.all().begin(), consumers_.all().end(), [&](const auto& entry) {
    return reads_stream(entry.second, now) && entry.second.next_seq >= next_publish_seq_;
  });
}

std::vector<uint64_t> StreamState::holding_back(double now) const {
  std::vector<uint64_t> ids;
  if (!started_) return ids;
  // Someone is held back: a consumer that was sent everything published (read or not), whose
  // next chunk is the one the producer cannot fill; or one reading private chunks (a resumed
  // trainer), also after the stream's last chunk was made. A lone slow consumer holds back
  // nobody.
  const bool someone_waits =
      private_chunk_waits(now) || (blocked_since_ && reader_waits_for_a_slot(now));
  if (!someone_waits) return ids;
  // Those holding it back: the consumers that pin published chunks they were not sent yet
  // (whether or not someone else still holds those chunks: a slow consumer's own held slots
  // keep the producer waiting as much as its cursor does).
  for (const auto& [id, c] : consumers_.all())
    if (pins_stream(c, now) && c.next_seq < next_publish_seq_) ids.push_back(id);
  // And those that keep the oldest chunk still held while another reader has already released
  // it: on a small ring (a GPU pool's 8 slots) a reader with chunks in hand fills it as surely
  // as a cursor left behind, and the faster ones wait for each of its releases, in lockstep.
  // Whether it has read them or not: a GPU trainer's loader takes each chunk as it arrives (its
  // credits never run out) and releases it only once the GPU is done with its batch. While
  // every reader still holds it, nobody is blamed: over time the slower one is its last holder.
  for (const auto& [seq, slot] : ring_.published()) {
    if (protocol::is_private_seq(seq)) continue;
    const std::vector<uint64_t>& holders = ring_.slot(slot).holders;
    if (holders.empty()) continue;
    const bool released_by_another =
        std::any_of(consumers_.all().begin(), consumers_.all().end(), [&](const auto& entry) {
          const ConsumerRecord& c = entry.second;
          return reads_stream(c, now) && c.next_seq > seq &&
                 std::find(holders.begin(), holders.end(), c.id) == holders.end();
        });
    if (!released_by_another) break;
    for (uint64_t id : holders) {
      auto it = consumers_.all().find(id);
      if (it == consumers_.all().end()) continue;
      if (!reads_stream(it->second, now)) continue;
      if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
    }
    break;
  }
  return ids;
}

const protocol::ChunkPosition* StreamState::next_shared_position(const ConsumerRecord& c) const {
  if (private_.find(c.id) || c.seek || c.next_seq >= next_publish_seq_) return nullptr;
  auto d = descriptors_.find(c.next_seq);
  return d == descriptors_.end() ? nullptr : &d->second.position;
}

uint64_t StreamState::samples_behind(const ConsumerRecord& c) const {
  if (c.relaxed) return 0;  // it takes what it needs wherever it is
  uint64_t at = stream_position_;
  if (const auto* p = private_.find(c.id))
    at = p->stream_position;
  else if (const auto* next = next_shared_position(c))
    at = next->stream_position;
  return stream_position_ > at ? stream_position_ - at : 0;
}

std::string StreamState::label(const ConsumerRecord& c, bool detail) const {
  std::string s = "consumer " + std::to_string(c.id) + (c.name.empty() ? "" : " '" + c.name + "'") +
                  " (pid " + std::to_string(c.pid) + ")";
  if (!detail) return s;
  s += ": holds " + std::to_string(ring_.held_by(c.id)) + " chunk(s), " +
       std::to_string(samples_behind(c)) + " samples behind the newest";
  if (const auto* p = private_.find(c.id))
    s += ", reads private chunks from epoch " + std::to_string(p->next_send.epoch) + " chunk " +
         std::to_string(p->next_send.index);
  else if (const auto* next = next_shared_position(c))
    s += ", next at epoch " + std::to_string(next->epoch) + " sample " +
         std::to_string(next->sample_start);
  return s;
}

void StreamState::decouple(ConsumerRecord& c, double now) {
  const double held_for = c.held_back_s;
  const double lagged_for = c.lagging_s;
  const uint64_t behind = samples_behind(c);
  if (auto* p = private_.find(c.id)) {  // catching up too slowly: stop pinning its merge chunk
    p->until.reset();
    p->rejoin = true;
  } else if (auto d = descriptors_.find(c.next_seq); d != descriptors_.end()) {
    const auto& at = d->second.position;
    abandon(private_.start(c.id, {at.epoch, at.index_in_epoch}, std::nullopt, at.stream_position,
                           true));
  } else if (c.next_seq >= next_publish_seq_) {  // sent everything: it holds what it was sent
    const protocol::Seek next = stream_next();
    abandon(private_.start(c.id, {next.epoch, next.sample / rules_.welcome.chunk_size},
                           std::nullopt, stream_position_, true));
  } else {
    return;
  }
  auto* p = private_.find(c.id);
  p->decoupled_at = next_publish_seq_;
  // Took nothing for half its bound: stopped (warming up, validating), not slow.
  p->paused = now - c.last_activity >= stall_bound(c) / 2;
  c.next_seq = next_publish_seq_;
  c.held_back_s = 0;
  c.lagging_s = 0;
  counters_.decouplings++;
  const std::string why =
      held_for >= stall_bound(c)
          ? fmt::format("held the stream back for {:.1f} s", held_for)
          : fmt::format("fell behind the others for {:.1f} s and the ring's window is full",
                        lagged_for);
  spdlog::warn(
      "{} {}, {} samples behind: decoupled; it reads what it missed in private chunks and "
      "merges back when it catches up",
      label(c, false), why, behind);
}

bool StreamState::try_rejoin(ConsumerRecord& c, PrivateStreams::Stream& p) {
  // Caught up means: the stream went on without it (went_on_without), and it came back within
  // half the room the stream has ahead of its slowest reader, so that merging does not make it
  // hold the stream back again at once.
  if (!went_on_without(p)) return false;
  const uint64_t window = std::max<uint32_t>(1, (usable_slots() - catch_up_slots()) / 2);
  const uint64_t per_epoch = chunks_per_epoch();
  const uint64_t tail = tail_for(c);
  std::optional<uint64_t> seq;
  const protocol::Seek next = stream_next();
  if (p.next_send == ChunkAddress{next.epoch, next.sample / rules_.welcome.chunk_size}) {
    seq = next_publish_seq_;  // level with the stream's head
  } else if (tail < next_publish_seq_ && per_epoch) {
    const auto& t = descriptors_.at(tail).position;
    const ChunkAddress oldest{t.epoch, t.index_in_epoch};
    if (p.next_send < oldest) return false;
    // Stream chunks are numbered consecutively in stream order (skipped ones too).
    uint64_t at =
        tail + (p.next_send.epoch - oldest.epoch) * per_epoch + p.next_send.index - oldest.index;
    if (at + window < next_publish_seq_ || at >= next_publish_seq_) return false;
    const auto& d = descriptors_.at(at).position;
    if (!(ChunkAddress{d.epoch, d.index_in_epoch} == p.next_send)) return false;
    seq = at;
  }
  if (!seq || *seq < view_since(c)) return false;
  abandon(private_.stop(c.id));
  c.next_seq = *seq;
  spdlog::info("{} caught up: it reads the shared stream again", label(c, false));
  return true;
}

void StreamState::watch_stalls(double now) {
  waiting_for_.clear();
  holding_.clear();
  if (!failure_.empty() || (finished_ && !private_.next_request())) return;
  if (!started_) {
    // Before the start the producer fills the ring and waits, as it should: producer time
    // blocked, but no stall, since nobody could read. The stall clock starts with the stream,
    // or the consumers that complete min_consumers would be blamed the moment they attach.
    if (blocked_since_) {
      counters_.producer_blocked_s += now - *blocked_since_;
      blocked_since_ = now;
    }
    waiting_for_ = "min_consumers not met: " + std::to_string(consumers_.size()) + " of " +
                   std::to_string(rules_.min_consumers) + " consumers attached";
    return;
  }
  const double dt = last_watch_ ? now - *last_watch_ : 0;
  last_watch_ = now;
  holding_ = holding_back(now);
  if (!holding_.empty()) {
    waited_for_ = holding_;
    waited_for_seq_ = next_acquire_seq_;
  } else if (!waited_for_.empty() && next_publish_seq_ <= waited_for_seq_ &&
             reader_waits_for_a_slot(now)) {
    // The producer fills the slot they held last, and a reader waits for that chunk: it still
    // waits for them, since without them the chunk would have been made ahead of time. (A
    // producer that takes long to fill a chunk, nvJPEG on a GPU time-sliced with the trainers,
    // would otherwise halve a slow reader's hold on the stream and never let it add up.)
    for (uint64_t id : waited_for_)
      if (auto it = consumers_.all().find(id);
          it != consumers_.all().end() && reads_stream(it->second, now))
        holding_.push_back(id);
  } else {
    waited_for_.clear();
  }
  const bool decouples = rules_.stall_policy == StallPolicy::kDecouple && chunks_per_epoch();
  std::vector<uint64_t> laggards;
  // On a ring sized by memory, a reader lags while it is more than the lead behind the most
  // advanced one: it pins the window the others have read.
  uint64_t head = 0;
  for (const auto& [id, c] : consumers_.all())
    if (reads_stream(c, now)) head = std::max(head, c.next_seq);
  for (auto& [id, c] : consumers_.all()) {
    const bool lags =
        rules_.lead_chunks && reads_stream(c, now) && head > c.next_seq + rules_.lead_chunks;
    c.lagging_s = lags ? c.lagging_s + dt : 0;
    if (std::find(holding_.begin(), holding_.end(), id) != holding_.end()) {
      c.held_back_s += dt;
      // A consumer that has lagged behind the others for its bound already, as the window
      // filled, has had its bound: the others do not wait for it a second time.
      const bool over = c.held_back_s >= stall_bound(c) || c.lagging_s >= stall_bound(c);
      if (!over || rules_.stall_policy != StallPolicy::kDecouple) continue;
      if (decouples) {
        laggards.push_back(id);
      } else if (!said_cannot_decouple_) {
        said_cannot_decouple_ = true;
        spdlog::warn(
            "{} holds the stream back, but this producer cannot regenerate chunks (a Producer "
            "without regenerate=, e.g. over an IterableDataset), so it is waited for: stall "
            "policy decouple acts as wait here (skip would leave it behind)",
            label(c, false));
      }
    } else if (!pins_stream(c, now)) {
      c.held_back_s = 0;
    } else {  // drains as fast as it fills: only a consumer that mostly holds the stream adds up
      c.held_back_s = std::max(0.0, c.held_back_s - dt);
    }
  }
  trace_stalls(now);
  watch_paces(now);
  for (uint64_t id : laggards) {
    decouple(consumers_.all().at(id), now);
    holding_.erase(std::find(holding_.begin(), holding_.end(), id));
  }
  for (uint64_t id : holding_) {
    const ConsumerRecord& c = consumers_.all().at(id);
    if (c.held_back_s < kTellAfterS) continue;
    waiting_for_ += (waiting_for_.empty() ? "" : "; ") + label(c, true) + ", holds the stream back";
    if (decouples)
      waiting_for_ +=
          " (decoupled after " + std::to_string(static_cast<int>(stall_bound(c))) + " s)";
  }
  watch_catch_up(now);
  if (!blocked_since_) {
    stall_logged_ = false;
    return;
  }
  const double blocked = now - *blocked_since_;
  if (blocked >= rules_.stall_timeout_s && !stall_logged_) {
    stall_logged_ = true;
    std::string who;
    for (const auto& [id, c] : consumers_.all())
      if (!c.end_sent && !c.closing) who += "\n  " + label(c, true);
    spdlog::warn("the stream has not moved for {:.0f} s; the producer waits for a slot:{}", blocked,
                 who.empty() ? " no consumer reads" : who);
  }
}

}  // namespace batchcast
