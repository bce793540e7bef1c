// StreamState's relaxed readers (stream_state.h, docs/stream.md "Order"): their chunks sent with
// the rows each still needs, the chunks decoded for them, and how they share the stream with
// exact readers. The book of what each needs is RelaxedReaders.
#include <spdlog/spdlog.h>

#include <algorithm>

#include "protocol/descriptor_checks.h"
#include "server/stream/stream_state.h"

namespace batchcast {

using protocol::ChunkDescriptor;

bool StreamState::exact_reader() const {
  for (const auto& [id, c] : consumers_.all())
    if (!c.relaxed && !c.end_sent && !c.closing) return true;
  return false;
}

bool StreamState::relaxed_reading() const {
  for (const auto& [id, c] : consumers_.all())
    if (c.relaxed && !c.end_sent && !c.closing && !relaxed_.done(id)) return true;
  return false;
}

std::optional<uint64_t> StreamState::waited_relaxed_chunk() const {
  const bool waits = std::any_of(consumers_.all().begin(), consumers_.all().end(), [&](auto& e) {
    const ConsumerRecord& c = e.second;
    return c.relaxed && !c.end_sent && !c.closing && c.starved;
  });
  if (!waits) return std::nullopt;
  std::optional<uint64_t> oldest;
  for (uint32_t i = 0; i < ring_.size(); ++i) {
    const SlotEntry& e = ring_.slot(i);
    if (e.state == SlotState::kFilling && protocol::is_relaxed_seq(e.seq) &&
        (!oldest || e.seq < *oldest))
      oldest = e.seq;
  }
  return oldest;
}

uint32_t StreamState::views_at(uint64_t seq) const {
  uint32_t n = 1;
  for (const View& v : views_)
    if (v.since_seq <= seq) ++n;
  return n;
}

void StreamState::publish_relaxed(uint64_t seq, uint32_t slot,
                                  const protocol::ChunkPosition& position,
                                  std::vector<protocol::TensorSpec> tensors) {
  ChunkDescriptor d;
  d.seq = seq;
  d.position = position;
  d.slot = slot;
  d.tensors = std::move(tensors);
  auto invalid = protocol::validate_descriptor(d, rules_.slot_count, rules_.slot_bytes);
  if (!invalid.empty()) {
    failure_ = "producer filled an invalid chunk for relaxed readers: " + invalid;
    spdlog::error("{}", failure_);
    return;
  }
  ring_.finish_fill(slot);
  counters_.chunks_relaxed++;
  counters_.samples_relaxed += position.sample_count;
  relaxed_.filled(seq);
  descriptors_[seq] = std::move(d);
}

bool StreamState::deliver_relaxed(ConsumerRecord& c) {
  if (relaxed_.done(c.id)) {
    c.end_sent = send_(c.identity, protocol::End{rules_.epochs});
    return true;
  }
  c.starved = false;
  if (c.credits == 0) return true;
  auto offer = relaxed_.offer(c.id);
  if (!offer) {
    c.starved = true;  // it waits for what is decoded next (waited_relaxed_chunk)
    return true;
  }
  auto slot = ring_.find_published(offer->seq);
  if (!slot) {  // a book out of step with the ring is a server bug: never send a stale slot
    relaxed_.gone(offer->seq);
    return false;
  }
  ChunkDescriptor d = descriptors_.at(offer->seq);
  const uint32_t rows = d.position.sample_count;
  d.take = offer->rows;
  d.samples = offer->samples;
  // Its own position (rows it takes from this chunk); the tensors stay the chunk's in the slot.
  d.position = relaxed_.position(c.id, *offer);
  if (c.view) d.tensors = views_[c.view - 1].specs(rows);
  if (!send_(c.identity, d)) return true;  // refused: offered again on the next tick
  relaxed_.take(c.id, *offer);
  ring_.add_holder(*slot, c.id);
  --c.credits;
  counters_.descriptors_sent++;
  counters_.samples_sent += d.position.sample_count;
  return false;
}

std::optional<StreamState::Fill> StreamState::try_acquire_relaxed(double now) {
  if (!started_ || relaxed_.empty() || !failure_.empty()) return std::nullopt;
  const auto& all = consumers_.all();
  const auto credits = [&](uint64_t id) -> uint32_t {
    auto it = all.find(id);
    return it == all.end() || it->second.closing || it->second.end_sent ? 0 : it->second.credits;
  };
  const uint32_t chunk_size = rules_.welcome.chunk_size;
  auto samples = relaxed_.choose(chunk_size, credits, RelaxedReaders::Hunger::kAhead);
  if (samples.empty()) return std::nullopt;
  // One decode serves every reader that needs a sample only if its chunk stays until they took
  // their rows: ahead of the readers' needs (the lead), a chunk goes only into a slot whose chunk
  // nobody needs a row of. Only for a reader that would otherwise wait is a chunk others still
  // need overwritten (the oldest the ring may reuse; they take those samples from a later decode),
  // and then the chunk is drawn for the readers that wait.
  const uint64_t seq = next_relaxed_seq_;
  std::optional<uint64_t> evicted;
  auto slot = ring_.begin_fill(
      seq,
      [this, now](uint64_t old, bool delivered) {
        return may_reuse(old, delivered, now) && !relaxed_.wanted(old);
      },
      &evicted);
  if (!slot) {
    samples = relaxed_.choose(chunk_size, credits, RelaxedReaders::Hunger::kWaiting);
    if (samples.empty()) return std::nullopt;
    slot = ring_.begin_fill(
        seq, [this, now](uint64_t old, bool delivered) { return may_reuse(old, delivered, now); },
        &evicted);
    if (!slot) return std::nullopt;
  }
  if (evicted) forget_chunk(*evicted);
  ++next_relaxed_seq_;
  relaxed_.filling(seq, samples, view_count());
  return Fill{seq, *slot, std::nullopt, std::nullopt, std::move(samples)};  // every view
}

}  // namespace batchcast
