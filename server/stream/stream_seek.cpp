// StreamState's positions (stream_state.h): seeks into retained chunks, waits for future ones,
// catch-up through regenerated private chunks and the merge back, and which chunks are still
// wanted by someone. The rest of the state machine is in stream_state.cpp.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <string>

#include "server/stream/stream_state.h"

namespace batchcast {

using protocol::ChunkDescriptor;

namespace {
bool before(const protocol::ChunkPosition& p, const protocol::Seek& t) {
  return p.epoch < t.epoch || (p.epoch == t.epoch && p.sample_start + p.sample_count <= t.sample);
}
bool holds(const protocol::ChunkPosition& p, const protocol::Seek& t) {
  return p.epoch == t.epoch && p.sample_start <= t.sample &&
         t.sample < p.sample_start + p.sample_count;
}
bool operator<(const protocol::Seek& a, const protocol::Seek& b) {
  return a.epoch < b.epoch || (a.epoch == b.epoch && a.sample < b.sample);
}
std::string describe(const protocol::Seek& p) {
  return "epoch " + std::to_string(p.epoch) + " sample " + std::to_string(p.sample);
}
}  // namespace

bool StreamState::wanted(const protocol::ChunkPosition& p) const {
  if (!started_ || consumers_.size() < std::max<uint32_t>(rules_.min_consumers, 1)) return true;
  for (const auto& [id, c] : consumers_.all()) {
    if (c.end_sent || c.closing) continue;
    const auto* ps = private_.find(id);
    if (ps && !ps->until) continue;              // private for good
    if (c.seek && before(p, *c.seek)) continue;  // it sought past this chunk
    return true;
  }
  return false;
}

void StreamState::on_seek(ConsumerRecord& c, protocol::Seek target, bool reply) {
  abandon(private_.stop(c.id));
  c.seek.reset();
  c.waiting_epoch_start = false;
  const uint64_t epoch_samples =
      rules_.epoch_samples ? rules_.epoch_samples : (newest_ ? newest_->epoch_samples : 0);
  if (epoch_samples && target.sample >= epoch_samples)
    target = {target.epoch + 1, 0};  // the end of an epoch is the start of the next
  auto answer = [&](bool available, const std::string& message) {
    if (reply)
      send_(c.identity, protocol::SeekReply{target.epoch, target.sample, available,
                                            message.substr(0, protocol::kMaxString)});
  };
  const uint64_t tail = tail_for(c);
  for (uint64_t seq = tail; seq < next_publish_seq_; ++seq) {
    if (holds(descriptors_.at(seq).position, target)) {  // retained: shared from there
      c.next_seq = seq;
      return answer(true, "");
    }
  }
  const protocol::Seek next = stream_next();
  const bool ahead = !(target < next);
  if (ahead && target.epoch <= next.epoch + 1) {  // not published yet: wait, pinning nothing
    c.next_seq = next_publish_seq_;
    c.seek = target;
    return;  // answered once its chunk is published
  }
  if (chunks_per_epoch()) {
    const uint64_t chunk = rules_.welcome.chunk_size;
    const ChunkAddress from{target.epoch, target.sample / chunk};
    std::optional<ChunkAddress> until;
    uint64_t position = stream_position_;
    c.next_seq = next_publish_seq_;
    if (!ahead && next.epoch - target.epoch <= 1 && next_publish_seq_ < view_since(c)) {
      // Its view's first chunk is not published yet: merge there, that many chunks ahead of
      // the stream's next (stream chunks are numbered consecutively, skipped ones too).
      c.next_seq = view_since(c);
      const auto [at, before] = address_ahead(c.next_seq);
      until = at;
      position = before;
      const uint64_t missed =
          (at.epoch - from.epoch) * rules_.epoch_samples + at.index * chunk - from.index * chunk;
      position = position > missed ? position - missed : 0;
    } else if (!ahead && next.epoch - target.epoch <= 1) {
      // Catch up and merge catch_up_slots() past the oldest retained chunk: the chunks before
      // the merge chunk stay reusable, so there are slots to regenerate into.
      uint64_t join = std::min<uint64_t>(next_publish_seq_, tail + catch_up_slots());
      c.next_seq = join;
      if (join < next_publish_seq_) {
        const auto& p = descriptors_.at(join).position;
        until = ChunkAddress{p.epoch, p.index_in_epoch};
        position = descriptors_.at(join).position.stream_position;
      } else {
        until = ChunkAddress{next.epoch, next.sample / chunk};
      }
      uint64_t missed = (until->epoch - from.epoch) * rules_.epoch_samples + until->index * chunk -
                        from.index * chunk;
      position = position > missed ? position - missed : 0;
    }
    abandon(private_.start(c.id, from, until, position));
    spdlog::info("consumer {} reads from {} in chunks regenerated for it{}", c.id, describe(target),
                 until ? " until it reaches the stream" : "");
    return answer(true, "");
  }
  std::string held = "nothing retained";
  if (tail < next_publish_seq_) {
    const auto& oldest = descriptors_.at(tail).position;
    held = "from " + describe({oldest.epoch, oldest.sample_start}) + " to before " + describe(next);
  }
  c.next_seq = next_publish_seq_;
  answer(false, "position unavailable: " + describe(target) +
                    " is not in the server's ring (it holds " + held +
                    ") and its producer cannot regenerate chunks; seek to a retained position, "
                    "or serve with a producer that regenerates (batchcast serve, or "
                    "Producer(regenerate=...))");
}

std::pair<ChunkAddress, uint64_t> StreamState::address_ahead(uint64_t seq) const {
  const uint64_t chunk = rules_.welcome.chunk_size;
  const uint64_t per_epoch = chunks_per_epoch();
  const protocol::Seek next = stream_next();
  ChunkAddress at{next.epoch, next.sample / chunk};
  uint64_t position = stream_position_;
  for (uint64_t k = next_publish_seq_; k < seq; ++k) {
    position += std::min<uint64_t>(chunk, rules_.epoch_samples - at.index * chunk);
    at = at.index + 1 == per_epoch ? ChunkAddress{at.epoch + 1, 0}
                                   : ChunkAddress{at.epoch, at.index + 1};
  }
  return {at, position};
}

bool StreamState::deliver_private(ConsumerRecord& c) {
  auto* p = private_.find(c.id);
  if (p->rejoin && try_rejoin(c, *p)) return false;
  if (p->until && !(p->next_send < *p->until)) {  // reached its merge chunk
    ChunkAddress at = p->next_send;
    abandon(private_.stop(c.id));
    if (c.next_seq < next_publish_seq_ &&
        (!ring_.find_published(c.next_seq) || c.next_seq < view_since(c)))
      on_seek(c, {at.epoch, at.index * rules_.welcome.chunk_size}, false);  // left behind
    return false;
  }
  if (end_epoch() && !(p->next_send.epoch < end_epoch())) {
    c.end_sent = send_(c.identity, protocol::End{rules_.epochs});
    return true;
  }
  // Asked ahead as far as its credits: no more of its chunks wait in slots than it can take.
  private_.top_up(c.id, c.credits, chunks_per_epoch(), end_epoch());
  if (c.credits == 0) return true;
  auto it = p->ready.find(p->next_send);
  if (it == p->ready.end()) return true;
  ChunkDescriptor d = it->second;
  d.position.stream_position = p->stream_position;
  if (!send_chunk(c, d)) return true;
  ring_.add_holder(d.slot, c.id);
  private_.forget(d.seq);
  --c.credits;
  counters_.descriptors_sent++;
  p->stream_position += d.position.sample_count;
  p->next_send = d.position.epoch_end
                     ? ChunkAddress{d.position.epoch + 1, 0}
                     : ChunkAddress{d.position.epoch, d.position.index_in_epoch + 1};
  p->ready.erase(it);
  return false;  // loop again: the next private chunk, or the merge
}

bool StreamState::deliver_sought(ConsumerRecord& c) {
  if (finished_ && c.next_seq >= end_seq_ && next_publish_seq_ >= end_seq_) {
    c.seek.reset();  // the stream ended first: End follows
    return false;
  }
  if (c.next_seq >= next_publish_seq_) return true;
  auto slot = ring_.find_published(c.next_seq);
  if (!slot || c.next_seq < view_since(c)) {
    auto oldest = ring_.oldest_published_from(std::max(c.next_seq, view_since(c)));
    c.next_seq = oldest && !protocol::is_private_seq(*oldest) ? *oldest : next_publish_seq_;
    return false;
  }
  const auto& p = descriptors_.at(c.next_seq).position;
  if (before(p, *c.seek)) {
    if (p.epoch_end && p.epoch == c.seek->epoch) c.seek = protocol::Seek{p.epoch + 1, 0};
    ring_.mark_passed(*slot);  // passed by choice: it pins nothing for this consumer
    ++c.next_seq;
    return false;
  }
  protocol::Seek target = *c.seek;
  if (holds(p, target)) {
    c.seek.reset();
    send_(c.identity, protocol::SeekReply{target.epoch, target.sample, true, ""});
  } else {
    on_seek(c, target, true);  // it went past (a gap in the stream): regenerate, or refuse
  }
  return false;
}

}  // namespace batchcast
