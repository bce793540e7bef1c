// StreamState's slots (stream_state.h): what the producer is given to fill (the stream's next
// chunk, a private chunk), the reuse rule, the lead and the catch-up reserve. The rest of the
// state machine is in stream_state.cpp, stream_seek.cpp, stream_stalls.cpp and stream_views.cpp.
#include <algorithm>

#include "server/stream/stream_state.h"

namespace batchcast {

std::optional<StreamState::Fill> StreamState::try_acquire(double now) {
  if (!failure_.empty() || finished_) return std::nullopt;
  // Only relaxed readers read: they are served chunks of what they need (try_acquire_relaxed),
  // and the stream's order waits for an exact reader. Nobody waits for it: not blocked time.
  if (started_ && relaxed_ever_ && !exact_ever_ && !relaxed_reading() && end_epoch()) {
    finish();  // every reader read its last epoch in its own order: the stream's is not needed
    return std::nullopt;
  }
  if (started_ && relaxed_reading() && !exact_reader()) {
    if (blocked_since_) counters_.producer_blocked_s += now - *blocked_since_;
    if (ahead_since_) counters_.producer_blocked_s += now - *ahead_since_;
    blocked_since_.reset();
    ahead_since_.reset();
    return std::nullopt;
  }
  // Far enough ahead of every reader, or a decoupled reader catches up first: a wait for the
  // readers, not for a slot (nobody holds the stream back), so producer time blocked but never a
  // stall.
  if ((rules_.lead_chunks && chunks_ahead() >= rules_.lead_chunks) || catching_up_) {
    if (blocked_since_) counters_.producer_blocked_s += now - *blocked_since_;
    blocked_since_.reset();
    if (!ahead_since_) ahead_since_ = now;
    return std::nullopt;
  }
  if (ahead_since_) counters_.producer_blocked_s += now - *ahead_since_;
  ahead_since_.reset();
  // On a producer that regenerates, the stream's chunks pin at most the ring minus a reserve:
  // a consumer that catches up pins its merge chunk and all after it, and must find slots for
  // its private chunks or it never reaches that chunk. Rings of 8 slots and more keep the
  // reserve at all times, so that a catch-up starts at once even while the other consumers do
  // not read (they pin every chunk they have not read: two loaders of one process would wait
  // for each other for ever); smaller rings only while someone catches up (their consumers may
  // hold all but one slot, max_held). And a private chunk asked for goes first: the stream
  // leaves it the last reusable slot.
  const bool keep_reserve =
      rules_.regenerates && chunks_per_epoch() && (usable_slots() >= 8 || private_.catching_up());
  const uint32_t reserve = keep_reserve ? catch_up_slots() : 0;
  const bool asked = private_.next_request().has_value();
  const SlotCount slots = reserve || asked ? count_slots(now) : SlotCount{};
  if ((reserve && slots.pinned_stream + reserve >= usable_slots()) ||
      (asked && slots.reusable <= 1)) {
    if (!blocked_since_) blocked_since_ = now;
    return std::nullopt;
  }
  std::optional<uint64_t> evicted;
  auto slot = ring_.begin_fill(
      next_acquire_seq_,
      [this, now](uint64_t seq, bool delivered) { return may_reuse(seq, delivered, now); },
      &evicted);
  if (!slot) {
    if (!blocked_since_) blocked_since_ = now;
    return std::nullopt;
  }
  if (evicted) forget_chunk(*evicted);
  if (blocked_since_) counters_.producer_blocked_s += now - *blocked_since_;
  blocked_since_.reset();
  return Fill{next_acquire_seq_++, *slot, std::nullopt, std::nullopt, {}};  // every view
}

std::optional<StreamState::Fill> StreamState::try_acquire_private(double now) {
  if (!failure_.empty()) return std::nullopt;
  auto request = private_.next_request();
  if (!request) return try_acquire_relaxed(now);
  uint64_t seq = private_.next_seq();
  std::optional<uint64_t> evicted;
  auto slot = ring_.begin_fill(
      seq, [this, now](uint64_t old, bool delivered) { return may_reuse(old, delivered, now); },
      &evicted);
  if (!slot) return std::nullopt;
  private_.take_request(seq);
  if (evicted) forget_chunk(*evicted);
  // Only its consumer is ever sent it: only its view is filled. A request still wanted is of a
  // consumer still attached (one that leaves stops its private stream).
  const auto& all = consumers_.all();
  const auto c = all.find(request->consumer);
  return Fill{seq, *slot, request->chunk, c == all.end() ? 0u : c->second.view, {}};
}

StreamState::SlotCount StreamState::count_slots(double now) const {
  SlotCount n;
  for (uint32_t i = 0; i < usable_slots(); ++i) {
    const SlotEntry& e = ring_.slot(i);
    const bool reusable =
        e.state == SlotState::kFree || (e.state == SlotState::kPublished && e.holders.empty() &&
                                        may_reuse(e.seq, e.delivered, now));
    if (reusable)
      ++n.reusable;
    else if (!protocol::is_private_seq(e.seq))
      ++n.pinned_stream;
  }
  return n;
}

uint32_t StreamState::chunks_ahead() const {
  // From the most advanced reader's next chunk: what lies behind it, sent to nobody, a reader
  // passed (a joiner whose view is newer than those chunks merges past them).
  uint64_t head = 0;
  for (const auto& [id, c] : consumers_.all())
    if (!c.end_sent && !c.closing && !c.relaxed) head = std::max(head, c.next_seq);
  uint32_t n = 0;
  for (uint32_t i = 0; i < ring_.size(); ++i) {
    const SlotEntry& e = ring_.slot(i);
    if (protocol::is_private_seq(e.seq) || e.seq < head) continue;
    if (e.state == SlotState::kFilling || (e.state == SlotState::kPublished && !e.delivered)) ++n;
  }
  return n;
}

uint32_t StreamState::catch_up_slots() const {
  // A private chunk takes a slot only while it is filled, waits for its turn and travels: its
  // consumer copies it out on arrival and releases the slot at once (client/chunk_copy.h),
  // whatever its user does (holds every batch, reads another loader first). So these slots serve
  // any number of consumers catching up at once; three let one be filled while others travel.
  // More would only take a large ring's window from the stream.
  return std::min(usable_slots() - 1, std::clamp<uint32_t>(usable_slots() / 4, 3, 16));
}

void StreamState::shrink_ring(uint32_t usable) {
  ring_.set_usable(usable);
  counters_.ring_slots = ring_.usable();
  retired_taken_.resize(ring_.size(), false);
}

std::vector<uint32_t> StreamState::take_retired_slots(double now) {
  std::vector<uint32_t> out;
  for (uint32_t i = ring_.usable(); i < retired_taken_.size(); ++i) {
    if (retired_taken_[i]) continue;
    const SlotEntry& e = ring_.slot(i);
    const bool may_go = e.holders.empty() && may_reuse(e.seq, e.delivered, now);
    if (e.state == SlotState::kPublished && !may_go) continue;
    const bool published = e.state == SlotState::kPublished;
    const uint64_t seq = e.seq;
    if (!ring_.retire(i)) continue;  // filling or held
    if (published) forget_chunk(seq);
    retired_taken_[i] = true;
    out.push_back(i);
  }
  return out;
}

uint64_t StreamState::tail_begin() const {
  uint64_t tail = next_publish_seq_;
  while (tail > 0 && ring_.published().count(tail - 1)) --tail;
  return tail;
}

// A chunk with no holders may be overwritten when no active consumer still has it ahead of
// its cursor, and it was delivered to someone, or some consumer's cursor is already past it (a
// consumer that joined after it and started later). A chunk nobody has seen or passed (before
// the stream starts, or while nobody is attached) is never discarded.
bool StreamState::may_reuse(uint64_t old_seq, bool delivered, double now) const {
  // A private chunk is its consumer's alone: reusable once sent (and released) or abandoned.
  if (protocol::is_relaxed_seq(old_seq)) return delivered || !relaxed_.wanted(old_seq);
  if (protocol::is_private_seq(old_seq)) return delivered || !private_.owner(old_seq);
  // Relaxed readers pin nothing: while only they read, a chunk is kept for nobody.
  bool passed = started_ && relaxed_reading() && !exact_reader();
  for (const auto& [id, c] : consumers_.all()) {
    if (c.relaxed) continue;
    const auto* p = private_.find(id);
    if (p && !p->until) {  // private for good: it needs no shared chunk
      passed = true;
      continue;
    }
    if (c.next_seq > old_seq) passed = true;
    if (c.next_seq > old_seq || !pins_stream(c, now)) continue;
    return false;  // this consumer has not been sent the chunk yet
  }
  return delivered || (started_ && passed);
}

}  // namespace batchcast
