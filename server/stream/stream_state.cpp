#include "server/stream/stream_state.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "protocol/descriptor_checks.h"

namespace batchcast {

using protocol::ChunkDescriptor;
using protocol::Message;

namespace {
constexpr double kLivenessPeriodS = 0.2;
constexpr uint32_t kMaxCredits = 1024;
constexpr size_t kMaxDeparted = 1000;
constexpr uint64_t kLoggedDrops = 20;

}  // namespace

StreamState::StreamState(StreamRules rules, Send send, Alive alive, ResolveView resolve_view)
    : rules_(std::move(rules)),
      send_(std::move(send)),
      alive_(std::move(alive)),
      resolve_view_(std::move(resolve_view)),
      ring_(rules_.slot_count),
      relaxed_(rules_.dataset_size,
               rules_.regenerates ? rules_.epoch_shard : RelaxedReaders::Shard{}, rules_.seed,
               rules_.welcome.first_epoch, end_epoch(),
               // The stream's lead, or on a fixed ring half of it: what the producer has in hand.
               rules_.lead_chunks ? rules_.lead_chunks : std::max(2u, rules_.slot_count / 2)) {
  counters_.ring_slots = rules_.slot_count;
}

protocol::Seek StreamState::stream_next() const {
  if (!newest_) return {rules_.welcome.first_epoch, 0};
  if (newest_->epoch_end) return {newest_->epoch + 1, 0};
  return {newest_->epoch, newest_->sample_start + newest_->sample_count};
}

uint64_t StreamState::chunks_per_epoch() const {
  uint64_t chunk = rules_.welcome.chunk_size;
  if (!rules_.regenerates || chunk == 0 || rules_.epoch_samples == 0) return 0;
  return (rules_.epoch_samples + chunk - 1) / chunk;
}

void StreamState::publish(uint64_t seq, uint32_t slot, protocol::ChunkPosition position,
                          std::vector<protocol::TensorSpec> tensors,
                          std::vector<uint64_t> samples) {
  if (protocol::is_relaxed_seq(seq)) return publish_relaxed(seq, slot, position, std::move(tensors));
  if (protocol::is_private_seq(seq)) {
    ChunkDescriptor d;
    d.seq = seq;
    d.position = position;
    if (!d.position.epoch_samples) d.position.epoch_samples = rules_.epoch_samples;
    d.slot = slot;
    d.tensors = std::move(tensors);
    auto invalid = protocol::validate_descriptor(d, rules_.slot_count, rules_.slot_bytes);
    if (!invalid.empty()) {
      failure_ = "producer regenerated an invalid chunk of epoch " +
                 std::to_string(position.epoch) + ": " + invalid;
      spdlog::error("{}", failure_);
      return;
    }
    ring_.finish_fill(slot);
    counters_.chunks_regenerated++;
    regenerated_samples_ += position.sample_count;
    if (!private_.filled(seq, std::move(d))) ring_.mark_passed(slot);
    return;
  }
  ready_[seq] = {slot, position, std::move(tensors), false, std::move(samples)};
  publish_ready();
}

void StreamState::skip(const protocol::ChunkPosition& position) {
  ready_[next_acquire_seq_++] = {0, position, {}, true, {}};
  publish_ready();
}

void StreamState::publish_ready() {
  for (auto it = ready_.find(next_publish_seq_); it != ready_.end();
       it = ready_.find(next_publish_seq_)) {
    Filled& f = it->second;
    if (f.skipped) {  // a number and a stream position, but no slot: nobody is sent it
      stream_position_ += f.position.sample_count;
      counters_.chunks_skipped++;
      newest_ = f.position;
      ready_.erase(it);
      ++next_publish_seq_;
      continue;
    }
    ChunkDescriptor d;
    d.seq = it->first;
    d.position = f.position;
    if (!d.position.epoch_samples) d.position.epoch_samples = rules_.epoch_samples;
    d.position.stream_position = stream_position_;
    d.slot = f.slot;
    d.tensors = std::move(f.tensors);
    auto invalid = protocol::validate_descriptor(d, rules_.slot_count, rules_.slot_bytes);
    if (!invalid.empty()) {
      // A producer bug, not a consumer's fault: fail loudly rather than send it.
      failure_ = "producer published an invalid chunk " + std::to_string(d.seq) + ": " + invalid;
      spdlog::error("{}", failure_);
      return;
    }
    ring_.finish_fill(d.slot);
    stream_position_ += d.position.sample_count;
    counters_.chunks_published++;
    counters_.samples_published += d.position.sample_count;
    newest_ = d.position;
    if (f.samples.size() == d.position.sample_count)
      relaxed_.retained(d.seq, std::move(f.samples), views_at(d.seq));
    descriptors_[d.seq] = std::move(d);
    ready_.erase(it);
    ++next_publish_seq_;
  }
}

std::optional<uint64_t> StreamState::waited_chunk() const {
  if (!started_ || !failure_.empty() || (finished_ && next_publish_seq_ >= end_seq_))
    return std::nullopt;
  for (const auto& [id, c] : consumers_.all()) {
    if (c.relaxed) continue;
    if (c.end_sent || c.closing || c.seek || private_.find(id)) continue;  // not on the stream
    if (c.credits > 0 && c.credits == c.credit_window && c.next_seq >= next_publish_seq_)
      return next_publish_seq_;
  }
  return waited_relaxed_chunk();
}

void StreamState::finish() {
  finished_ = true;
  end_seq_ = next_acquire_seq_;
}

void StreamState::fail(const std::string& message) {
  if (failure_.empty()) failure_ = message;
}

bool StreamState::all_ended() const {
  if (!finished_ || !started_ || next_publish_seq_ < end_seq_) return false;
  for (const auto& [id, c] : consumers_.all())
    if (!c.end_sent && !c.closing) return false;
  return true;
}

StreamStats StreamState::stats() const {
  StreamStats s = counters_;
  s.consumers_now = consumers_.size();
  s.consumers_ever = consumers_.ever();
  s.ring_occupied = ring_.occupied();
  for (const auto& [id, c] : consumers_.all())
    s.consumers.push_back({id, c.pid, c.name, c.samples, c.wait_s, true, samples_behind(c),
                           static_cast<uint32_t>(ring_.held_by(id)),
                           private_.find(id) && private_.find(id)->rejoin, c.held_back_s,
                           c.relaxed});
  s.samples_taken_relaxed = relaxed_.samples_taken();
  s.samples_regenerated = regenerated_samples_;
  s.consumers.insert(s.consumers.end(), departed_.begin(), departed_.end());
  return s;
}

void StreamState::receive(const std::string& identity, const void* data, size_t size, double now) {
  auto result = protocol::decode(data, size);
  ConsumerRecord* c = consumers_.find_by_identity(identity);
  auto drop = [&](const std::string& why) {
    if (counters_.messages_dropped++ < kLoggedDrops)
      spdlog::warn("dropped a message from {}: {}",
                   c ? "consumer " + std::to_string(c->id) : std::string("an unknown peer"), why);
  };
  if (!result.message) return drop(result.error);
  const Message& m = *result.message;
  if (auto* hello = std::get_if<protocol::Hello>(&m)) {
    if (c) return drop("second hello");
    return on_hello(identity, *hello, now);
  }
  if (!c) {
    // A consumer that was sent End and left may have sent a heartbeat or a release before End
    // reached it: expected on every run, not worth a warning (an unknown sender still is).
    if (std::find(ended_identities_.begin(), ended_identities_.end(), identity) !=
        ended_identities_.end()) {
      spdlog::debug("ignored a message a consumer sent before it learned it had left");
      return;
    }
    return drop("message before hello");
  }
  c->last_seen = now;
  if (auto* credit = std::get_if<protocol::Credit>(&m)) {
    c->credits = std::min<uint32_t>(c->credits + credit->chunks, kMaxCredits);
    c->credit_window = std::max(c->credit_window, c->credits);
    c->last_activity = now;
  } else if (auto* release = std::get_if<protocol::Release>(&m)) {
    if (!ring_.release(release->slot, release->seq, c->id))
      return drop("release of chunk " + std::to_string(release->seq) + " in slot " +
                  std::to_string(release->slot) + " that it does not hold");
    c->last_activity = now;
    if (c->closing && ring_.held_by(c->id) == 0) drop_consumer(c->id, "left");
  } else if (auto* hb = std::get_if<protocol::Heartbeat>(&m)) {
    c->samples = hb->samples;
    c->wait_s = hb->wait_s;
  } else if (auto* seek = std::get_if<protocol::Seek>(&m)) {
    c->last_activity = now;
    if (!c->relaxed) {
      on_seek(*c, *seek, true);
    } else {  // it reads that epoch, but for the samples it had there, from now on
      const std::string fault = relaxed_.resume(c->id, seek->epoch, seek->sample);
      const std::string message = fault.empty() ? "" : "position unavailable: " + fault;
      send_(c->identity, protocol::SeekReply{seek->epoch, seek->sample, fault.empty(),
                                             message.substr(0, protocol::kMaxString)});
    }
  } else if (auto* had = std::get_if<protocol::HadSamples>(&m)) {
    if (!c->relaxed) return drop("samples had from a consumer that reads in exact order");
    relaxed_.had(c->id, *had);
  } else if (std::holds_alternative<protocol::Goodbye>(m)) {
    // It wants no more chunks, but batches it handed out may still view slots it holds: keep
    // those holds (and the record) until they are released or the process dies. End tells it
    // that nothing follows: chunks sent before this Goodbye may still be on their way, and its
    // session stays to release them until End arrives (client/session.h).
    if (!c->end_sent) c->end_sent = send_(c->identity, protocol::End{rules_.epochs});
    c->closing = true;
    c->seek.reset();
    abandon(private_.stop(c->id));  // nor private chunks: nobody waits for it to catch up
    relaxed_.remove(c->id);         // nor rows of the ring's chunks: none is kept for it
    if (ring_.held_by(c->id) == 0) drop_consumer(c->id, "left");
  } else {
    drop("a server-to-consumer message type");
  }
}

void StreamState::on_hello(const std::string& identity, const protocol::Hello& hello, double now) {
  ViewChoice choice;
  if (resolve_view_)
    choice = resolve_view_(hello.view);
  else if (!hello.view.empty())
    choice.error =
        "this server serves one view, its own (views of an image folder are served by batchcast "
        "serve from a host pool); ask for none";
  if (!choice.error.empty()) {  // refused: it is told why and never attached
    spdlog::warn("refused a consumer (pid {}{}): {}", hello.pid,
                 hello.name.empty() ? "" : ", " + hello.name, choice.error);
    send_(identity, protocol::ErrorMessage{choice.error.substr(0, protocol::kMaxString)});
    return;
  }
  ConsumerRecord r;
  const protocol::Order order =
      hello.order == protocol::Order::kServer ? rules_.default_order : hello.order;
  if (order == protocol::Order::kRelaxed && !relaxed_.available() && !said_exact_only_) {
    said_exact_only_ = true;
    spdlog::warn(
        "a consumer asked for relaxed order, but this producer cannot decode chosen samples (a "
        "Producer over an iterable): it reads in exact order, as every consumer here will");
  }
  r.relaxed = order == protocol::Order::kRelaxed && relaxed_.available();
  r.view = choice.view;
  r.identity = identity;
  r.pid = static_cast<pid_t>(hello.pid);
  r.local = !hello.boot_id.empty() && hello.boot_id == rules_.welcome.boot_id;
  r.name = hello.name;
  r.last_seen = r.last_activity = now;
  r.stall_timeout_s = hello.stall_timeout_s;
  // Start cursor, within the retained chunks that run without a gap up to the newest one (a
  // chunk still held by someone can outlive its successors, and replaying across the hole
  // would jump): the first epoch start there (a whole epoch), else the first chunk there (a
  // partial first epoch; the consumer reports what it missed), else the next chunk to be
  // published. next_epoch joiners then skip forward to an epoch start.
  std::optional<uint64_t> start;
  const auto& retained = ring_.published();
  for (auto it = retained.lower_bound(tail_begin());
       it != retained.end() && !protocol::is_private_seq(it->first); ++it) {
    if (!start) start = it->first;
    if (descriptors_.at(it->first).position.index_in_epoch == 0) {
      start = it->first;
      break;
    }
  }
  r.next_seq = r.relaxed ? next_publish_seq_ : start.value_or(next_publish_seq_);
  r.waiting_epoch_start = hello.late_join == protocol::LateJoin::kNextEpoch;
  auto& added = consumers_.add(std::move(r));

  protocol::Welcome w = added.view ? views_[added.view - 1].welcome : rules_.welcome;
  w.consumer_id = added.id;
  w.epoch_samples = rules_.epoch_samples;
  w.order = added.relaxed ? protocol::Order::kRelaxed : protocol::Order::kExact;
  send_(identity, w);
  (added.relaxed ? relaxed_ever_ : exact_ever_) = true;
  if (added.relaxed) {
    relaxed_.add(added.id, added.view);
    spdlog::info("consumer {} attached ({}pid {}{}{}, relaxed order)", added.id,
                 added.name.empty() ? "" : added.name + ", ", added.pid,
                 added.local ? "" : ", remote",
                 added.view ? ", view " + std::to_string(added.view) : "");
    return;
  }
  spdlog::info("consumer {} attached ({}pid {}{}{}, starts at chunk {})", added.id,
               added.name.empty() ? "" : added.name + ", ", added.pid,
               added.local ? "" : ", remote",
               added.view ? ", view " + std::to_string(added.view) : "", added.next_seq);
  // A replay joiner that would start mid-epoch gets that epoch whole when the producer can
  // regenerate what the ring no longer holds (the sweep case: nobody waits for a boundary).
  if (hello.late_join != protocol::LateJoin::kReplay || !chunks_per_epoch()) return;
  // A consumer of a view added by its Hello starts where any other would; the chunks made before
  // its view existed are regenerated for it.
  const bool before_view = added.next_seq < view_since(added);
  auto first = descriptors_.find(added.next_seq);
  if (first != descriptors_.end()) {
    if (first->second.position.index_in_epoch != 0 || before_view)
      on_seek(added, {first->second.position.epoch, 0}, false);
  } else if (newest_ && !newest_->epoch_end) {
    on_seek(added, {newest_->epoch, 0}, false);
  } else if (before_view) {
    on_seek(added, stream_next(), false);  // an epoch start, made before its view existed
  }
}

void StreamState::tick(double now) {
  for (auto& [id, c] : consumers_.all()) {
    if (!failure_.empty() && !c.error_sent)
      c.error_sent =
          send_(c.identity, protocol::ErrorMessage{failure_.substr(0, protocol::kMaxString)});
  }
  deliver();
  watch_stalls(now);  // on what was just delivered: who still waits, who holds the stream back
  if (now >= next_liveness_) {
    check_liveness(now);
    next_liveness_ = now + kLivenessPeriodS;
  }
  if (now >= next_heartbeat_) {
    for (const auto& [id, c] : consumers_.all()) {
      protocol::Heartbeat hb;
      if (std::find(holding_.begin(), holding_.end(), id) == holding_.end())
        hb.waiting_for = waiting_for_.substr(0, protocol::kMaxString);
      send_(c.identity, hb);
    }
    next_heartbeat_ = now + rules_.heartbeat_interval_s;
  }
}

void StreamState::deliver() {
  // A failed stream delivers nothing more: a consumer, attached or joining, gets the failure
  // (tick) instead of chunks published before it, which would hide it behind a replay.
  if (!failure_.empty()) return;
  if (!started_) {
    if (consumers_.size() < std::max<uint32_t>(rules_.min_consumers, 1)) return;
    started_ = true;
    spdlog::info("{} consumer(s) attached: stream starts", consumers_.size());
  }
  for (auto& [id, c] : consumers_.all()) {
    while (!c.end_sent && !c.closing) {
      if (c.relaxed) {
        if (deliver_relaxed(c)) break;
        continue;
      }
      if (private_.find(id)) {
        if (deliver_private(c)) break;
        continue;
      }
      if (c.seek) {
        if (deliver_sought(c)) break;
        continue;
      }
      if (finished_ && c.next_seq >= end_seq_ && next_publish_seq_ >= end_seq_) {
        c.end_sent = send_(c.identity, protocol::End{rules_.epochs});
        break;
      }
      if (c.credits == 0 || c.next_seq >= next_publish_seq_) break;
      auto slot = ring_.find_published(c.next_seq);
      if (!slot || c.next_seq < view_since(c)) {
        // Reused before this consumer was sent it (late join, or left behind), or acquired
        // before its view existed.
        auto oldest = ring_.oldest_published_from(std::max(c.next_seq, view_since(c)));
        c.next_seq = oldest && !protocol::is_private_seq(*oldest) ? *oldest : next_publish_seq_;
        continue;
      }
      const auto& d = descriptors_.at(c.next_seq);
      if (c.waiting_epoch_start) {
        if (d.position.index_in_epoch != 0) {
          // Passed, not discarded unseen: without this, a lone next_epoch joiner would wait
          // forever for an epoch start that a full ring of unsent chunks holds back.
          ring_.mark_passed(*slot);
          ++c.next_seq;
          continue;
        }
        c.waiting_epoch_start = false;
      }
      if (!send_chunk(c, d)) break;
      ring_.add_holder(*slot, c.id);
      --c.credits;
      ++c.next_seq;
      counters_.descriptors_sent++;
    }
  }
}

void StreamState::check_liveness(double now) {
  std::vector<uint64_t> dead;
  for (const auto& [id, c] : consumers_.all()) {
    bool alive = c.local ? alive_(c.pid) : now - c.last_seen < rules_.heartbeat_timeout_s;
    if (!alive) dead.push_back(id);
  }
  for (auto id : dead) {
    counters_.consumers_died++;
    drop_consumer(id, "died");
  }
}

void StreamState::drop_consumer(uint64_t id, const char* why) {
  auto& c = consumers_.all().at(id);
  abandon(private_.stop(id));
  relaxed_.remove(id);
  size_t held = ring_.release_all(id);
  spdlog::info("consumer {} (pid {}) {}; released {} slot reference(s)", id, c.pid, why, held);
  if (departed_.size() >= kMaxDeparted) departed_.erase(departed_.begin());
  departed_.push_back({id, c.pid, c.name, c.samples, c.wait_s, false, 0, 0, false, 0.0, c.relaxed});
  if (c.end_sent) {
    if (ended_identities_.size() >= kMaxDeparted) ended_identities_.pop_front();
    ended_identities_.push_back(c.identity);
  }
  consumers_.erase(id);
}

}  // namespace batchcast
